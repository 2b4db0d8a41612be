#include "text/jinja/js_number.h"

#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "text/jinja/unicode.h"

namespace strata::jinja {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInfinity = std::numeric_limits<double>::infinity();

// Parses a validated decimal literal (no sign, no whitespace) with correct rounding.
double parse_decimal(std::string_view digits) {
  double value = 0;
  const auto result = std::from_chars(digits.data(), digits.data() + digits.size(), value,
                                      std::chars_format::general);
  if (result.ec == std::errc::result_out_of_range) {
    // from_chars reports overflow and underflow without a value: JavaScript gives
    // Infinity or 0 (the sign is applied by the caller).
    const size_t e = digits.find_first_of("eE");
    const bool negative_exponent =
        e != std::string_view::npos && e + 1 < digits.size() && digits[e + 1] == '-';
    return negative_exponent ? 0.0 : kInfinity;
  }
  return value;
}

// Length of the longest StrUnsignedDecimalLiteral prefix of s (without "Infinity"), or 0.
size_t decimal_prefix_length(std::string_view s) {
  size_t i = 0;
  size_t int_digits = 0;
  while (i < s.size() && unicode::is_ascii_digit(s[i])) {
    ++i;
    ++int_digits;
  }
  size_t frac_digits = 0;
  if (i < s.size() && s[i] == '.') {
    size_t j = i + 1;
    while (j < s.size() && unicode::is_ascii_digit(s[j])) {
      ++j;
      ++frac_digits;
    }
    if (int_digits > 0 || frac_digits > 0) i = j;
  }
  if (int_digits == 0 && frac_digits == 0) return 0;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    const size_t exp_start = j;
    while (j < s.size() && unicode::is_ascii_digit(s[j])) ++j;
    if (j > exp_start) i = j;
  }
  return i;
}

double parse_radix(std::string_view digits, int radix) {
  if (digits.empty()) return kNaN;
  double value = 0;
  for (char c : digits) {
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    if (c >= 'a' && c <= 'z') d = c - 'a' + 10;
    if (c >= 'A' && c <= 'Z') d = c - 'A' + 10;
    if (d < 0 || d >= radix) return kNaN;
    value = value * radix + d;
  }
  return value;
}

}  // namespace

std::string js_number_to_string(double value) {
  if (std::isnan(value)) return "NaN";
  if (value == 0) return "0";
  if (value < 0) {
    std::string out(1, '-');
    out += js_number_to_string(-value);
    return out;
  }
  if (std::isinf(value)) return "Infinity";

  // Shortest round-trip digits, closest to the value: the digits ECMAScript's
  // Number::toString specifies.
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  const std::string_view sci(buf, static_cast<size_t>(result.ptr - buf));
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits.push_back(c);
  }
  const int exponent = std::atoi(std::string(sci.substr(e_pos + 1)).c_str());
  const int k = static_cast<int>(digits.size());
  const int n = exponent + 1;

  std::string out;
  if (k <= n && n <= 21) {
    out = digits;
    out.append(static_cast<size_t>(n - k), '0');
  } else if (0 < n && n <= 21) {
    out.append(digits.data(), static_cast<size_t>(n));
    out.push_back('.');
    out.append(digits.data() + n, digits.size() - static_cast<size_t>(n));
  } else if (-6 < n && n <= 0) {
    out.assign("0.");
    out.append(static_cast<size_t>(-n), '0');
    out += digits;
  } else {
    const int e = n - 1;
    out.push_back(digits[0]);
    if (k > 1) {
      out.push_back('.');
      out.append(digits.data() + 1, digits.size() - 1);
    }
    out += e < 0 ? "e-" : "e+";
    out += std::to_string(e < 0 ? -e : e);
  }
  return out;
}

std::string js_to_fixed1(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::fabs(value) >= 1e21) return js_number_to_string(value);
  // toFixed picks the nearer of two candidates and the larger on a tie; printf rounds ties
  // to even. The two agree except on exact ties, which cannot occur for the integral
  // values this is used for (FloatValue prints integral values with toFixed(1)).
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%.1f", value);
  std::string out(buf);
  if (out == "-0.0") out = "0.0";  // toFixed drops the sign of -0
  return out;
}

