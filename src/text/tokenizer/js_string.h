// JavaScript string helpers the reference's behaviour depends on: String.prototype.trim,
// trimStart and trimEnd strip ECMAScript WhiteSpace and LineTerminator code points.
#pragma once

#include <string_view>

namespace strata::js {

// ECMAScript WhiteSpace or LineTerminator (the set JS's trim() and \s use).
bool is_whitespace(char32_t cp);

// `text` (valid UTF-8) without leading / trailing JS whitespace.
std::string_view trim_start(std::string_view text);
std::string_view trim_end(std::string_view text);
inline std::string_view trim(std::string_view text) {
  return trim_end(trim_start(text));
}

}  // namespace strata::js
