// The tool-call formats of the model families Strata serves, and how one is chosen
// (`strata serve --tool-call-parser NAME`).
//
//   hermes       Hermes 2 Pro, Qwen 2.5, Qwen 3: `<tool_call>{"name", "arguments"}</tool_call>`,
//                one block per call, several per reply.
//   llama3_json  Llama 3.1 to 3.3: a reply that is `{"name", "parameters"}` (or
//                "arguments"), optionally after `<|python_tag|>`, several joined by `;`.
//   mistral      Mistral v0.3 and later: `[TOOL_CALLS]` then a JSON array of
//                {"name", "arguments"} (or one object), or the newer `name[ARGS]{...}`.
//   none         no parsing: tool calls come back as text.
//
// `auto` reads the model's chat template: the markup it writes for past calls names the
// format (docs/function-calling.md).
#pragma once

#include <string_view>

#include "common/result.h"

namespace strata {

enum class ToolCallFormat { kNone, kHermes, kLlama3Json, kMistral };

std::string_view tool_call_format_name(ToolCallFormat format);

// The format a chat template writes tool calls in; kNone when it shows none of the known
// markups (or there is no template).
ToolCallFormat detect_tool_call_format(std::string_view chat_template);

// `name` is one of auto, hermes (alias qwen), llama3_json (alias llama3), mistral, none;
// auto is resolved with `chat_template` (empty: none). kInvalidArgument otherwise, naming
// the accepted values.
Result<ToolCallFormat> resolve_tool_call_format(std::string_view name,
                                                std::string_view chat_template);

}  // namespace strata