double js_string_to_number(std::string_view s) {
  s = unicode::trim(s);
  if (s.empty()) return 0;
  if (s.size() > 2 && s[0] == '0') {
    const char p = s[1];
    if (p == 'x' || p == 'X') return parse_radix(s.substr(2), 16);
    if (p == 'o' || p == 'O') return parse_radix(s.substr(2), 8);
    if (p == 'b' || p == 'B') return parse_radix(s.substr(2), 2);
  }
  bool negative = false;
  if (s[0] == '+' || s[0] == '-') {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  double value = 0;
  if (s == "Infinity") {
    value = kInfinity;
  } else {
    const size_t len = decimal_prefix_length(s);
    if (len == 0 || len != s.size()) return kNaN;
    value = parse_decimal(s);
  }
  return negative ? -value : value;
}

double js_parse_int(std::string_view s) {
  s = unicode::trim_start(s);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  size_t len = 0;
  while (len < s.size() && unicode::is_ascii_digit(s[len])) ++len;
  if (len == 0) return kNaN;
  const double value = parse_decimal(s.substr(0, len));
  return negative ? -value : value;
}

double js_parse_float(std::string_view s) {
  s = unicode::trim_start(s);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  double value = 0;
  if (s.starts_with("Infinity")) {
    value = kInfinity;
  } else {
    const size_t len = decimal_prefix_length(s);
    if (len == 0) return kNaN;
    value = parse_decimal(s.substr(0, len));
  }
  return negative ? -value : value;
}

}  // namespace strata::jinja

// ---- js_pow: fdlibm's e_pow.c, as adapted by V8 (src/base/ieee754.cc, legacy::pow) ----
//
// ====================================================
// Copyright (C) 1993 by Sun Microsystems, Inc. All rights reserved.
//
// Developed at SunSoft, a Sun Microsystems, Inc. business.
// Permission to use, copy, modify, and distribute this
// software is freely granted, provided that this notice
// is preserved.
// ====================================================

