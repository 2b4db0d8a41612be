#include "text/jinja/chat_template.h"

#include <string>
#include <utility>

#include "text/jinja/value_json.h"

namespace strata {
namespace {

constexpr std::string_view kReservedVariables[] = {"messages", "tools", "add_generation_prompt",
                                                   "bos_token", "eos_token"};

bool is_reserved(std::string_view name) {
  for (std::string_view r : kReservedVariables) {
    if (r == name) return true;
  }
  return false;
}

}  // namespace

Result<ChatTemplate> ChatTemplate::parse(std::string source) {
  Result<jinja::Template> t = jinja::Template::parse(std::move(source));
  if (!t) return std::unexpected(t.error());
  return ChatTemplate(std::move(*t));
}

Result<std::string> ChatTemplate::render_value(jinja::Value messages,
                                               const ChatRenderOptions& options,
                                               bool add_generation_prompt) const {
  if (!messages.is_array()) {
    return make_error(ErrorCode::kInvalidArgument, "messages must be a JSON array");
  }
  if (!options.extra_variables.is_object()) {
    return make_error(ErrorCode::kInvalidArgument,
                      "extra template variables must be a JSON object");
  }
  jinja::Object context;
  context.append_unique("messages", std::move(messages));
  context.append_unique("tools",
                        options.tools ? jinja::to_value(*options.tools) : jinja::Value::null());
  context.append_unique("add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
  if (options.bos_token)
    context.append_unique("bos_token", jinja::Value::string(*options.bos_token));
  if (options.eos_token)
    context.append_unique("eos_token", jinja::Value::string(*options.eos_token));
  for (auto it = options.extra_variables.begin(); it != options.extra_variables.end(); ++it) {
    if (is_reserved(it.key())) {
      return make_error(
          ErrorCode::kInvalidArgument,
          "extra template variable '" + it.key() + "' conflicts with a chat template argument");
    }
    context.append_unique(it.key(), jinja::to_value(it.value()));
  }
  return template_.render(context, jinja::TemplateRenderOptions{options.now});
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages,
                                         const ChatRenderOptions& options) const {
  return render_value(jinja::to_value(messages), options, options.add_generation_prompt);
}

Result<std::string> ChatTemplate::render(const nlohmann::json& messages,
                                         const ChatRenderOptions& options) const {
  return render_value(jinja::to_value(messages), options, options.add_generation_prompt);
}

Result<ChatContinuation> ChatTemplate::render_continuation(
    const nlohmann::ordered_json& conversation, size_t num_previous, std::string_view stop_text,
    const ChatRenderOptions& options) const {
  if (!conversation.is_array()) {
    return make_error(ErrorCode::kInvalidArgument, "messages must be a JSON array");
  }
  if (num_previous >= conversation.size()) {
    return make_error(
        ErrorCode::kInvalidArgument,
        "the conversation must contain the assistant turn after the previous messages");
  }
  if (stop_text.empty())
    return make_error(ErrorCode::kInvalidArgument, "stop_text must not be empty");

  nlohmann::ordered_json previous = nlohmann::ordered_json::array();
  for (size_t i = 0; i < num_previous; ++i) previous.push_back(conversation[i]);

  Result<std::string> prefix = render_value(jinja::to_value(previous), options, false);
  if (!prefix) return std::unexpected(prefix.error());
  Result<std::string> prompt = render_value(jinja::to_value(previous), options, true);
  if (!prompt) return std::unexpected(prompt.error());
  Result<std::string> full = render(conversation, options);
  if (!full) return std::unexpected(full.error());

  if (!prompt->starts_with(*prefix)) {
    return make_error(
        ErrorCode::kFailedPrecondition,
        "the generation prompt does not extend the rendering of the previous messages");
  }
  if (!full->starts_with(*prefix)) {
    return make_error(
        ErrorCode::kFailedPrecondition,
        "the template renders the previous messages differently when more messages follow; "
        "render the whole conversation");
  }
  const size_t stop = full->find(stop_text, prefix->size());
  if (stop == std::string::npos) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "the rendering of the assistant turn does not contain its stop text");
  }
  ChatContinuation result;
  result.continuation = full->substr(stop + stop_text.size());
  result.prefix = std::move(*prefix);
  return result;
}

}  // namespace strata
