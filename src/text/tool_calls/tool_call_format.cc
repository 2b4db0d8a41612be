#include "text/tool_calls/tool_call_format.h"

#include <string>

namespace strata {

std::string_view tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kNone:
      return "none";
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kMistral:
      return "mistral";
  }
  return "none";
}

ToolCallFormat detect_tool_call_format(std::string_view chat_template) {
  // The most specific markers first: a Hermes template may mention JSON "parameters" too.
  if (chat_template.find("<tool_call>") != std::string_view::npos) return ToolCallFormat::kHermes;
  if (chat_template.find("[TOOL_CALLS]") != std::string_view::npos) {
    return ToolCallFormat::kMistral;
  }
  // Llama 3.1+ writes past calls as {"name": ..., "parameters": ...} and tool results
  // under the "ipython" role; <|python_tag|> marks its built-in tools.
  if (chat_template.find("<|python_tag|>") != std::string_view::npos ||
      (chat_template.find("ipython") != std::string_view::npos &&
       chat_template.find("\"parameters\"") != std::string_view::npos)) {
    return ToolCallFormat::kLlama3Json;
  }
  return ToolCallFormat::kNone;
}

Result<ToolCallFormat> resolve_tool_call_format(std::string_view name,
                                                std::string_view chat_template) {
  if (name == "auto") return detect_tool_call_format(chat_template);
  if (name == "hermes" || name == "qwen") return ToolCallFormat::kHermes;
  if (name == "llama3_json" || name == "llama3") return ToolCallFormat::kLlama3Json;
  if (name == "mistral") return ToolCallFormat::kMistral;
  if (name == "none") return ToolCallFormat::kNone;
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown tool-call parser '" + std::string(name) +
                        "' (auto, hermes, llama3_json, mistral, none)");
}

}  // namespace strata
