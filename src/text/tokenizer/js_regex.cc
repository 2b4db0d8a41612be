#include "text/tokenizer/js_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <utility>

#include "text/tokenizer/hex_digit.h"
#include "text/tokenizer/utf8.h"

namespace strata {
namespace {

// JavaScript's \s: WhiteSpace and LineTerminator code points (ECMA-262), as the body of a
// character class in PCRE2 syntax. PCRE2's own \s lacks U+FEFF.
constexpr std::string_view kJsSpaceClassBody =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}";

// JavaScript's '.' (u flag, no s flag): any code point except line terminators.
constexpr std::string_view kJsDot = "[^\\n\\r\\x{2028}\\x{2029}]";

// Long General_Category names (accepted by JS) mapped to the short names PCRE2 accepts.
constexpr std::array<std::pair<std::string_view, std::string_view>, 38> kCategoryAliases = {{
    {"Letter", "L"},
    {"Cased_Letter", "L&"},
    {"LC", "L&"},
    {"Uppercase_Letter", "Lu"},
    {"Lowercase_Letter", "Ll"},
    {"Titlecase_Letter", "Lt"},
    {"Modifier_Letter", "Lm"},
    {"Other_Letter", "Lo"},
    {"Mark", "M"},
    {"Combining_Mark", "M"},
    {"Nonspacing_Mark", "Mn"},
    {"Spacing_Mark", "Mc"},
    {"Enclosing_Mark", "Me"},
    {"Number", "N"},
    {"Decimal_Number", "Nd"},
    {"digit", "Nd"},
    {"Letter_Number", "Nl"},
    {"Other_Number", "No"},
    {"Punctuation", "P"},
    {"punct", "P"},
    {"Connector_Punctuation", "Pc"},
    {"Dash_Punctuation", "Pd"},
    {"Open_Punctuation", "Ps"},
    {"Close_Punctuation", "Pe"},
    {"Initial_Punctuation", "Pi"},
    {"Final_Punctuation", "Pf"},
    {"Other_Punctuation", "Po"},
    {"Symbol", "S"},
    {"Math_Symbol", "Sm"},
    {"Currency_Symbol", "Sc"},
    {"Modifier_Symbol", "Sk"},
    {"Other_Symbol", "So"},
    {"Separator", "Z"},
    {"Space_Separator", "Zs"},
    {"Line_Separator", "Zl"},
    {"Paragraph_Separator", "Zp"},
    {"Other", "C"},
    {"Control", "Cc"},
}};

// The reference's own rewrites of tokenizer.json patterns before it builds a RegExp
// (createPattern in tokenizers.js): drop the backslash of \#, \& and \~, and replace
// patterns that JavaScript cannot parse by equivalent ones.
std::string apply_reference_rewrites(std::string_view pattern) {
  std::string s;
  s.reserve(pattern.size());
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size() &&
        (pattern[i + 1] == '#' || pattern[i + 1] == '&' || pattern[i + 1] == '~')) {
      continue;
    }
    s.push_back(pattern[i]);
  }
  const std::array<std::pair<std::string_view, std::string_view>, 2> problematic = {{
      {"(?i:'s|'t|'re|'ve|'m|'ll|'d)", "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))"},
      {" ?[^(\\s|[.,!?\xE2\x80\xA6\xE3\x80\x82\xEF\xBC\x8C\xE3\x80\x81\xE0\xA5\xA4\xDB\x94\xD8\x8C]"
       ")]+",
       " ?[^\\s.,!?\xE2\x80\xA6\xE3\x80\x82\xEF\xBC\x8C\xE3\x80\x81\xE0\xA5\xA4\xDB\x94\xD8\x8C]+"},
  }};
  for (const auto& [from, to] : problematic) {
    std::string replaced;
    size_t pos = 0;
    while (true) {
      const size_t hit = s.find(from, pos);
      if (hit == std::string::npos) break;
      replaced.append(s, pos, hit - pos);
      replaced.append(to);
      pos = hit + from.size();
    }
    if (pos != 0) {
      replaced.append(s, pos, std::string::npos);
      s = std::move(replaced);
    }
  }
  return s;
}

// Parses exactly `digits` hex digits at p[i..]; returns -1 when they are not all hex.
long parse_hex(std::string_view p, size_t i, size_t digits) {
  if (i + digits > p.size()) return -1;
  long v = 0;
  for (size_t k = 0; k < digits; ++k) {
    const int h = hex_value(p[i + k]);
    if (h < 0) return -1;
    v = v * 16 + h;
  }
  return v;
}

