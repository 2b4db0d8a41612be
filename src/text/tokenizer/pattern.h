// Pattern: the {"String": ...} or {"Regex": ...} object of tokenizer.json (Split
// pre-tokenizer, Replace normalizer and decoder), with the semantics the reference gives it
// (createPattern in @lenml/tokenizers): a String is matched literally, a Regex is a JS
// regex with the "gu" flags (see js_regex.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/result.h"
#include "text/tokenizer/js_regex.h"

namespace strata {

class Pattern {
 public:
  // `invert` mirrors createPattern's second argument: with invert == false a String
  // pattern is wrapped in a capture group, so split() keeps the delimiters.
  static Result<Pattern> from_json(const nlohmann::json& pattern, bool invert = true);
  static Result<Pattern> literal(std::string text, bool invert = true);
  static Result<Pattern> regex(std::string_view js_pattern);

  // All matches (non-overlapping, left to right; empty regex matches included).
  Status find_all(std::string_view text, std::vector<TextSpan>& matches) const;
  // The same matches handed to `sink` one at a time; false when the sink stopped.
  Result<bool> for_each_match(std::string_view text, const JsRegex::SpanSink& sink) const;
  // String.prototype.split(pattern) with empty pieces dropped.
  Status split(std::string_view text, std::vector<std::string_view>& pieces) const;
  // The same pieces handed to `sink` one at a time; false when the sink stopped.
  Result<bool> for_each_split(std::string_view text, const JsRegex::PieceSink& sink) const;
  // String.prototype.replaceAll(pattern, content), content taken literally.
  Status replace_all(std::string_view text, std::string_view content, std::string& out) const;

  bool is_literal() const { return !regex_.has_value(); }
  const std::string& literal_text() const { return literal_; }

 private:
  Pattern() = default;

  std::string literal_;
  bool capture_literal_ = false;
  std::optional<JsRegex> regex_;
};

}  // namespace strata
