// The cache dashboard on the router (`strata route`, docs/dashboard.md): the page and its
// assets (dashboard/dashboard_routes.h, mode "router"), and one route the page needs to
// draw a worker's tree:
//   GET /workers/cache_state?url=WORKER_URL[&detail=tree]
// behind the admin key when one is set: that registered worker's /cache/state, fetched
// with the router's worker key (as the /cache/* relays do) and answered as the worker
// sent it. 400 without url (or a bad detail), 404 for a URL that is not a registered
// worker, 502 when the worker does not answer or answers with an error.
// The rest of the page reads the router's /workers and /metrics.
#include "dashboard/dashboard_routes.h"
#include "router/router_impl.h"

namespace strata::router {
namespace {

using boost::asio::awaitable;

awaitable<void> worker_cache_state(Router::Impl& r, http::Exchange& ex) {
  const http::Request& req = ex.request();
  const std::string url = req.query_param("url");
  const std::string detail = req.query_param("detail");
  if (url.empty() || (!detail.empty() && detail != "tree")) {
    co_await ex.respond(router_error(
        400, "GET /workers/cache_state?url=WORKER_URL[&detail=tree] (a worker of GET /workers)",
        "invalid_argument"));
    co_return;
  }
  const std::shared_ptr<Worker> w = r.find_worker(url);
  if (!w) {
    co_await ex.respond(router_error(404, "no registered worker " + url, "not_found"));
    co_return;
  }
  const std::string target = detail.empty() ? "/cache/state" : "/cache/state?detail=tree";
  auto resp = co_await r.client.request(r.upstream_request(*w, "GET", target, "", true));
  if (!resp) {
    co_await ex.respond(router_error(
        502, "worker " + w->url + " did not answer: " + resp.error().message, "unavailable"));
    co_return;
  }
  if (resp->status != 200) {
    co_await ex.respond(router_error(
        502, "worker " + w->url + " answered " + std::to_string(resp->status) + ": " + resp->body,
        "upstream_error"));
    co_return;
  }
  // As the worker sent it: its 64-bit block hashes keep every digit.
  http::Response out{.status = 200,
                     .content_type = "application/json",
                     .body = std::move(resp->body),
                     .headers = {{"x-strata-worker", w->url}}};
  co_await ex.respond(std::move(out));
}

}  // namespace

void add_router_dashboard_routes(http::Server& server, Router::Impl& r) {
  dashboard::add_dashboard_routes(server, [&r] {
    // The block size of the joined workers (they share one to be routed by cache).
    int64_t page_size = 0;
    {
      std::lock_guard lock(r.mutex);
      for (const auto& [id, w] : r.workers) {
        if (w->joined && w->block_size > 0) {
          page_size = w->block_size;
          break;
        }
      }
    }
    return dashboard::DashboardConfig{.mode = "router",
                                      .auth_required = !r.options.admin_api_key.empty(),
                                      .model = r.model_name,
                                      .page_size = page_size};
  });
  server.route("GET", "/workers/cache_state", [&r](http::Exchange& ex) -> awaitable<void> {
    if (!router_authorized(r, ex.request())) {
      co_await ex.respond(router_error(
          401, "this endpoint needs 'Authorization: Bearer <admin key>'", "unauthenticated"));
      co_return;
    }
    co_await worker_cache_state(r, ex);
  });
}

}  // namespace strata::router