std::string hex_escape(long cp) {
  char buf[24];  // room for any long: g++ cannot see that cp is a code point
  std::snprintf(buf, sizeof buf, "\\x{%lX}", cp);
  return buf;
}

Result<std::string> translate_property(std::string_view name) {
  std::string_view value = name;
  std::string prefix;
  const size_t eq = name.find('=');
  if (eq != std::string_view::npos) {
    const std::string_view key = name.substr(0, eq);
    value = name.substr(eq + 1);
    if (key == "General_Category" || key == "gc") {
      prefix.clear();
    } else if (key == "Script" || key == "sc") {
      prefix = "sc:";
    } else if (key == "Script_Extensions" || key == "scx") {
      prefix = "scx:";
    } else {
      return make_error(ErrorCode::kUnsupported,
                        "unsupported Unicode property '" + std::string(name) + "' in regex");
    }
  }
  if (prefix.empty()) {
    for (const auto& [alias, short_name] : kCategoryAliases) {
      if (value == alias) return std::string(short_name);
    }
  }
  return prefix + std::string(value);
}

}  // namespace

Result<std::string> translate_js_regex(std::string_view js_pattern) {
  const std::string p = apply_reference_rewrites(js_pattern);
  std::string out;
  out.reserve(p.size() + 32);
  bool in_class = false;
  size_t i = 0;
  const size_t n = p.size();
  auto unsupported = [&](std::string_view what) {
    return make_error(ErrorCode::kUnsupported, "regex '" + std::string(js_pattern) +
                                                   "': " + std::string(what) + " is not supported");
  };
  while (i < n) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= n) return unsupported("a trailing backslash");
      const char d = p[i + 1];
      switch (d) {
        case 's':
          if (in_class) {
            out.append(kJsSpaceClassBody);
          } else {
            out.append("[").append(kJsSpaceClassBody).append("]");
          }
          i += 2;
          continue;
        case 'S':
          if (in_class) return unsupported("\\S inside a character class");
          out.append("[^").append(kJsSpaceClassBody).append("]");
          i += 2;
          continue;
        case 'v':
          out.append("\\x{0B}");
          i += 2;
          continue;
        case '0':
          if (i + 2 < n && p[i + 2] >= '0' && p[i + 2] <= '9') {
            return unsupported("an octal escape");
          }
          out.append("\\x{00}");
          i += 2;
          continue;
        case 'u': {
          if (i + 2 < n && p[i + 2] == '{') {
            const size_t close = p.find('}', i + 3);
            if (close == std::string::npos || close == i + 3) return unsupported("a bad \\u{}");
            const long cp = parse_hex(p, i + 3, close - i - 3);
            if (cp < 0 || cp > 0x10FFFF) return unsupported("a bad \\u{}");
            out.append(hex_escape(cp));
            i = close + 1;
            continue;
          }
          long cp = parse_hex(p, i + 2, 4);
          if (cp < 0) return unsupported("a bad \\u escape");
          i += 6;
          if (cp >= 0xD800 && cp <= 0xDBFF && i + 1 < n && p[i] == '\\' && p[i + 1] == 'u') {
            const long low = parse_hex(p, i + 2, 4);
            if (low >= 0xDC00 && low <= 0xDFFF) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
              i += 6;
            }
          }
          if (cp >= 0xD800 && cp <= 0xDFFF) return unsupported("a lone surrogate escape");
          out.append(hex_escape(cp));
          continue;
        }
        case 'p':
        case 'P': {
          if (i + 2 >= n || p[i + 2] != '{') return unsupported("\\p without braces");
          const size_t close = p.find('}', i + 3);
          if (close == std::string::npos) return unsupported("an unterminated \\p{");
          auto name = translate_property(std::string_view(p).substr(i + 3, close - i - 3));
          if (!name) return std::unexpected(name.error());
          out.push_back('\\');
          out.push_back(d);
          out.append("{").append(*name).append("}");
          i = close + 1;
          continue;
        }
        case 'c':
          if (i + 2 >= n) return unsupported("a bad \\c escape");
          out.append(p, i, 3);
          i += 3;
          continue;
        default:
          // \d \D \w \W \b \B keep their ASCII meaning (no PCRE2_UCP), as in JS; \t \n \r \f
          // \xHH, back references and escaped punctuation mean the same in both.
          out.push_back('\\');
          out.push_back(d);
          i += 2;
          continue;
      }
    }
    if (in_class) {
      if (c == ']') {
        in_class = false;
        out.push_back(c);
      } else if (c == '[') {
        out.append("\\[");  // literal in JS; PCRE2 could read "[:" as a POSIX class
      } else {
        out.push_back(c);
      }
      ++i;
      continue;
    }
    if (c == '[') {
      if (i + 1 < n && p[i + 1] == ']') {
        out.append("(?!)");  // JS: [] matches nothing
        i += 2;
        continue;
      }
      if (i + 2 < n && p[i + 1] == '^' && p[i + 2] == ']') {
        out.append("[\\x{0}-\\x{10FFFF}]");  // JS: [^] matches anything
        i += 3;
        continue;
      }
      in_class = true;
      out.push_back(c);
      ++i;
      if (i < n && p[i] == '^') {
        out.push_back('^');
        ++i;
      }
      continue;
    }
    if (c == '.') {
      out.append(kJsDot);
      ++i;
      continue;
    }
    out.push_back(c);
    ++i;
  }
  if (in_class) return unsupported("an unterminated character class");
  return out;
}

