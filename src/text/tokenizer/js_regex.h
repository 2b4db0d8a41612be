// JsRegex: a regular expression with the semantics of a JavaScript RegExp created with the
// "gu" flags, run by PCRE2 (UTF mode, JIT-compiled). tokenizer.json patterns are executed
// by the reference (@lenml/tokenizers, a port of Hugging Face tokenizers to JavaScript) as
// JS regexes, so Strata translates the few spots where PCRE2 syntax or semantics differ:
// \s and \S (JS whitespace set, which includes U+FEFF), '.' (no line terminators), \uXXXX
// and \u{...}, \v, \0, long General_Category names, Script= / Script_Extensions=, and '$'
// (end of input only). \d, \w and \b stay ASCII as in JS (PCRE2_UCP is off on purpose;
// \p{...} classes are Unicode-aware without it).
//
// Work and memory are linear in the subject for the tokenizer's patterns: the streaming
// forms (for_each_match, split) hold one match at a time, and PCRE2's match limit grows
// with the subject so that a long run (10 MB of spaces) is not refused by a fixed limit.
//
// Thread-safe: a compiled JsRegex is immutable; matching uses per-thread scratch space.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace strata {

// Half-open byte range [begin, end) in a subject string.
struct TextSpan {
  size_t begin = 0;
  size_t end = 0;
  size_t size() const { return end - begin; }
};

class JsRegex {
 public:
  // Receives one match (or one piece) at a time; returns false to stop the scan.
  using SpanSink = std::function<bool(TextSpan)>;
  using PieceSink = std::function<bool(std::string_view)>;

  // Compiles `js_pattern` (JavaScript syntax, "gu" flags). Errors name the pattern and the
  // offset PCRE2 reports.
  static Result<JsRegex> compile(std::string_view js_pattern);

  JsRegex(JsRegex&&) noexcept;
  JsRegex& operator=(JsRegex&&) noexcept;
  JsRegex(const JsRegex&) = delete;
  JsRegex& operator=(const JsRegex&) = delete;
  ~JsRegex();

  // All matches in order, as String.prototype.matchAll finds them: after an empty match
  // the search resumes one code point later. Empty matches are included. `text` must be
  // valid UTF-8.
  Status find_all(std::string_view text, std::vector<TextSpan>& matches) const;
  // The same matches handed to `sink` in order, without collecting them. Returns false
  // when the sink stopped the scan.
  Result<bool> for_each_match(std::string_view text, const SpanSink& sink) const;

  // String.prototype.split(regex): the pieces between matches and, after each piece, the
  // capture groups of the match (unset groups omitted); empty pieces are dropped, as the
  // reference's `.filter((x) => x)` does.
  Status split(std::string_view text, std::vector<std::string_view>& pieces) const;
  // The same pieces handed to `sink` in order. Returns false when the sink stopped.
  Result<bool> for_each_split(std::string_view text, const PieceSink& sink) const;

  // String.prototype.replaceAll(regex, content) where `content` is literal (callers
  // reject '$' patterns).
  Status replace_all(std::string_view text, std::string_view content, std::string& out) const;

  const std::string& source() const { return source_; }
  const std::string& translated() const { return translated_; }

 private:
  struct Code;
  JsRegex(std::unique_ptr<Code> code, std::string source, std::string translated);

  // Matches at or after `start` (anchored at `start` when `anchored`). Fills `groups` with
  // [whole match, capture 1, ...]; unset groups get begin == npos. Returns false when
  // there is no match.
  Result<bool> match(std::string_view text, size_t start, bool anchored,
                     std::vector<TextSpan>& groups) const;

  std::unique_ptr<Code> code_;
  std::string source_;
  std::string translated_;
};

// Translates a JavaScript ("u" flag) pattern into PCRE2 syntax with the same meaning, after
// the rewrites the reference applies to tokenizer.json patterns. Exposed for tests.
Result<std::string> translate_js_regex(std::string_view js_pattern);

}  // namespace strata
