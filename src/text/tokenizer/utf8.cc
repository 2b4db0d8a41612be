#include "text/tokenizer/utf8.h"

namespace strata::utf8 {

bool is_valid(std::string_view text) {
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    const auto b0 = static_cast<uint8_t>(text[i]);
    if (b0 < 0x80) {
      ++i;
      continue;
    }
    int needed = 0;
    uint8_t lower = 0x80;
    uint8_t upper = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      needed = 1;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      needed = 2;
      if (b0 == 0xE0) lower = 0xA0;
      if (b0 == 0xED) upper = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      needed = 3;
      if (b0 == 0xF0) lower = 0x90;
      if (b0 == 0xF4) upper = 0x8F;
    } else {
      return false;
    }
    if (n - i <= static_cast<size_t>(needed)) return false;
    for (int k = 1; k <= needed; ++k) {
      const auto b = static_cast<uint8_t>(text[i + k]);
      if (b < lower || b > upper) return false;
      lower = 0x80;
      upper = 0xBF;
    }
    i += needed + 1;
  }
  return true;
}

std::string sanitize(std::string_view text) {
  if (is_valid(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 8);
  Decoder decoder;
  for (const char c : text) decoder.push(static_cast<uint8_t>(c), out);
  decoder.flush(out);
  return out;
}

// The WHATWG Encoding Standard's UTF-8 decoder, one byte at a time.
void Decoder::push(uint8_t byte, std::string& out) {
  if (bytes_needed_ == 0) {
    if (byte < 0x80) {
      out.push_back(static_cast<char>(byte));
    } else if (byte >= 0xC2 && byte <= 0xDF) {
      bytes_needed_ = 1;
      code_point_ = byte & 0x1F;
    } else if (byte >= 0xE0 && byte <= 0xEF) {
      if (byte == 0xE0) lower_ = 0xA0;
      if (byte == 0xED) upper_ = 0x9F;
      bytes_needed_ = 2;
      code_point_ = byte & 0x0F;
    } else if (byte >= 0xF0 && byte <= 0xF4) {
      if (byte == 0xF0) lower_ = 0x90;
      if (byte == 0xF4) upper_ = 0x8F;
      bytes_needed_ = 3;
      code_point_ = byte & 0x07;
    } else {
      out.append(kReplacementUtf8);
    }
    return;
  }
  if (byte < lower_ || byte > upper_) {
    // The held-back prefix is an invalid subpart; the byte starts over.
    reset();
    out.append(kReplacementUtf8);
    push(byte, out);
    return;
  }
  lower_ = 0x80;
  upper_ = 0xBF;
  code_point_ = (code_point_ << 6) | (byte & 0x3F);
  if (++bytes_seen_ == bytes_needed_) {
    append(out, code_point_);
    reset();
  }
}

void Decoder::flush(std::string& out) {
  if (bytes_needed_ != 0) {
    reset();
    out.append(kReplacementUtf8);
  }
}

}  // namespace strata::utf8
