// ChatTemplate: renders a model's Jinja `chat_template` for OpenAI-style messages, exactly as
// @huggingface/jinja 0.5.11 renders it (the template variables follow transformers'
// apply_chat_template: messages, tools, add_generation_prompt, bos_token, eos_token, plus
// extra keyword arguments such as enable_thinking).
//
// Messages are passed to the template as given: role, content (a string, null, or a list
// of parts), name, tool_call_id, reasoning_content, tool_calls with function.arguments as
// a JSON string or an object. Templates differ in what they expect: Qwen3's prints a string
// `arguments` verbatim and an object through tojson; Qwen2.5's, Llama 3.1's and Mistral's
// always apply tojson, so a string is printed as a quoted JSON string. Strata does not
// rewrite arguments (vLLM parses them into objects first); the caller decides.
//
// Thread-safety: a ChatTemplate is immutable; render from any number of threads.
#pragma once

#include <ctime>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "text/jinja/template.h"

namespace strata {

struct ChatRenderOptions {
  // `tools` in the template: the request's tool list. Unset renders `tools` as none
  // (transformers passes tools=None), which `{% if tools %}` and `tools is not none` treat
  // as "no tools".
  std::optional<nlohmann::ordered_json> tools;
  // Append the assistant header that opens the model's reply.
  bool add_generation_prompt = false;
  // The tokenizer's special tokens; unset ones are undefined in the template (Qwen3 has no
  // bos_token).
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  // Extra template variables (chat_template_kwargs), e.g. {"enable_thinking": false}. Must
  // be a JSON object; names must not collide with the variables above or with globals.
  nlohmann::ordered_json extra_variables = nlohmann::ordered_json::object();
  // Local time for strftime_now() (Llama 3.x's date line); the current local time when unset.
  std::optional<std::tm> now;
};

// The result of render_continuation (see there).
struct ChatContinuation {
  // render(previous messages, add_generation_prompt = false): the text before the assistant
  // turn. The session's stored prompt must start with it for the continuation to be exact.
  std::string prefix;
  // The text the template renders after the assistant turn's stop text: the rest of that
  // turn's rendering (e.g. "\n"), the new messages and the generation prompt.
  std::string continuation;
};

class ChatTemplate {
 public:
  // Parses a template (a tokenizer_config.json `chat_template`). Errors name the construct
  // and its line and column.
  static Result<ChatTemplate> parse(std::string source);

  // Renders `messages` (a JSON array). Keep member order by parsing requests into
  // nlohmann::ordered_json: tools are printed with tojson in the order the client sent.
  Result<std::string> render(const nlohmann::ordered_json& messages,
                             const ChatRenderOptions& options) const;
  // Same for nlohmann::json, whose objects sort their keys (so tojson output is sorted).
  Result<std::string> render(const nlohmann::json& messages,
                             const ChatRenderOptions& options) const;

  // Multi-turn prefix reuse. A session holds the exact tokens of its last prompt
  // (rendered from the first `num_previous` messages with add_generation_prompt = true)
  // followed by the tokens the model generated, ending with the stop token whose text is
  // `stop_text` (e.g. "<|im_end|>"). `conversation` is the next request: those previous
  // messages, the assistant turn as the client echoes it, then new messages.
  //
  // Re-rendering `conversation` does not reproduce the session's tokens when the template
  // renders a past assistant turn differently from what was generated (Qwen3 drops the
  // <think> block of earlier turns), which would defeat prefix caching. Instead the server
  // appends `continuation` to its stored tokens. The result is exact in this sense: with
  // full = render(conversation, options),
  //   full == prefix + <the template's rendering of the assistant turn, through stop_text>
  //           + continuation,
  // so everything outside the assistant turn is byte-identical to a full render, and the
  // assistant turn is what the model actually generated.
  //
  // Fails with kFailedPrecondition when that decomposition does not exist: the template
  // renders the earlier messages differently once more messages follow (e.g. Mistral
  // moves [AVAILABLE_TOOLS] to the last user message), or the assistant turn's rendering
  // does not contain `stop_text`. The server must then render the whole conversation.
  // Also fails if the assistant's generation ended without its stop token (a length
  // cut-off): the caller should not use this then.
  Result<ChatContinuation> render_continuation(const nlohmann::ordered_json& conversation,
                                               size_t num_previous, std::string_view stop_text,
                                               const ChatRenderOptions& options) const;

  const std::string& source() const { return template_.source(); }

 private:
  explicit ChatTemplate(jinja::Template t) : template_(std::move(t)) {}

  Result<std::string> render_value(jinja::Value messages, const ChatRenderOptions& options,
                                   bool add_generation_prompt) const;

  jinja::Template template_;
};

}  // namespace strata
