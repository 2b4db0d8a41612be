#include "text/jinja/unicode.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/utf8.h"
#include "text/jinja/unicode_tables.h"

namespace strata::jinja::unicode {
namespace {

// Length of the UTF-8 sequence led by byte b, or 0 for a byte that cannot lead one.
size_t sequence_length(unsigned char b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

bool in_ranges(const CodePointRange* ranges, size_t count, char32_t cp) {
  const CodePointRange* end = ranges + count;
  const CodePointRange* it = std::upper_bound(
      ranges, end, cp, [](char32_t c, const CodePointRange& r) { return c < r.first; });
  if (it == ranges) return false;
  --it;
  return cp <= it->last;
}

bool is_cased(char32_t cp) {
  return in_ranges(kCasedRanges, kNumCasedRanges, cp);
}
bool is_case_ignorable(char32_t cp) {
  return in_ranges(kCaseIgnorableRanges, kNumCaseIgnorableRanges, cp);
}

// Appends the case mapping of cp from the given tables.
void append_mapped(std::string& out, char32_t cp, const CaseRun* runs, size_t num_runs,
                   const CaseSpecial* special, size_t num_special) {
  const CaseSpecial* special_end = special + num_special;
  const CaseSpecial* sp = std::lower_bound(
      special, special_end, cp, [](const CaseSpecial& s, char32_t c) { return s.code_point < c; });
  if (sp != special_end && sp->code_point == cp) {
    for (uint32_t m : sp->mapped) {
      if (m != 0) utf8::append(out, m);
    }
    return;
  }
  const CaseRun* runs_end = runs + num_runs;
  const CaseRun* it = std::upper_bound(runs, runs_end, cp,
                                       [](char32_t c, const CaseRun& r) { return c < r.start; });
  if (it != runs) {
    --it;
    const uint32_t offset = cp - it->start;
    if (offset % it->stride == 0 && offset / it->stride < it->count) {
      utf8::append(out, static_cast<char32_t>(static_cast<int64_t>(cp) + it->delta));
      return;
    }
  }
  utf8::append(out, cp);
}

// Iterates the UTF-16 code units of a UTF-8 string.
class Utf16Units {
 public:
  explicit Utf16Units(std::string_view s) : s_(s) {}
  bool done() const { return pending_ == 0 && pos_ >= s_.size(); }
  char16_t next() {
    if (pending_ != 0) {
      const char16_t unit = pending_;
      pending_ = 0;
      return unit;
    }
    const char32_t cp = decode(s_, pos_);
    if (cp < 0x10000) return static_cast<char16_t>(cp);
    const char32_t v = cp - 0x10000;
    pending_ = static_cast<char16_t>(0xDC00 + (v & 0x3FF));
    return static_cast<char16_t>(0xD800 + (v >> 10));
  }

 private:
  std::string_view s_;
  size_t pos_ = 0;
  char16_t pending_ = 0;
};

}  // namespace

char32_t decode(std::string_view s, size_t& pos) {
  const unsigned char b0 = static_cast<unsigned char>(s[pos]);
  const size_t len = sequence_length(b0);
  if (len == 1) {
    ++pos;
    return b0;
  }
  if (len == 0 || pos + len > s.size()) {
    ++pos;
    return kReplacementChar;
  }
  const unsigned char b1 = static_cast<unsigned char>(s[pos + 1]);
  // Second-byte limits exclude overlong forms, surrogates and values above U+10FFFF.
  unsigned char lo = 0x80;
  unsigned char hi = 0xBF;
  if (b0 == 0xE0) lo = 0xA0;
  if (b0 == 0xED) hi = 0x9F;
  if (b0 == 0xF0) lo = 0x90;
  if (b0 == 0xF4) hi = 0x8F;
  if (b1 < lo || b1 > hi) {
    ++pos;
    return kReplacementChar;
  }
  char32_t cp = 0;
  if (len == 2) {
    cp = (static_cast<char32_t>(b0 & 0x1F) << 6) | (b1 & 0x3F);
  } else {
    for (size_t i = 2; i < len; ++i) {
      const unsigned char b = static_cast<unsigned char>(s[pos + i]);
      if ((b & 0xC0) != 0x80) {
        ++pos;
        return kReplacementChar;
      }
    }
    if (len == 3) {
      cp = (static_cast<char32_t>(b0 & 0x0F) << 12) | (static_cast<char32_t>(b1 & 0x3F) << 6) |
           (static_cast<unsigned char>(s[pos + 2]) & 0x3F);
    } else {
      cp = (static_cast<char32_t>(b0 & 0x07) << 18) | (static_cast<char32_t>(b1 & 0x3F) << 12) |
           (static_cast<char32_t>(static_cast<unsigned char>(s[pos + 2]) & 0x3F) << 6) |
           (static_cast<unsigned char>(s[pos + 3]) & 0x3F);
    }
  }
  pos += len;
  return cp;
}

bool is_js_whitespace(char32_t cp) {
  if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20;
  switch (cp) {
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

size_t whitespace_length_at(std::string_view s, size_t pos) {
  if (pos >= s.size()) return 0;
  const unsigned char b = static_cast<unsigned char>(s[pos]);
  if (b < 0x80) return is_js_whitespace(b) ? 1 : 0;
  size_t next = pos;
  const char32_t cp = decode(s, next);
  return is_js_whitespace(cp) ? next - pos : 0;
}

std::string_view trim_start(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t len = whitespace_length_at(s, pos);
    if (len == 0) break;
    pos += len;
  }
  return s.substr(pos);
}

std::string_view trim_end(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    // Step back to the start of the last code point (at most 4 bytes).
    size_t start = end - 1;
    while (start > 0 && end - start < 4 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) {
      --start;
    }
    size_t probe = start;
    const char32_t cp = decode(s, probe);
    if (probe != end) {
      // The bytes before end are not one well-formed character: an invalid byte is
      // never whitespace.
      break;
    }
    if (!is_js_whitespace(cp)) break;
    end = start;
  }
  return s.substr(0, end);
}

std::string_view trim(std::string_view s) {
  return trim_end(trim_start(s));
}

size_t utf16_length(std::string_view s) {
  size_t units = 0;
  size_t pos = 0;
  while (pos < s.size()) {
    units += decode(s, pos) >= 0x10000 ? 2 : 1;
  }
  return units;
}

bool utf16_at(std::string_view s, double index, std::string& out) {
  const double length = static_cast<double>(utf16_length(s));
  double k = std::isnan(index) ? 0.0 : std::trunc(index);
  if (k < 0) k += length;
  if (k < 0 || k >= length) return false;
  const size_t target = static_cast<size_t>(k);
  size_t unit = 0;
  size_t pos = 0;
  while (pos < s.size()) {
    const char32_t cp = decode(s, pos);
    const size_t width = cp >= 0x10000 ? 2 : 1;
    if (target < unit + width) {
      utf8::append(out, width == 2 ? kReplacementChar : cp);
      return true;
    }
    unit += width;
  }
  return false;
}

int compare_utf16(std::string_view a, std::string_view b) {
  Utf16Units ua(a);
  Utf16Units ub(b);
  while (!ua.done() && !ub.done()) {
    const char16_t x = ua.next();
    const char16_t y = ub.next();
    if (x != y) return x < y ? -1 : 1;
  }
  if (ua.done() && ub.done()) return 0;
  return ua.done() ? -1 : 1;
}

std::string to_upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    const unsigned char b = static_cast<unsigned char>(s[pos]);
    if (b < 0x80) {
      out.push_back(b >= 'a' && b <= 'z' ? static_cast<char>(b - 32) : static_cast<char>(b));
      ++pos;
      continue;
    }
    const char32_t cp = decode(s, pos);
    append_mapped(out, cp, kUpperRuns, kNumUpperRuns, kUpperSpecial, kNumUpperSpecial);
  }
  return out;
}

