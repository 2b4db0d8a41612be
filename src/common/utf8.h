// The one UTF-8 encoder: the tokenizer (text/tokenizer/utf8.h) and the chat templates
// (text/jinja/unicode.h) both build on it, and neither links the other, so it lives here.
#pragma once

#include <string>

namespace strata::utf8 {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Appends the UTF-8 encoding of `cp` to `out`. A value that is not a Unicode scalar value
// (a surrogate, U+D800..U+DFFF, or beyond U+10FFFF) appends U+FFFD instead, which is what
// encoding a JavaScript string with a lone surrogate gives.
void append(std::string& out, char32_t cp);

}  // namespace strata::utf8
