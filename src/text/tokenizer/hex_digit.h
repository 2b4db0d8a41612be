// The value of a hexadecimal digit, for the escapes of JSON strings (\u and four hex digits) and of
// the JavaScript regexes the tokenizer translates (\xHH, \uHHHH, \u{...}).
#pragma once

namespace strata {

// 0..15 for [0-9a-fA-F], -1 for any other character.
inline int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace strata
