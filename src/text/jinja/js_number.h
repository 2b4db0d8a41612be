// JavaScript number <-> string conversions, reproduced exactly.
//
// @huggingface/jinja keeps every number as a JavaScript double and prints it with
// Number.prototype.toString, toFixed(1) or JSON.stringify; it parses with Number(),
// parseInt and parseFloat. These functions give the same strings and values in C++.
#pragma once

#include <string>
#include <string_view>

namespace strata::jinja {

// Number.prototype.toString() (radix 10): shortest round-trip digits, exponent form outside
// [1e-7, 1e21), "NaN", "Infinity", "-Infinity"; -0 prints "0".
std::string js_number_to_string(double value);

// Number.prototype.toFixed(1) (exact decimal expansion; values >= 1e21 use toString()).
std::string js_to_fixed1(double value);

// Number(string) (StringToNumber): whitespace-trimmed decimal, hex/octal/binary literals,
// "Infinity"; "" is 0; anything else is NaN.
double js_string_to_number(std::string_view s);

// parseInt(s, 10): NaN when no digits follow the optional whitespace and sign.
double js_parse_int(std::string_view s);

// parseFloat(s): the longest decimal prefix (or Infinity) after whitespace, else NaN.
double js_parse_float(std::string_view s);

// The ** operator (Math.pow): V8 computes it with fdlibm's pow, which is not always
// correctly rounded, so C's pow can differ in the last bit. Includes JavaScript's special
// cases (1 ** NaN and (+-1) ** (+-Infinity) are NaN).
double js_pow(double x, double y);

}  // namespace strata::jinja