struct JsRegex::Code {
  pcre2_code* code = nullptr;
  uint32_t capture_count = 0;
  ~Code() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

namespace {

// Per-thread match scratch: match data sized for the largest pattern seen, and a JIT stack
// large enough for long inputs.
struct MatchScratch {
  pcre2_match_data* data = nullptr;
  uint32_t pairs = 0;
  pcre2_jit_stack* jit_stack = nullptr;
  pcre2_match_context* context = nullptr;
  uint64_t match_limit = 0;  // the limit set on `context` (0: PCRE2's default)

  MatchScratch() {
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    context = pcre2_match_context_create(nullptr);
    if (jit_stack != nullptr && context != nullptr) {
      pcre2_jit_stack_assign(context, nullptr, jit_stack);
    }
  }
  ~MatchScratch() {
    if (data != nullptr) pcre2_match_data_free(data);
    if (context != nullptr) pcre2_match_context_free(context);
    if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;

  // PCRE2's match limit (default 10 million) counts backtracking steps; one match of the
  // pre-tokenizer patterns may take a few per byte of the subject (\s*[\r\n]+ backs over
  // a run of spaces), so a fixed limit refuses long runs that JavaScript matches. The
  // limit grows with the subject: linear work is allowed, runaway backtracking is not.
  void limit_for(size_t subject_bytes) {
    constexpr uint64_t kDefaultLimit = 10'000'000;
    constexpr uint64_t kStepsPerByte = 16;
    const uint64_t limit = std::min<uint64_t>(
        UINT32_MAX, std::max<uint64_t>(kDefaultLimit, kStepsPerByte * uint64_t{subject_bytes}));
    if (context != nullptr && limit != match_limit) {
      pcre2_set_match_limit(context, static_cast<uint32_t>(limit));
      match_limit = limit;
    }
  }

  pcre2_match_data* data_for(uint32_t needed_pairs) {
    if (data == nullptr || pairs < needed_pairs) {
      if (data != nullptr) pcre2_match_data_free(data);
      pairs = std::max<uint32_t>(needed_pairs, 16);
      data = pcre2_match_data_create(pairs, nullptr);
    }
    return data;
  }
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

size_t advance(std::string_view text, size_t pos) {
  if (pos >= text.size()) return pos + 1;
  return pos + utf8::sequence_length(static_cast<uint8_t>(text[pos]));
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

JsRegex::JsRegex(std::unique_ptr<Code> code, std::string source, std::string translated)
    : code_(std::move(code)), source_(std::move(source)), translated_(std::move(translated)) {}
JsRegex::JsRegex(JsRegex&&) noexcept = default;
JsRegex& JsRegex::operator=(JsRegex&&) noexcept = default;
JsRegex::~JsRegex() = default;

Result<JsRegex> JsRegex::compile(std::string_view js_pattern) {
  auto translated = translate_js_regex(js_pattern);
  if (!translated) return std::unexpected(translated.error());
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated->data()), translated->size(),
                    PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    return make_error(ErrorCode::kUnsupported,
                      "regex '" + std::string(js_pattern) + "' (as PCRE2 '" + *translated +
                          "') does not compile at offset " + std::to_string(error_offset) + ": " +
                          pcre2_message(error_code));
  }
  auto holder = std::make_unique<Code>();
  holder->code = code;
  // JIT is an optimisation: when it is unavailable pcre2_match interprets the pattern.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  pcre2_pattern_info(code, PCRE2_INFO_CAPTURECOUNT, &holder->capture_count);
  return JsRegex(std::move(holder), std::string(js_pattern), std::move(*translated));
}

Result<bool> JsRegex::match(std::string_view text, size_t start, bool anchored,
                            std::vector<TextSpan>& groups) const {
  MatchScratch& s = scratch();
  pcre2_match_data* data = s.data_for(code_->capture_count + 1);
  if (data == nullptr) return make_error(ErrorCode::kInternal, "pcre2 match data allocation");
  s.limit_for(text.size() - start);
  const uint32_t options = PCRE2_NO_UTF_CHECK | (anchored ? PCRE2_ANCHORED : 0u);
  const int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                             start, options, data, s.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    return make_error(ErrorCode::kInternal,
                      "regex '" + source_ + "' failed to match: " + pcre2_message(rc));
  }
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
  const size_t count = code_->capture_count + 1;
  groups.resize(count);
  for (size_t g = 0; g < count; ++g) {
    if (g < static_cast<size_t>(rc) && ovector[2 * g] != PCRE2_UNSET) {
      groups[g] = TextSpan{ovector[2 * g], ovector[2 * g + 1]};
    } else {
      groups[g] = TextSpan{std::string_view::npos, std::string_view::npos};
    }
  }
  return true;
}

Status JsRegex::find_all(std::string_view text, std::vector<TextSpan>& matches) const {
  auto done = for_each_match(text, [&matches](TextSpan m) {
    matches.push_back(m);
    return true;
  });
  if (!done) return std::unexpected(done.error());
  return {};
}

Result<bool> JsRegex::for_each_match(std::string_view text, const SpanSink& sink) const {
  std::vector<TextSpan> groups;
  size_t pos = 0;
  while (pos <= text.size()) {
    auto found = match(text, pos, /*anchored=*/false, groups);
    if (!found) return std::unexpected(found.error());
    if (!*found) break;
    const TextSpan m = groups[0];
    if (!sink(m)) return false;
    pos = m.end == m.begin ? advance(text, m.end) : m.end;
  }
  return true;
}

Status JsRegex::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  auto done = for_each_split(text, [&pieces](std::string_view piece) {
    pieces.push_back(piece);
    return true;
  });
  if (!done) return std::unexpected(done.error());
  return {};
}

// RegExp.prototype[Symbol.split] (ECMA-262 22.2.6.14) with a sticky match at each q.
Result<bool> JsRegex::for_each_split(std::string_view text, const PieceSink& sink) const {
  std::vector<TextSpan> groups;
  const size_t size = text.size();
  if (size == 0) {
    // An empty input yields [] when the regex matches it and [""] otherwise; both are
    // empty after dropping empty pieces.
    return true;
  }
  size_t p = 0;
  size_t q = 0;
  while (q < size) {
    auto found = match(text, q, /*anchored=*/true, groups);
    if (!found) return std::unexpected(found.error());
    if (!*found) {
      q = advance(text, q);
      continue;
    }
    const size_t e = std::min(groups[0].end, size);
    if (e == p) {
      q = advance(text, q);
      continue;
    }
    if (q > p && !sink(text.substr(p, q - p))) return false;
    for (size_t g = 1; g < groups.size(); ++g) {
      if (groups[g].begin != std::string_view::npos && groups[g].end > groups[g].begin) {
        if (!sink(text.substr(groups[g].begin, groups[g].size()))) return false;
      }
    }
    p = e;
    q = p;
  }
  if (size > p) return sink(text.substr(p));
  return true;
}

Status JsRegex::replace_all(std::string_view text, std::string_view content,
                            std::string& out) const {
  std::vector<TextSpan> matches;
  if (auto st = find_all(text, matches); !st) return st;
  out.clear();
  size_t prev = 0;
  for (const TextSpan& m : matches) {
    out.append(text.substr(prev, m.begin - prev));
    out.append(content);
    prev = m.end;
  }
  out.append(text.substr(prev));
  return {};
}

}  // namespace strata
