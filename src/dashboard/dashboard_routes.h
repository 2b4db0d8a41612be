// The dashboard's routes, the same on `strata serve` and `strata route` (docs/dashboard.md):
//   GET /dashboard, /dashboard/          the page (index.html)
//   GET /dashboard/<name>                an asset of assets.h, with its content type, an
//                                        ETag and Cache-Control: no-cache (304 when the
//                                        request's If-None-Match matches)
//   GET /dashboard/config                what the page needs to know of the server
// None is behind the admin key: the page asks the operator for the key and sends it on its
// own API calls; these reveal nothing secret. An unknown name is the server's 404 (routes
// are exact paths, one per asset, so no request names a file outside the table).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "http/message.h"
#include "http/server.h"

namespace strata::dashboard {

// GET /dashboard/config: {"mode", "auth_required", "model", "page_size", "version"}.
struct DashboardConfig {
  std::string mode;            // "worker" (strata serve) or "router" (strata route)
  bool auth_required = false;  // an admin key guards the cache API
  std::string model;           // the served model name
  int64_t page_size = 0;       // tokens per KV page (block); 0 when not known yet
};

// Adds the routes above. `config` is called for each /dashboard/config request on the
// HTTP worker pool; it must be thread-safe. Before the server starts.
void add_dashboard_routes(http::Server& server, std::function<DashboardConfig()> config);

// The answer for the asset `name` (200, 304 or 404), as the routes give it.
http::Response asset_response(const http::Request& request, std::string_view name);

}  // namespace strata::dashboard
