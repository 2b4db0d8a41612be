#include "server/route_context.h"

#include <openssl/crypto.h>

#include <algorithm>
#include <optional>

#include "text/tool_calls/tool_request.h"

namespace strata {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

http::Handler blocking(BlockingHandler handler) {
  return [handler = std::move(handler)](http::Exchange& ex) -> boost::asio::awaitable<void> {
    http::Response r = co_await ex.offload([&] { return handler(ex.request()); });
    co_await ex.respond(std::move(r));
  };
}

bool authorized(const RouteContext& ctx, const http::Request& request) {
  const std::string& key = ctx.options.admin_api_key;
  if (key.empty()) return true;
  const std::string_view value = request.header("Authorization");
  // "Bearer" is a case-insensitive scheme (RFC 7235 §2.1); the key compares in constant time.
  constexpr std::string_view kScheme = "bearer ";
  if (value.size() != kScheme.size() + key.size() ||
      !http::iequals(value.substr(0, kScheme.size()), kScheme)) {
    return false;
  }
  return CRYPTO_memcmp(value.data() + kScheme.size(), key.data(), key.size()) == 0;
}

http::Handler admin_only(const RouteContext& ctx, http::Handler handler) {
  return [&ctx, handler = std::move(handler)](http::Exchange& ex) -> boost::asio::awaitable<void> {
    if (!authorized(ctx, ex.request())) {
      co_await ex.respond(error_response(
          401, "this endpoint needs 'Authorization: Bearer <admin key>'", "unauthenticated"));
      co_return;
    }
    co_await handler(ex);
  };
}

ChatRenderOptions RouteContext::render_options(const ojson* tools, bool add_generation_prompt,
                                               const ojson& template_kwargs) const {
  ChatRenderOptions o;
  if (tools != nullptr) o.tools = *tools;
  o.add_generation_prompt = add_generation_prompt;
  const SpecialTokenStrings& sp = tokenizer.special_token_strings();
  o.bos_token = sp.bos_token;
  o.eos_token = sp.eos_token;
  o.extra_variables = template_kwargs.is_object() ? template_kwargs : ojson::object();
  return o;
}

Result<std::vector<int32_t>> RouteContext::chat_tokens(
    const ojson& messages, const ojson* tools, bool add_generation_prompt,
    const ojson& template_kwargs, size_t max_tokens, const std::function<void()>& rendered) const {
  if (chat == nullptr) {
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
  auto text = chat->render(normalized ? *normalized : messages,
                           render_options(tools, add_generation_prompt, template_kwargs));
  if (!text) {
    return make_error(ErrorCode::kInvalidArgument, "chat template: " + text.error().message);
  }
  if (rendered) rendered();
  // The template writes the special tokens itself (as transformers' apply_chat_template).
  return tokenizer.encode(*text,
                          EncodeOptions{.add_special_tokens = false, .max_tokens = max_tokens});
}

}  // namespace strata
