// Strata's HTTP API: the async HTTP server (src/http) with every family of routes
// (routes.h) and the request metrics. A small object: the routes live in their own files.
#pragma once

#include <memory>

#include "common/result.h"
#include "http/server.h"
#include "server/route_context.h"

namespace strata {

class ApiServer {
 public:
  // `chat` may be null (a model without a chat template: chat endpoints answer 400).
  // `cache_events` is fed by the engine's KV event callback and must outlive the server.
  ApiServer(ServerOptions options, Engine& engine, const Tokenizer& tokenizer,
            const ChatTemplate* chat, Metrics& metrics, CacheEventsStream& cache_events);

  // Binds the port; fails with a clear message when it is taken or an option is invalid.
  Status bind();
  int port() const { return http_.port(); }
  // Starts serving on the HTTP threads; returns at once.
  void start() { http_.start(); }
  // Graceful stop: ends the /cache/events streams (they never finish by themselves),
  // then see http::Server::shutdown.
  void shutdown(double timeout_s) {
    ctx_.cache_events.close();
    http_.shutdown(timeout_s);
  }
  http::ServerStats http_stats() const { return http_.stats(); }

 private:
  ConversationRecords conversations_;
  ResponseStore responses_;
  RouteContext ctx_;
  http::Server http_;
};

}  // namespace strata
