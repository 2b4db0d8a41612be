#include "server/route_context.h"

#include <openssl/crypto.h>

namespace strata {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

// The one table from an engine or request error to its HTTP status; the JSON error's
// "code" is error_code_name(). Anything not listed is a fault of ours: 500.
int http_status(ErrorCode code) {
  struct Row {
    ErrorCode code;
    int status;
  };
  static constexpr Row kTable[] = {
      {ErrorCode::kInvalidArgument, 400},     // bad input
      {ErrorCode::kResourceExhausted, 400},   // a prompt or body beyond a limit
      {ErrorCode::kUnsupported, 400},         // a format or feature we do not handle
      {ErrorCode::kOverBudget, 400},          // pin_budget_exceeded
      {ErrorCode::kUnauthenticated, 401},     // missing or wrong admin key
      {ErrorCode::kNotFound, 404},            // unknown session
      {ErrorCode::kFailedPrecondition, 409},  // wrong state for the call
      {ErrorCode::kStaleEpoch, 409},          // a tool_end for an older tool_start
      {ErrorCode::kBusy, 409},                // a request of the session still runs
      {ErrorCode::kNoHostTier, 409},          // needs --enable-hierarchical-cache
      {ErrorCode::kOutOfPages, 503},          // no room now (a restore): retry later
      {ErrorCode::kTimeout, 504},
  };
  for (const Row& row : kTable) {
    if (row.code == code) return row.status;
  }
  return 500;
}

http::Response json_response(int status, const json& body) {
  return http::Response{.status = status,
                        .body = body.dump(-1, ' ', false, json::error_handler_t::replace)};
}

http::Response error_response(int status, const std::string& message, const std::string& code) {
  const std::string type = status >= 500 ? "server_error" : "invalid_request_error";
  return json_response(status,
                       json{{"error", {{"message", message}, {"type", type}, {"code", code}}}});
}

http::Response error_response(const Error& e) {
  return error_response(http_status(e.code), e.message, std::string(error_code_name(e.code)));
}

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

Result<std::vector<int32_t>> RouteContext::chat_tokens(const ojson& messages, const ojson* tools,
                                                       bool add_generation_prompt,
                                                       const ojson& template_kwargs,
                                                       size_t max_tokens) const {
  if (chat == nullptr) {
    return make_error(ErrorCode::kInvalidArgument,
                      "this model has no chat template: use /v1/completions");
  }
  auto text = chat->render(messages, render_options(tools, add_generation_prompt, template_kwargs));
  if (!text) {
    return make_error(ErrorCode::kInvalidArgument, "chat template: " + text.error().message);
  }
  // The template writes the special tokens itself (as transformers' apply_chat_template).
  return tokenizer.encode(*text,
                          EncodeOptions{.add_special_tokens = false, .max_tokens = max_tokens});
}

}  // namespace strata
