// The request side of function calling: `tools` checked against OpenAI's schema,
// `tool_choice`, whether a reply complies with it, and the past calls of a conversation
// prepared for the chat template.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "common/result.h"
#include "text/tool_calls/tool_call_parser.h"

namespace strata {

// `tools`: an array of {"type": "function", "function": {"name", "description"?,
// "parameters"?, "strict"?}}; names match ^[a-zA-Z0-9_-]{1,64}$ and are distinct,
// parameters is a JSON Schema object. Returns the function names in order;
// kInvalidArgument naming the first bad field (tools[2].function.name ...).
Result<std::vector<std::string>> validate_tools(const nlohmann::ordered_json& tools);

enum class ToolChoiceMode {
  kNone,      // no tools in the prompt, no parsing: the reply is text
  kAuto,      // the model decides
  kRequired,  // the reply must call at least one tool
  kFunction,  // the reply must call `function`, and only it
};

struct ToolChoice {
  ToolChoiceMode mode = ToolChoiceMode::kAuto;
  std::string function;  // kFunction
};

// `choice`: "none" | "auto" | "required" | {"type": "function", "function": {"name"}}
// (null or absent: auto with tools, none without). `function_names` are the request's
// tools; required and a named function need tools, and the name must be one of them.
Result<ToolChoice> parse_tool_choice(const nlohmann::ordered_json* choice,
                                     const std::vector<std::string>& function_names);

// Whether a reply's calls satisfy `choice`: kFailedPrecondition with a message for the
// client when tool_choice asked for a call the reply did not make.
Status check_tool_choice(const ToolChoice& choice, const std::vector<ToolCall>& calls);

// Checks the tool_calls of assistant messages: each an object with a "function" holding a
// string "name" and "arguments" as a string or an object; "id" a string when present.
Status validate_message_tool_calls(const nlohmann::ordered_json& messages);

// As vLLM does before rendering: tool_calls[].function.arguments given as a JSON string
// (as OpenAI clients send them) become the object they encode, so that templates that
// print `arguments | tojson` show the object rather than a quoted string (strings that are
// not a JSON object stay as they are); and an assistant message with tool_calls whose
// content is null or absent (as OpenAI clients echo it) gets "" (Qwen3's template fails on
// a null content). Returns whether anything changed.
bool normalize_tool_call_messages(nlohmann::ordered_json& messages);

}  // namespace strata
