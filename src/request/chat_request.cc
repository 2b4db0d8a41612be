#include "request/chat_request.h"

#include "request/json_fields.h"

namespace strata {
namespace {

using ojson = nlohmann::ordered_json;

template <class Json>
Result<CompletionPrompt> completion_prompt(const Json& body) {
  const auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return bad_argument("'prompt' is required");
  CompletionPrompt out;
  if (it->is_string()) {
    const auto& text = it->template get_ref<const std::string&>();
    if (text.empty()) return bad_argument("'prompt' must not be empty");
    out.text = text;
    return out;
  }
  if (it->is_array()) {
    if (it->empty()) return bad_argument("'prompt' must not be empty");
    if (it->size() == 1 && (*it)[0].is_string()) {
      out.text = (*it)[0].template get_ref<const std::string&>();
      if (out.text->empty()) return bad_argument("'prompt' must not be empty");
      return out;
    }
    if ((*it)[0].is_array() || (*it)[0].is_string()) {
      return bad_argument(
          "'prompt' with several prompts is not supported: send one request per prompt");
    }
    auto ids = parse_token_ids(*it, "prompt");
    if (!ids) return std::unexpected(ids.error());
    out.token_ids = std::move(*ids);
    return out;
  }
  return bad_argument("'prompt' must be a string or an array of token ids");
}

}  // namespace

Result<CompletionPrompt> parse_completion_prompt(const nlohmann::json& body) {
  return completion_prompt(body);
}
Result<CompletionPrompt> parse_completion_prompt(const ojson& body) {
  return completion_prompt(body);
}

Result<MessagesInfo> validate_messages(const ojson& messages) {
  if (!messages.is_array()) return bad_argument("'messages' must be an array");
  if (messages.empty()) return bad_argument("'messages' must not be empty");
  MessagesInfo info;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto& m = messages[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return bad_argument(where + " must be an object");
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      return bad_argument(where + ".role must be a string");
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant" && r != "tool" && r != "developer") {
      return bad_argument(where + ".role '" + r +
                          "' is not one of system, developer, user, assistant, tool");
    }
    const auto content = m.find("content");
    if (content != m.end() && !content->is_null()) {
      if (content->is_array()) {
        for (const auto& part : *content) {
          if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
            return bad_argument(where + ".content parts must be objects with a 'type'");
          }
          if (part["type"] == "text" && (!part.contains("text") || !part["text"].is_string())) {
            return bad_argument(where + ".content text parts need a string 'text'");
          }
          if (part["type"] != "text") {
            return bad_argument(where + ".content part type '" + part["type"].get<std::string>() +
                                "' is not supported (text only)");
          }
        }
      } else if (!content->is_string()) {
        return bad_argument(where + ".content must be a string, an array of parts, or null");
      }
    } else if (r != "assistant") {
      return bad_argument(where + ".content is required for role '" + r + "'");
    }
    if (const auto tc = m.find("tool_calls"); tc != m.end() && !tc->is_null() && !tc->is_array()) {
      return bad_argument(where + ".tool_calls must be an array");
    }
    if (const auto cc = m.find("cache_control"); cc != m.end() && !cc->is_null()) {
      if (!cc->is_object()) return bad_argument(where + ".cache_control must be an object");
      auto type = get_string(*cc, "type");
      if (!type) return std::unexpected(type.error());
      if (!*type || **type != "pin")
        return bad_argument(where + ".cache_control.type must be \"pin\"");
      auto ttl = get_int(*cc, "ttl_s", 1, 365LL * 24 * 3600);
      if (!ttl) return std::unexpected(ttl.error());
      info.pin_through = static_cast<int32_t>(i);
      info.pin_ttl_s = ttl->value_or(0);
    }
  }
  return info;
}

Result<ChatRequest> read_chat_request(ojson& body, GenerationPrompt generation_prompt) {
  const auto messages = body.find("messages");
  if (messages == body.end()) return bad_argument("'messages' is required");
  auto info = validate_messages(*messages);
  if (!info) return std::unexpected(info.error());
  ChatRequest r;
  r.info = *info;
  r.messages = std::move(*messages);
  if (const auto tools = body.find("tools"); tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) return bad_argument("'tools' must be an array");
    r.tools = std::move(*tools);
    auto names = validate_tools(*r.tools);
    if (!names) return std::unexpected(names.error());
    r.function_names = std::move(*names);
  }
  if (auto st = validate_message_tool_calls(r.messages); !st) return std::unexpected(st.error());
  normalize_tool_call_messages(r.messages);
  const auto choice_it = body.find("tool_choice");
  auto choice =
      parse_tool_choice(choice_it == body.end() ? nullptr : &*choice_it, r.function_names);
  if (!choice) return std::unexpected(choice.error());
  r.tool_choice = std::move(*choice);
  if (auto par = get_bool(body, "parallel_tool_calls"); !par) return std::unexpected(par.error());
  // tool_choice "none": the template is rendered without the tools (as vLLM does).
  if (r.tool_choice.mode == ToolChoiceMode::kNone) r.tools.reset();
  if (const auto k = body.find("chat_template_kwargs"); k != body.end() && !k->is_null()) {
    if (!k->is_object()) return bad_argument("'chat_template_kwargs' must be an object");
    r.template_kwargs = std::move(*k);
  }
  if (generation_prompt != GenerationPrompt::kAlways) {
    auto add_gen = get_bool(body, "add_generation_prompt");
    if (!add_gen) return std::unexpected(add_gen.error());
    r.add_generation_prompt =
        add_gen->value_or(generation_prompt == GenerationPrompt::kFieldDefaultTrue);
  }
  return r;
}

}  // namespace strata
