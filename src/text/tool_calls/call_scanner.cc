#include "text/tool_calls/call_scanner.h"

#include <nlohmann/json.hpp>

namespace strata::tool_calls {
namespace {

constexpr size_t kMaxDepth = 256;

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

// A JSON string literal's value (with its quotes), or nullopt when it is not one.
std::optional<std::string> decode_string(const std::string& literal) {
  nlohmann::json j = nlohmann::json::parse(literal, nullptr, /*allow_exceptions=*/false);
  if (!j.is_string()) return std::nullopt;
  return j.get<std::string>();
}

}  // namespace

CallScanner::Step CallScanner::feed(char c) {
  text_.push_back(c);
  const size_t pos = text_.size() - 1;
  if (in_string_) {
    if (escape_) {
      escape_ = false;
    } else if (c == '\\') {
      escape_ = true;
    } else if (c == '"') {
      in_string_ = false;
      if (mode_ == Mode::kCallObject && stack_.size() == 1) {
        if (expect_ == Expect::kKey) {
          auto key = decode_string(text_.substr(token_begin_, pos + 1 - token_begin_));
          if (!key) return Step::kError;
          key_ = std::move(*key);
          need_key_ = false;
          expect_ = Expect::kColon;
        } else if (expect_ == Expect::kInValue && value_is_string_) {
          return end_value();
        }
      }
    } else if (static_cast<unsigned char>(c) < 0x20) {
      return Step::kError;  // a raw control character: not JSON
    }
    return Step::kMore;
  }
  if (stack_.empty()) {
    if (is_space(c)) return Step::kMore;
    if (c != '{') return Step::kError;
    stack_.push_back('{');
    if (mode_ == Mode::kArgsOnly) args_begin_ = pos;
    return Step::kMore;
  }
  if (mode_ == Mode::kCallObject && stack_.size() == 1) return on_top_level(c);
  // Inside a nested value (or the arguments of kArgsOnly): brackets and strings only.
  switch (c) {
    case '"':
      in_string_ = true;
      return Step::kMore;
    case '{':
    case '[':
      if (stack_.size() >= kMaxDepth) return Step::kError;
      stack_.push_back(c);
      return Step::kMore;
    case '}':
    case ']':
      if (stack_.back() != (c == '}' ? '{' : '[')) return Step::kError;
      stack_.pop_back();
      if (stack_.empty()) {  // kArgsOnly: the arguments object closed
        args_end_ = pos + 1;
        return Step::kDone;
      }
      if (mode_ == Mode::kCallObject && stack_.size() == 1) return end_value();
      return Step::kMore;
    default:
      return Step::kMore;
  }
}

// A byte directly inside the call object.
CallScanner::Step CallScanner::on_top_level(char c) {
  const size_t pos = text_.size() - 1;
  switch (expect_) {
    case Expect::kKey:
      if (is_space(c)) return Step::kMore;
      if (c == '"') {
        in_string_ = true;
        token_begin_ = pos;
        return Step::kMore;
      }
      if (c == '}' && !need_key_) {  // {}: no name
        stack_.pop_back();
        return Step::kDone;
      }
      return Step::kError;
    case Expect::kColon:
      if (is_space(c)) return Step::kMore;
      if (c != ':') return Step::kError;
      expect_ = Expect::kValue;
      return Step::kMore;
    case Expect::kValue:
      if (is_space(c)) return Step::kMore;
      value_kind_ = key_ == "name"                                ? ValueKind::kName
                    : key_ == "arguments" || key_ == "parameters" ? ValueKind::kArgs
                                                                  : ValueKind::kOther;
      if (value_kind_ == ValueKind::kName && (name_ || c != '"')) return Step::kError;
      if (value_kind_ == ValueKind::kArgs && (args_begin_ || c != '{')) return Step::kError;
      token_begin_ = pos;
      if (value_kind_ == ValueKind::kArgs) args_begin_ = pos;
      expect_ = Expect::kInValue;
      value_is_string_ = c == '"';
      value_is_scalar_ = c != '"' && c != '{' && c != '[';
      if (value_is_string_) {
        in_string_ = true;
      } else if (!value_is_scalar_) {
        stack_.push_back(c);
      } else if (c == ',' || c == '}' || c == ']' || c == ':') {
        return Step::kError;
      }
      return Step::kMore;
    case Expect::kInValue:
      // Only a scalar (number, true, false, null) is read here: it ends at a separator.
      if (is_space(c) || c == ',' || c == '}') {
        text_.pop_back();
        if (end_value() == Step::kError) return Step::kError;
        return feed(c);
      }
      if (c == '"' || c == '{' || c == '[' || c == ']' || c == ':') return Step::kError;
      return Step::kMore;
    case Expect::kCommaOrEnd:
      if (is_space(c)) return Step::kMore;
      if (c == ',') {
        expect_ = Expect::kKey;
        need_key_ = true;  // a key must follow: {"a": 1,} is not JSON
        return Step::kMore;
      }
      if (c == '}') {
        stack_.pop_back();
        return Step::kDone;
      }
      return Step::kError;
  }
  return Step::kError;
}

// The value after the current key has just ended (text_ ends with its last byte).
CallScanner::Step CallScanner::end_value() {
  const size_t end = text_.size();
  if (value_kind_ == ValueKind::kName) {
    name_ = decode_string(text_.substr(token_begin_, end - token_begin_));
    if (!name_) return Step::kError;
  } else if (value_kind_ == ValueKind::kArgs) {
    args_end_ = end;
  }
  expect_ = Expect::kCommaOrEnd;
  value_kind_ = ValueKind::kOther;
  value_is_string_ = value_is_scalar_ = false;
  return Step::kMore;
}

}  // namespace strata::tool_calls
