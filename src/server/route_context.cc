#include "server/route_context.h"

#include <openssl/crypto.h>

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

bool authorized_anthropic(const RouteContext& ctx, const http::Request& request) {
  if (authorized(ctx, request)) return true;
  const std::string& key = ctx.options.admin_api_key;
  const std::string_view value = request.header("x-api-key");
  return value.size() == key.size() && CRYPTO_memcmp(value.data(), key.data(), key.size()) == 0;
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

}  // namespace strata
