// The router's HTTP routes for the APIs clients call: the generation APIs (POST
// /v1/chat/completions, /v1/completions, Anthropic's /v1/messages, OpenAI's /v1/responses),
// each a pipeline of stages (generation.h); GET and DELETE /v1/responses/{id}, to the worker
// that stored the response (response_holders.h); GET /v1/models, /tokenize, /detokenize and
// /v1/messages/count_tokens, to any worker as they are (docs/router.md). The replicas'
// shared session bindings (--session-store) are read and written here for the pipeline and
// the admin routes.
#include <algorithm>
#include <mutex>

#include "router/generation.h"
#include "router/response_holders.h"
#include "router/router_impl.h"

namespace strata::router {

using boost::asio::awaitable;

awaitable<SharedBinding> read_shared_binding(Router::Impl& r, http::Exchange& ex,
                                             const std::string& session) {
  SharedBinding out;
  if (!r.shared_sessions || session.empty()) co_return out;
  out.asked = true;
  auto found = co_await ex.offload([&] { return r.shared_sessions->lookup(session); });
  if (!found) co_return out;  // counted and logged by the store
  out.answered = true;
  out.url = std::move(*found);
  if (out.url) r.adopt_shared_binding(session, *out.url);
  co_return out;
}

awaitable<void> publish_shared_binding(Router::Impl& r, http::Exchange& ex,
                                       const std::string& session, const SharedBinding& before,
                                       const RouteChoice& c) {
  if (!before.asked || c.detour) co_return;
  const std::string& url = c.worker->url;
  if (!c.session_bound && !(before.answered && before.url != url)) co_return;
  const bool only_if_absent = !before.url;
  auto holds =
      co_await ex.offload([&] { return r.shared_sessions->bind(session, url, only_if_absent); });
  if (holds && *holds != url) r.adopt_shared_binding(session, *holds);
}

// Sends a request to any eligible worker as it is (round robin over them), answering with
// the worker's answer. Used for the endpoints whose answer does not depend on the worker.
awaitable<void> forward_any(Router::Impl& r, http::Exchange& ex) {
  const http::Request& req = ex.request();
  std::vector<std::shared_ptr<Worker>> ws;
  {
    std::lock_guard lock(r.mutex);
    const int64_t now = r.now_ms();
    for (const auto& [id, w] : r.workers) {
      if (r.eligible(*w, now)) ws.push_back(w);
    }
    if (!ws.empty())
      std::rotate(ws.begin(), ws.begin() + static_cast<std::ptrdiff_t>(r.round_robin++ % ws.size()),
                  ws.end());
  }
  std::string last_error = "no worker is joined and healthy";
  for (size_t i = 0; i < ws.size() && i < 3; ++i) {
    http::ClientRequest up = r.upstream_request(*ws[i], req.method, req.target, req.body, false);
    auto resp = co_await r.client.request(std::move(up));
    if (!resp) {
      last_error = ws[i]->url + ": " + resp.error().message;
      continue;
    }
    http::Response out{.status = resp->status,
                       .content_type = std::string(resp->header("content-type")),
                       .body = std::move(resp->body),
                       .headers = {{"x-strata-worker", ws[i]->url}}};
    if (out.content_type.empty()) out.content_type = "application/json";
    co_await ex.respond(std::move(out));
    co_return;
  }
  co_await ex.respond(router_error(503, last_error, "unavailable"));
}

void add_router_routes(http::Server& server, Router::Impl& r) {
  server.route("POST", "/v1/chat/completions", [&r](http::Exchange& ex) {
    return route_generation(r, ex, RoutedApi::kChatCompletions);
  });
  server.route("POST", "/v1/completions", [&r](http::Exchange& ex) {
    return route_generation(r, ex, RoutedApi::kCompletions);
  });
  server.route("POST", "/v1/messages", [&r](http::Exchange& ex) {
    return route_generation(r, ex, RoutedApi::kAnthropicMessages);
  });
  server.route("POST", "/v1/responses",
               [&r](http::Exchange& ex) { return route_generation(r, ex, RoutedApi::kResponses); });
  for (const char* method : {"GET", "DELETE"}) {
    server.route(method, "/v1/responses/*",
                 [&r](http::Exchange& ex) { return stored_response_route(r, ex); });
  }
  server.route("POST", "/v1/messages/count_tokens",
               [&r](http::Exchange& ex) { return forward_any(r, ex); });
  server.route("GET", "/v1/models", [&r](http::Exchange& ex) { return forward_any(r, ex); });
  server.route("POST", "/tokenize", [&r](http::Exchange& ex) { return forward_any(r, ex); });
  server.route("POST", "/detokenize", [&r](http::Exchange& ex) { return forward_any(r, ex); });
}

}  // namespace strata::router
