#include "text/tokenizer/pattern.h"

#include <nlohmann/json.hpp>

namespace strata {

Result<Pattern> Pattern::literal(std::string text, bool invert) {
  if (text.empty()) {
    return make_error(ErrorCode::kUnsupported, "an empty String pattern is not supported");
  }
  Pattern p;
  p.literal_ = std::move(text);
  p.capture_literal_ = !invert;
  return p;
}

Result<Pattern> Pattern::regex(std::string_view js_pattern) {
  auto compiled = JsRegex::compile(js_pattern);
  if (!compiled) return std::unexpected(compiled.error());
  Pattern p;
  p.regex_.emplace(std::move(*compiled));
  return p;
}

Result<Pattern> Pattern::from_json(const nlohmann::json& pattern, bool invert) {
  if (!pattern.is_object()) {
    return make_error(ErrorCode::kCorrupt, "pattern must be an object with String or Regex");
  }
  if (const auto it = pattern.find("Regex"); it != pattern.end() && it->is_string()) {
    return regex(it->get<std::string>());
  }
  if (const auto it = pattern.find("String"); it != pattern.end() && it->is_string()) {
    return literal(it->get<std::string>(), invert);
  }
  return make_error(ErrorCode::kCorrupt,
                    "pattern must have a String or Regex field: " + pattern.dump());
}

Status Pattern::find_all(std::string_view text, std::vector<TextSpan>& matches) const {
  auto done = for_each_match(text, [&matches](TextSpan m) {
    matches.push_back(m);
    return true;
  });
  if (!done) return std::unexpected(done.error());
  return {};
}

Result<bool> Pattern::for_each_match(std::string_view text, const JsRegex::SpanSink& sink) const {
  if (regex_) return regex_->for_each_match(text, sink);
  size_t pos = 0;
  while (true) {
    const size_t hit = text.find(literal_, pos);
    if (hit == std::string_view::npos) break;
    if (!sink(TextSpan{hit, hit + literal_.size()})) return false;
    pos = hit + literal_.size();
  }
  return true;
}

Status Pattern::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  auto done = for_each_split(text, [&pieces](std::string_view piece) {
    pieces.push_back(piece);
    return true;
  });
  if (!done) return std::unexpected(done.error());
  return {};
}

Result<bool> Pattern::for_each_split(std::string_view text, const JsRegex::PieceSink& sink) const {
  if (regex_) return regex_->for_each_split(text, sink);
  size_t prev = 0;
  while (true) {
    const size_t hit = text.find(literal_, prev);
    if (hit == std::string_view::npos) break;
    if (hit > prev && !sink(text.substr(prev, hit - prev))) return false;
    if (capture_literal_ && !sink(text.substr(hit, literal_.size()))) return false;
    prev = hit + literal_.size();
  }
  if (prev < text.size()) return sink(text.substr(prev));
  return true;
}

Status Pattern::replace_all(std::string_view text, std::string_view content,
                            std::string& out) const {
  if (regex_) return regex_->replace_all(text, content, out);
  out.clear();
  size_t prev = 0;
  while (true) {
    const size_t hit = text.find(literal_, prev);
    if (hit == std::string_view::npos) break;
    out.append(text.substr(prev, hit - prev));
    out.append(content);
    prev = hit + literal_.size();
  }
  out.append(text.substr(prev));
  return {};
}

}  // namespace strata
