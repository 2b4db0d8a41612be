// Reads one tool call's JSON a byte at a time, as it is generated: where its name and its
// arguments are, before the object is complete. Internal to the tool-call parser.
//
// Only the structure is checked here (brackets, strings, the keys of the call object);
// the parser validates the complete text with a JSON parser.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace strata::tool_calls {

class CallScanner {
 public:
  enum class Mode {
    kCallObject,  // {"name": "f", "arguments": {...}} ("parameters" also names them)
    kArgsOnly,    // the arguments object alone (Mistral's name[ARGS]{...})
  };
  enum class Step { kMore, kDone, kError };

  explicit CallScanner(Mode mode) : mode_(mode) {}

  // Appends one byte of the call; kDone on the byte that closes the object, kError when
  // the text can no longer be a call (then the scanner must not be fed again).
  Step feed(char c);

  const std::string& text() const { return text_; }
  // The decoded name once its string is complete (kCallObject).
  const std::optional<std::string>& name() const { return name_; }
  // Offsets in text() of the arguments object: begin once it opened, end (exclusive) once
  // it closed; nullopt before.
  std::optional<size_t> args_begin() const { return args_begin_; }
  std::optional<size_t> args_end() const { return args_end_; }

 private:
  enum class Expect { kKey, kColon, kValue, kInValue, kCommaOrEnd };
  enum class ValueKind { kOther, kName, kArgs };
  Step on_top_level(char c);
  Step end_value();

  Mode mode_;
  std::string text_;
  std::vector<char> stack_;  // open brackets
  bool in_string_ = false;
  bool escape_ = false;
  Expect expect_ = Expect::kKey;
  size_t token_begin_ = 0;  // the current key's or value's first byte
  bool value_is_string_ = false;
  bool value_is_scalar_ = false;
  ValueKind value_kind_ = ValueKind::kOther;
  std::string key_;
  bool need_key_ = false;  // after a comma
  std::optional<std::string> name_;
  std::optional<size_t> args_begin_, args_end_;
};

}  // namespace strata::tool_calls
