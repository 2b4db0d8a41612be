// UTF-8 helpers that reproduce JavaScript string semantics on UTF-8 data.
//
// @huggingface/jinja runs on JavaScript strings (UTF-16). Strata stores UTF-8, so every
// operation whose result depends on the encoding (length, indexing, comparison, case
// mapping, whitespace) is reimplemented here to give the byte-identical result V8 gives.
// Decoding is lenient: an invalid byte decodes as U+FFFD and advances one byte. Encoding is
// common/utf8.h's utf8::append (surrogates and out-of-range values append U+FFFD).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace strata::jinja::unicode {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// '0'..'9' only (JavaScript's DecimalDigit), whatever the locale.
inline bool is_ascii_digit(char c) {
  return c >= '0' && c <= '9';
}

// Decodes the code point at s[pos] and advances pos past it. Precondition: pos < s.size().
char32_t decode(std::string_view s, size_t& pos);

// True for a code point that JavaScript's \s and String.prototype.trim treat as whitespace
// (WhiteSpace and LineTerminator: TAB..CR, SPACE, NBSP, U+1680, U+2000..U+200A, U+2028,
// U+2029, U+202F, U+205F, U+3000, U+FEFF).
bool is_js_whitespace(char32_t cp);

// Byte length of the JavaScript whitespace character starting at s[pos], or 0.
size_t whitespace_length_at(std::string_view s, size_t pos);

// String.prototype.trim / trimStart / trimEnd.
std::string_view trim(std::string_view s);
std::string_view trim_start(std::string_view s);
std::string_view trim_end(std::string_view s);

// Number of UTF-16 code units (JavaScript's String.prototype.length).
size_t utf16_length(std::string_view s);

// JavaScript's String.prototype.at(index) on the UTF-16 view: the code unit at index
// (negative counts from the end) as UTF-8, or false when out of range. A lone surrogate half
// (index inside an astral character) yields U+FFFD, which is what encoding the
// JavaScript result as UTF-8 produces.
bool utf16_at(std::string_view s, double index, std::string& out);

// Compares like JavaScript's < on strings (UTF-16 code unit order): <0, 0 or >0.
int compare_utf16(std::string_view a, std::string_view b);

// String.prototype.toUpperCase / toLowerCase (full mappings, including the final-sigma rule).
std::string to_upper(std::string_view s);
std::string to_lower(std::string_view s);

// True when s is valid UTF-8 (no surrogates, no overlong forms).
bool is_valid_utf8(std::string_view s);

}  // namespace strata::jinja::unicode
