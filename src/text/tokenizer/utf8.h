// UTF-8 helpers for the tokenizer: validation, decoding with the WHATWG replacement rule
// (the one TextDecoder, Node and browsers use: each maximal invalid subpart becomes one
// U+FFFD), and an incremental decoder for streaming that never splits a code point. The
// encoder, utf8::append, is common/utf8.h's (shared with the chat templates).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/utf8.h"  // append, kReplacementChar

namespace strata::utf8 {

inline constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";

// True when `text` is well-formed UTF-8 (no surrogates, no overlongs, <= U+10FFFF).
bool is_valid(std::string_view text);

// Returns `text` with every maximal invalid subpart replaced by U+FFFD (WHATWG "decode"
// without BOM handling). Valid input comes back unchanged.
std::string sanitize(std::string_view text);

// Decodes the code point starting at text[pos] and advances pos. Precondition: `text` is
// valid UTF-8 and pos is at a code point boundary.
inline char32_t decode_valid(std::string_view text, size_t& pos) {
  const auto b0 = static_cast<uint8_t>(text[pos]);
  if (b0 < 0x80) {
    ++pos;
    return b0;
  }
  if (b0 < 0xE0) {
    const char32_t cp = ((b0 & 0x1Fu) << 6) | (static_cast<uint8_t>(text[pos + 1]) & 0x3Fu);
    pos += 2;
    return cp;
  }
  if (b0 < 0xF0) {
    const char32_t cp = ((b0 & 0x0Fu) << 12) |
                        ((static_cast<uint8_t>(text[pos + 1]) & 0x3Fu) << 6) |
                        (static_cast<uint8_t>(text[pos + 2]) & 0x3Fu);
    pos += 3;
    return cp;
  }
  const char32_t cp = ((b0 & 0x07u) << 18) | ((static_cast<uint8_t>(text[pos + 1]) & 0x3Fu) << 12) |
                      ((static_cast<uint8_t>(text[pos + 2]) & 0x3Fu) << 6) |
                      (static_cast<uint8_t>(text[pos + 3]) & 0x3Fu);
  pos += 4;
  return cp;
}

// Length in bytes of the code point whose lead byte is `lead` (valid UTF-8 assumed).
inline size_t sequence_length(uint8_t lead) {
  return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

// Incremental WHATWG UTF-8 decoder. Bytes go in one at a time; complete code points (and
// U+FFFD for invalid subparts, as soon as they are known to be invalid) come out as UTF-8.
// Bytes of a sequence that may still complete are held back until it does or fails.
class Decoder {
 public:
  // Feeds one byte, appending any output that became final to `out`.
  void push(uint8_t byte, std::string& out);
  // Ends the stream: an incomplete held-back sequence becomes one U+FFFD.
  void flush(std::string& out);
  bool has_pending() const { return bytes_needed_ != 0; }

 private:
  void reset() {
    code_point_ = 0;
    bytes_needed_ = 0;
    bytes_seen_ = 0;
    lower_ = 0x80;
    upper_ = 0xBF;
  }

  char32_t code_point_ = 0;
  int bytes_needed_ = 0;
  int bytes_seen_ = 0;
  uint8_t lower_ = 0x80;
  uint8_t upper_ = 0xBF;
};

}  // namespace strata::utf8