namespace strata::jinja {
namespace {

int32_t high_word(double d) {
  return static_cast<int32_t>(std::bit_cast<uint64_t>(d) >> 32);
}
uint32_t low_word(double d) {
  return static_cast<uint32_t>(std::bit_cast<uint64_t>(d) & 0xFFFFFFFFu);
}
double set_high_word(double d, int32_t v) {
  uint64_t bits = std::bit_cast<uint64_t>(d) & 0x00000000FFFFFFFFull;
  bits |= static_cast<uint64_t>(static_cast<uint32_t>(v)) << 32;
  return std::bit_cast<double>(bits);
}
double clear_low_word(double d) {
  return std::bit_cast<double>(std::bit_cast<uint64_t>(d) & 0xFFFFFFFF00000000ull);
}

double fdlibm_pow(double x, double y) {
  static const double bp[] = {1.0, 1.5};
  static const double dp_h[] = {0.0, 5.84962487220764160156e-01};
  static const double dp_l[] = {0.0, 1.35003920212974897128e-08};
  static const double zero = 0.0, one = 1.0, two = 2.0, two53 = 9007199254740992.0;
  static const double huge = 1.0e300, tiny = 1.0e-300;
  static const double L1 = 5.99999999999994648725e-01, L2 = 4.28571428578550184252e-01,
                      L3 = 3.33333329818377432918e-01, L4 = 2.72728123808534006489e-01,
                      L5 = 2.30660745775561754067e-01, L6 = 2.06975017800338417784e-01;
  static const double P1 = 1.66666666666666019037e-01, P2 = -2.77777777770155933842e-03,
                      P3 = 6.61375632143793436117e-05, P4 = -1.65339022054652515390e-06,
                      P5 = 4.13813679705723846039e-08;
  static const double lg2 = 6.93147180559945286227e-01, lg2_h = 6.93147182464599609375e-01,
                      lg2_l = -1.90465429995776804525e-09, ovt = 8.0085662595372944372e-0017,
                      cp = 9.61796693925975554329e-01, cp_h = 9.61796700954437255859e-01,
                      cp_l = -7.02846165095275826516e-09, ivln2 = 1.44269504088896338700e+00,
                      ivln2_h = 1.44269502162933349609e+00, ivln2_l = 1.92596299112661746887e-08;

  double z, ax, z_h, z_l, p_h, p_l;
  double y1, t1, t2, r, s, t, u, v, w;
  int32_t i, j, k, yisint, n;
  const int32_t hx = high_word(x);
  const uint32_t lx = low_word(x);
  const int32_t hy = high_word(y);
  const uint32_t ly = low_word(y);
  int32_t ix = hx & 0x7fffffff;
  const int32_t iy = hy & 0x7fffffff;

  if ((static_cast<uint32_t>(iy) | ly) == 0) return one;
  if (ix > 0x7ff00000 || ((ix == 0x7ff00000) && (lx != 0)) || iy > 0x7ff00000 ||
      ((iy == 0x7ff00000) && (ly != 0))) {
    return x + y;
  }
  yisint = 0;
  if (hx < 0) {
    if (iy >= 0x43400000) {
      yisint = 2;
    } else if (iy >= 0x3ff00000) {
      k = (iy >> 20) - 0x3ff;
      if (k > 20) {
        const uint32_t jj = ly >> (52 - k);
        if ((jj << (52 - k)) == ly) yisint = 2 - static_cast<int32_t>(jj & 1);
      } else if (ly == 0) {
        j = iy >> (20 - k);
        if ((j << (20 - k)) == iy) yisint = 2 - (j & 1);
      }
    }
  }
  if (ly == 0) {
    if (iy == 0x7ff00000) {
      if (((ix - 0x3ff00000) | static_cast<int32_t>(lx)) == 0) return y - y;
      if (ix >= 0x3ff00000) return (hy >= 0) ? y : zero;
      return (hy < 0) ? -y : zero;
    }
    if (iy == 0x3ff00000) return hy < 0 ? one / x : x;
    if (hy == 0x40000000) return x * x;
    if (hy == 0x3fe00000 && hx >= 0) return std::sqrt(x);
  }
  ax = std::fabs(x);
  if (lx == 0) {
    if (ix == 0x7ff00000 || ix == 0 || ix == 0x3ff00000) {
      z = ax;
      if (hy < 0) z = one / z;
      if (hx < 0) {
        if (((ix - 0x3ff00000) | yisint) == 0) {
          z = std::numeric_limits<double>::quiet_NaN();
        } else if (yisint == 1) {
          z = -z;
        }
      }
      return z;
    }
  }
  n = (hx >> 31) + 1;
  if ((n | yisint) == 0) return std::numeric_limits<double>::quiet_NaN();
  s = one;
  if ((n | (yisint - 1)) == 0) s = -one;

  if (iy > 0x41e00000) {
    if (iy > 0x43f00000) {
      if (ix <= 0x3fefffff) return (hy < 0) ? huge * huge : tiny * tiny;
      if (ix >= 0x3ff00000) return (hy > 0) ? huge * huge : tiny * tiny;
    }
    if (ix < 0x3fefffff) return (hy < 0) ? s * huge * huge : s * tiny * tiny;
    if (ix > 0x3ff00000) return (hy > 0) ? s * huge * huge : s * tiny * tiny;
    t = ax - one;
    w = (t * t) * (0.5 - t * (0.3333333333333333333333 - t * 0.25));
    u = ivln2_h * t;
    v = t * ivln2_l - w * ivln2;
    t1 = clear_low_word(u + v);
    t2 = v - (t1 - u);
  } else {
    double ss, s2, s_h, s_l, t_h, t_l;
    n = 0;
    if (ix < 0x00100000) {
      ax *= two53;
      n -= 53;
      ix = high_word(ax);
    }
    n += ((ix) >> 20) - 0x3ff;
    j = ix & 0x000fffff;
    ix = j | 0x3ff00000;
    if (j <= 0x3988E) {
      k = 0;
    } else if (j < 0xBB67A) {
      k = 1;
    } else {
      k = 0;
      n += 1;
      ix -= 0x00100000;
    }
    ax = set_high_word(ax, ix);
    u = ax - bp[k];
    v = one / (ax + bp[k]);
    ss = u * v;
    s_h = clear_low_word(ss);
    t_h = set_high_word(zero, ((ix >> 1) | 0x20000000) + 0x00080000 + (k << 18));
    t_l = ax - (t_h - bp[k]);
    s_l = v * ((u - s_h * t_h) - s_h * t_l);
    s2 = ss * ss;
    r = s2 * s2 * (L1 + s2 * (L2 + s2 * (L3 + s2 * (L4 + s2 * (L5 + s2 * L6)))));
    r += s_l * (s_h + ss);
    s2 = s_h * s_h;
    t_h = clear_low_word(3.0 + s2 + r);
    t_l = r - ((t_h - 3.0) - s2);
    u = s_h * t_h;
    v = s_l * t_h + t_l * ss;
    p_h = clear_low_word(u + v);
    p_l = v - (p_h - u);
    z_h = cp_h * p_h;
    z_l = cp_l * p_h + p_l * cp + dp_l[k];
    t = static_cast<double>(n);
    t1 = clear_low_word(((z_h + z_l) + dp_h[k]) + t);
    t2 = z_l - (((t1 - t) - dp_h[k]) - z_h);
  }

  y1 = clear_low_word(y);
  p_l = (y - y1) * t1 + y * t2;
  p_h = y1 * t1;
  z = p_l + p_h;
  j = high_word(z);
  i = static_cast<int32_t>(low_word(z));
  if (j >= 0x40900000) {
    if (((j - 0x40900000) | i) != 0) return s * huge * huge;
    if (p_l + ovt > z - p_h) return s * huge * huge;
  } else if ((j & 0x7fffffff) >= 0x4090cc00) {
    if (((j - static_cast<int32_t>(0xc090cc00)) | i) != 0) return s * tiny * tiny;
    if (p_l <= z - p_h) return s * tiny * tiny;
  }
  i = j & 0x7fffffff;
  k = (i >> 20) - 0x3ff;
  n = 0;
  if (i > 0x3fe00000) {
    n = j + (0x00100000 >> (k + 1));
    k = ((n & 0x7fffffff) >> 20) - 0x3ff;
    t = set_high_word(zero, n & ~(0x000fffff >> k));
    n = ((n & 0x000fffff) | 0x00100000) >> (20 - k);
    if (j < 0) n = -n;
    p_h -= t;
  }
  t = clear_low_word(p_l + p_h);
  u = t * lg2_h;
  v = (p_l - (t - p_h)) * lg2 + t * lg2_l;
  z = u + v;
  w = v - (z - u);
  t = z * z;
  t1 = z - t * (P1 + t * (P2 + t * (P3 + t * (P4 + t * P5))));
  r = (z * t1) / ((t1 - two) - (w + z * w));
  z = one - (r - z);
  j = high_word(z);
  j += static_cast<int32_t>(static_cast<uint32_t>(n) << 20);
  if ((j >> 20) <= 0) {
    z = std::scalbn(z, n);
  } else {
    z = set_high_word(z, high_word(z) + static_cast<int32_t>(static_cast<uint32_t>(n) << 20));
  }
  return s * z;
}

}  // namespace

double js_pow(double x, double y) {
  if (std::isnan(y)) return std::numeric_limits<double>::quiet_NaN();
  if (std::isinf(y) && (x == 1 || x == -1)) return std::numeric_limits<double>::quiet_NaN();
  return fdlibm_pow(x, y);
}

}  // namespace strata::jinja