std::string to_lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    const unsigned char b = static_cast<unsigned char>(s[pos]);
    if (b < 0x80) {
      out.push_back(b >= 'A' && b <= 'Z' ? static_cast<char>(b + 32) : static_cast<char>(b));
      ++pos;
      continue;
    }
    const size_t start = pos;
    const char32_t cp = decode(s, pos);
    if (cp == 0x03A3) {
      // Final_Sigma: a capital sigma preceded by a cased letter (skipping case-ignorable
      // characters) and not followed by one lowercases to the final form U+03C2.
      bool cased_before = false;
      size_t back = start;
      while (back > 0) {
        size_t prev = back - 1;
        while (prev > 0 && back - prev < 4 &&
               (static_cast<unsigned char>(s[prev]) & 0xC0) == 0x80) {
          --prev;
        }
        size_t probe = prev;
        const char32_t c = decode(s, probe);
        if (probe != back) break;
        back = prev;
        if (is_case_ignorable(c)) continue;
        cased_before = is_cased(c);
        break;
      }
      bool cased_after = false;
      size_t ahead = pos;
      while (ahead < s.size()) {
        const char32_t c = decode(s, ahead);
        if (is_case_ignorable(c)) continue;
        cased_after = is_cased(c);
        break;
      }
      utf8::append(out, cased_before && !cased_after ? 0x03C2 : 0x03C3);
      continue;
    }
    append_mapped(out, cp, kLowerRuns, kNumLowerRuns, kLowerSpecial, kNumLowerSpecial);
  }
  return out;
}

bool is_valid_utf8(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t before = pos;
    const char32_t cp = decode(s, pos);
    if (cp == kReplacementChar) {
      // A real U+FFFD is three bytes EF BF BD; a one-byte advance means invalid input.
      if (pos - before != 3) return false;
    }
  }
  return true;
}

}  // namespace strata::jinja::unicode
