#include "request/prompt_reader.h"

#include <algorithm>

#include "request/json_fields.h"

namespace strata {

using ojson = nlohmann::ordered_json;

namespace {

bool is_role(const ojson& m, std::string_view role) {
  if (!m.is_object()) return false;
  const auto r = m.find("role");
  return r != m.end() && r->is_string() && r->get_ref<const std::string&>() == role;
}

// A system message after the first non-system message.
bool has_late_system_message(const ojson& messages) {
  if (!messages.is_array()) return false;
  bool leading = true;
  for (const ojson& m : messages) {
    const bool system = is_role(m, "system") || is_role(m, "developer");
    if (!system) leading = false;
    if (system && !leading) return true;
  }
  return false;
}

// A message's content as text (text parts joined with a newline).
std::string content_text(const ojson& m) {
  const auto c = m.find("content");
  if (c == m.end() || c->is_null()) return "";
  if (c->is_string()) return c->get<std::string>();
  std::string out;
  if (c->is_array()) {
    for (const ojson& part : *c) {
      if (!part.is_object() || !part.contains("text") || !part["text"].is_string()) continue;
      if (!out.empty()) out += "\n";
      out += part["text"].get<std::string>();
    }
  }
  return out;
}

}  // namespace

ojson merge_late_system_messages(const ojson& messages) {
  if (!messages.is_array()) return messages;
  ojson out = ojson::array();
  std::string pending;  // late system text waiting for the next user message
  bool leading = true;
  auto append = [](ojson& user, const std::string& text) {
    const std::string own = content_text(user);
    user["content"] = own.empty() ? text : own + "\n\n" + text;
  };
  for (const ojson& m : messages) {
    const bool system = is_role(m, "system") || is_role(m, "developer");
    if (!system) leading = false;
    if (system && leading) {
      out.push_back(m);
    } else if (system && pending.empty() && !out.empty() && is_role(out.back(), "user")) {
      append(out.back(), content_text(m));  // right after a user message: it joins it
    } else if (system) {
      if (!pending.empty()) pending += "\n\n";
      pending += content_text(m);
    } else if (is_role(m, "user") && !pending.empty()) {
      ojson merged = m;
      const std::string user = content_text(m);
      merged["content"] = user.empty() ? pending : pending + "\n\n" + user;
      pending.clear();
      out.push_back(std::move(merged));
    } else {
      out.push_back(m);
    }
  }
  if (!pending.empty()) out.push_back(ojson{{"role", "user"}, {"content", pending}});
  return out;
}

ChatRenderOptions PromptReader::render_options(const ojson* tools, bool add_generation_prompt,
                                               const ojson& template_kwargs) const {
  ChatRenderOptions o;
  if (tools != nullptr) o.tools = *tools;
  o.add_generation_prompt = add_generation_prompt;
  const SpecialTokenStrings& sp = tokenizer_.special_token_strings();
  o.bos_token = sp.bos_token;
  o.eos_token = sp.eos_token;
  o.extra_variables = template_kwargs.is_object() ? template_kwargs : ojson::object();
  return o;
}

Result<std::vector<int32_t>> PromptReader::chat_tokens(
    const ojson& messages, const ojson* tools, bool add_generation_prompt,
    const ojson& template_kwargs, size_t max_tokens, const std::function<void()>& rendered) const {
  if (chat_ == nullptr) {
    return make_error(ErrorCode::kInvalidArgument,
                      "this model has no chat template: use /v1/completions");
  }
  // As vLLM: arguments sent as a JSON string are rendered as their object (a copy only
  // when there is one to convert).
  std::optional<ojson> normalized;
  if (messages.is_array() && std::any_of(messages.begin(), messages.end(), [](const ojson& m) {
        return m.is_object() && m.contains("tool_calls");
      })) {
    normalized = messages;
    if (!normalize_tool_call_messages(*normalized)) normalized.reset();
  }
  const ojson& as_given = normalized ? *normalized : messages;
  const ChatRenderOptions options = render_options(tools, add_generation_prompt, template_kwargs);
  auto text = chat_->render(as_given, options);
  if (!text && has_late_system_message(as_given)) {
    if (auto merged = chat_->render(merge_late_system_messages(as_given), options)) {
      text = std::move(merged);
    }
  }
  if (!text) {
    return make_error(ErrorCode::kInvalidArgument, "chat template: " + text.error().message);
  }
  if (rendered) rendered();
  return tokenizer_.encode(*text,
                           EncodeOptions{.add_special_tokens = false, .max_tokens = max_tokens});
}

Result<std::vector<int32_t>> PromptReader::chat_tokens(
    const ChatRequest& request, size_t max_tokens, const std::function<void()>& rendered) const {
  return chat_tokens(request.messages, request.tools ? &*request.tools : nullptr,
                     request.add_generation_prompt, request.template_kwargs, max_tokens, rendered);
}

Result<std::vector<int32_t>> PromptReader::text_tokens(std::string_view text,
                                                       bool add_special_tokens,
                                                       size_t max_tokens) const {
  return tokenizer_.encode(
      text, EncodeOptions{.add_special_tokens = add_special_tokens, .max_tokens = max_tokens});
}

std::vector<BlockHash> CacheTarget::hashes(int page_size) const {
  if (block_hashes) return *block_hashes;
  if (page_size < 1) return {};
  return hasher.hash_blocks(tokens, page_size, cache_salt);
}

Result<CacheTarget> read_cache_target(ojson body, const PromptReader& reader) {
  CacheTarget t;
  t.hasher = reader.block_hasher();
  auto salt = get_string(body, "cache_salt");
  if (!salt) return std::unexpected(salt.error());
  t.cache_salt = salt->value_or("");
  const int forms = static_cast<int>(body.contains("block_hashes")) +
                    static_cast<int>(body.contains("token_ids")) +
                    static_cast<int>(body.contains("messages"));
  if (forms != 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      "give exactly one of 'block_hashes', 'token_ids' or 'messages'");
  }
  if (body.contains("block_hashes")) {
    auto hashes = parse_block_hashes(body["block_hashes"]);
    if (!hashes) return std::unexpected(hashes.error());
    t.block_hashes = std::move(*hashes);
    return t;
  }
  if (body.contains("token_ids")) {
    auto ids = parse_token_ids(body["token_ids"], "token_ids");
    if (!ids) return std::unexpected(ids.error());
    t.tokens = std::move(*ids);
    return t;
  }
  auto chat = read_chat_request(body, GenerationPrompt::kFieldDefaultFalse);
  if (!chat) return std::unexpected(chat.error());
  auto ids = reader.chat_tokens(*chat);
  if (!ids) return std::unexpected(ids.error());
  t.tokens = std::move(*ids);
  return t;
}

}  // namespace strata
