// Seeded random text for the tokenizer tests: a mix of scripts, whitespace, emoji
// sequences, combining marks (NFC/NFD variants), digits, punctuation, special-token
// strings and, optionally, invalid UTF-8 bytes. Code points come from blocks assigned in
// Unicode 14 or earlier, so Strata (PCRE2 10.42: Unicode 14) and the reference (Node's
// ICU, newer) agree on every character's properties.
#pragma once

#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include "text/tokenizer/utf8.h"

namespace strata::test_support {

class RandomText {
 public:
  explicit RandomText(uint64_t seed) : rng_(seed) {}

  // A string of 1..max_segments segments; with `allow_invalid`, raw bytes 0x80..0xFF may
  // appear (invalid UTF-8).
  std::string next(int max_segments, bool allow_invalid) {
    std::string out;
    const int segments = uniform(1, max_segments);
    for (int s = 0; s < segments; ++s) append_segment(out, allow_invalid);
    return out;
  }

 private:
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  static void append_cp(std::string& out, char32_t cp) { utf8::append(out, cp); }

  void word(std::string& out, std::initializer_list<std::pair<char32_t, char32_t>> ranges,
            int max_len) {
    const int len = uniform(1, max_len);
    for (int i = 0; i < len; ++i) {
      const auto& r = *(ranges.begin() + uniform(0, static_cast<int>(ranges.size()) - 1));
      append_cp(out, static_cast<char32_t>(
                         uniform(static_cast<int>(r.first), static_cast<int>(r.second))));
    }
  }

  void append_segment(std::string& out, bool allow_invalid) {
    static constexpr std::array<std::string_view, 24> kSpecials = {"<|im_start|>",
                                                                   "<|im_end|>",
                                                                   "<|endoftext|>",
                                                                   "<think>",
                                                                   "</think>",
                                                                   "<tool_call>",
                                                                   "<|begin_of_text|>",
                                                                   "<|eot_id|>",
                                                                   "<|start_header_id|>",
                                                                   "<|end_header_id|>",
                                                                   "<|reserved_special_token_3|>",
                                                                   "<s>",
                                                                   "</s>",
                                                                   "<unk>",
                                                                   "<|im_start",
                                                                   "<s",
                                                                   "[INST]",
                                                                   "<0x41>",
                                                                   "\xE2\x96\x81",
                                                                   "\xC4\xA0",
                                                                   "'s",
                                                                   "'re",
                                                                   "'LL",
                                                                   " n't"};
    static constexpr std::array<char32_t, 16> kSpaces = {
        ' ',  ' ',    ' ',    '\t', '\n',   '\n',   '\r',   0x0B,
        0xA0, 0x3000, 0x2028, 0x85, 0xFEFF, 0x2009, 0x200B, 0x0C};
    static constexpr std::string_view kAsciiPunct = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
    switch (uniform(0, 21)) {
      case 0:
      case 1:
        word(out, {{'a', 'z'}}, 9);
        break;
      case 2:
        word(out, {{'A', 'Z'}, {'a', 'z'}}, 7);
        break;
      case 3:
        word(out, {{0xC0, 0xFF}, {0x100, 0x17F}, {'a', 'z'}}, 6);
        break;
      case 4:
        word(out, {{0x3B1, 0x3C9}, {0x410, 0x44F}}, 8);
        break;
      case 5:
        word(out, {{0x4E00, 0x9FA5}}, 6);
        break;
      case 6:
        word(out, {{0x3041, 0x3096}, {0x30A1, 0x30FA}, {0x4E00, 0x9FA5}}, 6);
        break;
      case 7:
        word(out, {{0xAC00, 0xD7A3}}, 4);
        break;
      case 8:  // conjoining jamo: NFC composes them into syllables
        for (int i = uniform(1, 3); i > 0; --i) {
          append_cp(out, static_cast<char32_t>(uniform(0x1100, 0x1112)));
          append_cp(out, static_cast<char32_t>(uniform(0x1161, 0x1175)));
          if (uniform(0, 1) == 1) append_cp(out, static_cast<char32_t>(uniform(0x11A8, 0x11C2)));
        }
        break;
      case 9:
        word(out, {{0x621, 0x63A}, {0x641, 0x64A}, {0x64B, 0x652}}, 7);
        break;
      case 10:
        word(out, {{0x905, 0x939}, {0x93E, 0x94D}}, 7);
        break;
      case 11:
        word(out, {{0xE01, 0xE3A}, {0xE40, 0xE4E}}, 8);
        break;
      case 12:  // base letters followed by combining marks (NFD text, reordering)
        for (int i = uniform(1, 4); i > 0; --i) {
          append_cp(out, static_cast<char32_t>(uniform('a', 'z')));
          for (int m = uniform(0, 3); m > 0; --m) {
            append_cp(out, static_cast<char32_t>(uniform(0x300, 0x36F)));
          }
        }
        break;
      case 13: {  // emoji, with skin tones, ZWJ sequences, VS16, flags
        const int kind = uniform(0, 3);
        if (kind == 0) {
          append_cp(out, static_cast<char32_t>(uniform(0x1F600, 0x1F64F)));
          if (uniform(0, 1) == 1) append_cp(out, static_cast<char32_t>(uniform(0x1F3FB, 0x1F3FF)));
        } else if (kind == 1) {
          append_cp(out, static_cast<char32_t>(uniform(0x1F300, 0x1F5FF)));
          append_cp(out, 0x200D);
          append_cp(out, static_cast<char32_t>(uniform(0x1F300, 0x1F5FF)));
          if (uniform(0, 1) == 1) append_cp(out, 0xFE0F);
        } else if (kind == 2) {
          append_cp(out, static_cast<char32_t>(uniform(0x1F1E6, 0x1F1FF)));
          append_cp(out, static_cast<char32_t>(uniform(0x1F1E6, 0x1F1FF)));
        } else {
          append_cp(out, 0x2764);
          append_cp(out, 0xFE0F);
        }
        break;
      }
      case 14:
        word(out, {{'0', '9'}}, 12);
        break;
      case 15:
        word(out, {{0xFF10, 0xFF19}, {0x660, 0x669}, {0x966, 0x96F}, {0xB2, 0xB3}}, 4);
        break;
      case 16:
        for (int i = uniform(1, 4); i > 0; --i) {
          out.push_back(kAsciiPunct[static_cast<size_t>(uniform(0, kAsciiPunct.size() - 1))]);
        }
        break;
      case 17:
        word(out, {{0x2010, 0x2027}, {0x3001, 0x3003}, {0xFF01, 0xFF0F}}, 3);
        break;
      case 18:
      case 19:
        for (int i = uniform(1, 4); i > 0; --i) {
          append_cp(out, kSpaces[static_cast<size_t>(uniform(0, kSpaces.size() - 1))]);
        }
        break;
      case 20:
        out.append(kSpecials[static_cast<size_t>(uniform(0, kSpecials.size() - 1))]);
        break;
      case 21:
        if (allow_invalid && uniform(0, 2) == 0) {
          out.push_back(static_cast<char>(uniform(0x80, 0xFF)));
        } else {
          out.push_back(' ');
        }
        break;
    }
  }

  std::mt19937_64 rng_;
};

}  // namespace strata::test_support
