#include "dashboard/dashboard_routes.h"

#include <nlohmann/json.hpp>

#include <utility>

#include "dashboard/assets.h"

namespace strata::dashboard {

using nlohmann::json;

http::Response asset_response(const http::Request& request, std::string_view name) {
  std::optional<Asset> asset = find_asset(name);
  if (!asset) {
    json body{{"error",
               {{"message", "no dashboard asset '" + std::string(name) + "'"},
                {"type", "invalid_request_error"},
                {"code", "not_found"}}}};
    return http::Response{.status = 404, .body = body.dump()};
  }
  // no-cache: the browser revalidates each time (a cheap 304), so a rebuilt server's page
  // is never mixed with a stale script.
  http::Headers headers{
      {"ETag", asset->etag}, {"Cache-Control", "no-cache"}, {"X-Content-Type-Options", "nosniff"}};
  if (etag_matches(request.header("If-None-Match"), asset->etag)) {
    return http::Response{.status = 304,
                          .content_type = std::move(asset->content_type),
                          .body = {},
                          .headers = std::move(headers)};
  }
  return http::Response{.status = 200,
                        .content_type = std::move(asset->content_type),
                        .body = std::move(asset->body),
                        .headers = std::move(headers)};
}

void add_dashboard_routes(http::Server& server, std::function<DashboardConfig()> config) {
  auto serve = [](std::string name) -> http::Handler {
    return [name = std::move(name)](http::Exchange& ex) -> boost::asio::awaitable<void> {
      // A file read with STRATA_DASHBOARD_DIR, a copy of d3 otherwise: off the I/O thread.
      http::Response r = co_await ex.offload([&] { return asset_response(ex.request(), name); });
      co_await ex.respond(std::move(r));
    };
  };
  server.route("GET", "/dashboard", serve("index.html"));
  server.route("GET", "/dashboard/", serve("index.html"));
  for (const std::string& name : asset_names())
    server.route("GET", "/dashboard/" + name, serve(name));
  server.route("GET", "/dashboard/config",
               [config = std::move(config)](http::Exchange& ex) -> boost::asio::awaitable<void> {
                 const DashboardConfig c = co_await ex.offload([&] { return config(); });
                 const json body{{"mode", c.mode},
                                 {"auth_required", c.auth_required},
                                 {"model", c.model},
                                 {"page_size", c.page_size},
                                 {"version", strata_version()}};
                 http::Response r{.status = 200, .body = body.dump()};
                 co_await ex.respond(std::move(r));
               });
}

}  // namespace strata::dashboard
