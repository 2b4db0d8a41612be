#include "server/api_server.h"

#include <algorithm>

#include "server/routes.h"

namespace strata {

ApiServer::ApiServer(ServerOptions options, Engine& engine, const Tokenizer& tokenizer,
                     const ChatTemplate* chat, Metrics& metrics, CacheEventsStream& cache_events)
    : conversations_(static_cast<size_t>(std::max<int64_t>(options.max_sessions, 0)),
                     options.session_ttl_ms),
      responses_(static_cast<size_t>(std::max<int64_t>(options.max_stored_responses, 0)),
                 static_cast<size_t>(std::max<int64_t>(options.max_stored_response_bytes, 0))),
      ctx_{.options = std::move(options),
           .engine = engine,
           .tokenizer = tokenizer,
           .chat = chat,
           .metrics = metrics,
           .http_stats = {},
           .conversations = conversations_,
           .responses = responses_,
           .cache_events = cache_events},
      http_(ctx_.options.http) {
  ctx_.http_stats = [this] { return http_.stats(); };
  add_openai_routes(http_, ctx_);
  add_anthropic_routes(http_, ctx_);
  add_responses_routes(http_, ctx_);
  add_tokenizer_routes(http_, ctx_);
  add_cache_routes(http_, ctx_);
  add_session_routes(http_, ctx_);
  add_health_routes(http_, ctx_);
  add_worker_info_routes(http_, ctx_);
  add_cache_events_routes(http_, ctx_);
  add_dashboard_routes(http_, ctx_);
  // Counted by the route that took the request ("/v1/responses/*" for every id), and a path
  // no route takes as "unrouted": a client cannot add a label per path it makes up.
  http_.on_response([&metrics](const http::Request&, std::string_view route, int status) {
    metrics.requests(route.empty() ? "unrouted" : std::string(route), std::to_string(status))
        .Increment();
  });
}

Status ApiServer::bind() {
  return http_.bind();
}

}  // namespace strata
