// Tool calls out of a model's reply: the markup of one format (tool_call_format.h) turned
// into OpenAI's tool calls, whole or as the text streams in.
//
// Contract (every format):
// - A call is a function name and its arguments, the JSON object exactly as the model
//   wrote it (the bytes between its braces, included); a call without arguments gets "{}".
// - Content is the text outside the markup. Whitespace that only separates markup (before
//   the first call when nothing else precedes it, between and after calls) is dropped.
// - A call is *committed* once its name is complete (and, when `function_names` is given,
//   one of them): only then does a stream show it. Markup that fails before that (not
//   JSON, no name, an unknown function, cut off by the end of the reply) comes back as
//   content, from its opening marker to the end of the reply, and `malformed()` is true.
//   A committed call that fails later (its JSON turns out broken, or the reply ends
//   inside it) stays a call with what was sent; the rest of the reply is content; also
//   `malformed()`.
// - parse_tool_calls() is the stream's result on the whole reply, except that any
//   malformed markup makes the whole reply content (nothing was sent yet, so nothing has
//   to be kept).
// - Markers split across pushes at any byte are recognised; no prefix of a marker is ever
//   released as content while it may still become one.
//
// Thread: a parser belongs to one reply; distinct parsers are independent.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "text/tool_calls/tool_call_format.h"

namespace strata {

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object's text
};

// A piece of a call in a stream: its first piece has `id` and `name`; the concatenated
// `arguments` of its pieces are the call's arguments.
struct ToolCallDelta {
  size_t index = 0;  // the call's position in the reply, from 0
  std::string id;    // first piece only
  std::string name;  // first piece only
  std::string arguments;
};

// What a push releases, in reply order: content text, or a piece of a call.
struct ToolCallEvent {
  std::string content;
  std::optional<ToolCallDelta> call;
};

struct ToolCallParserOptions {
  ToolCallFormat format = ToolCallFormat::kNone;
  // The functions a call may name (the request's tools); empty: any name.
  std::vector<std::string> function_names;
  // The id of the call at `index`; unset: random ids ("call_" and 24 letters and digits;
  // 9 letters and digits for Mistral, whose templates require that).
  std::function<std::string(size_t index)> make_id;
};

class ToolCallStreamParser {
 public:
  explicit ToolCallStreamParser(ToolCallParserOptions options);
  ~ToolCallStreamParser();
  ToolCallStreamParser(ToolCallStreamParser&&) noexcept;
  ToolCallStreamParser& operator=(ToolCallStreamParser&&) noexcept;

  // Feeds the next piece of the reply (any split, UTF-8 sequences may be cut); returns
  // what may be shown now, consecutive content merged and a call's pieces merged.
  std::vector<ToolCallEvent> push(std::string_view text);
  // The end of the reply: releases what was held back.
  std::vector<ToolCallEvent> finish();

  // The calls completed so far (committed, closed), in order.
  const std::vector<ToolCall>& calls() const;
  // Calls committed so far (shown to a stream), the one in progress included.
  size_t num_committed() const;
  bool malformed() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct ParsedToolCalls {
  std::string content;
  std::vector<ToolCall> calls;
  bool malformed = false;  // markup was found but did not parse: all of `text` is content
};

ParsedToolCalls parse_tool_calls(std::string_view text, const ToolCallParserOptions& options);

// Merges a stream's events into the content and calls they spell.
ParsedToolCalls merge_tool_call_events(const std::vector<ToolCallEvent>& events);

// A fresh random call id for `format`.
std::string random_tool_call_id(ToolCallFormat format);

}  // namespace strata
