#include "text/tokenizer/js_string.h"

#include <cstdint>

#include "text/tokenizer/utf8.h"

namespace strata::js {

bool is_whitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
    case 0xFEFF:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string_view trim_start(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t next = pos;
    if (!is_whitespace(utf8::decode_valid(text, next))) break;
    pos = next;
  }
  return text.substr(pos);
}

std::string_view trim_end(std::string_view text) {
  size_t end = text.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
    size_t pos = start;
    if (!is_whitespace(utf8::decode_valid(text, pos))) break;
    end = start;
  }
  return text.substr(0, end);
}

}  // namespace strata::js
