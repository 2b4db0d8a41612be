// GET /health (answered on the I/O thread: it never waits behind the engine or the worker
// pool) and GET /metrics (Prometheus text: the engine's gauges from a consistent snapshot
// taken on the scheduler thread, and the HTTP layer's counters).
#include "server/routes.h"

namespace strata {
namespace {

CacheGaugeValues cache_gauges(EngineState& s) {
  CacheGaugeValues g;
  const TreeStats t = s.tree.stats();
  g.pages_total = s.device_pages.num_pages();
  g.pages_free = s.device_pages.num_free();
  g.pages_used = s.device_pages.num_allocated();
  g.pages_cached = t.cached_pages;
  g.pages_pinned = t.pinned_blocks;
  g.pages_protected = t.protected_pages;
  g.pages_evictable = t.cached_pages - t.protected_pages;
  g.running = s.counters.running;
  g.waiting = s.counters.waiting;
  g.evicted_pages_total = t.evicted_pages_total;
  g.auto_unpinned_blocks_total = s.counters.auto_unpinned_blocks;
  g.expired_pins_total = t.expired_pins_total;
  if (s.host_pages != nullptr) {
    g.host_pages = {{"total", s.host_pages->num_pages()},  {"free", s.host_pages->num_free()},
                    {"cached", t.host_cached_pages},       {"host_only", t.host_only_pages},
                    {"protected", t.host_protected_pages}, {"evictable", t.host_evictable_pages}};
  }
  const EngineCounters& c = s.counters;
  g.tier_events = {{"demoted_pages", t.demoted_pages_total},
                   {"backed_up_pages", t.backed_up_pages_total},
                   {"loaded_pages", t.loaded_pages_total},
                   {"host_evicted_pages", t.host_evicted_pages_total},
                   {"cached_host_tokens", c.cached_host_tokens},
                   {"cached_storage_tokens", c.cached_storage_tokens},
                   {"storage_pages_written", c.storage_pages_written},
                   {"storage_faults", c.storage_faults},
                   {"prefetch_pages_read", c.prefetch_pages_read},
                   {"prefetch_timeouts", c.prefetch_timeouts},
                   {"tool_sessions_expired", c.tool_sessions_expired}};
  return g;
}

}  // namespace

void add_health_routes(http::Server& server, RouteContext& ctx) {
  server.route("GET", "/health", [](http::Exchange& ex) -> boost::asio::awaitable<void> {
    // (Built outside the co_await: g++ 12 miscompiles initializer lists inside one.)
    http::Response ok = json_response(200, nlohmann::json{{"status", "ok"}});
    co_await ex.respond(std::move(ok));
  });
  server.route("GET", "/metrics", blocking([&ctx](const http::Request&) {
                 ctx.metrics.set_cache(ctx.engine.call(cache_gauges).get());
                 if (ctx.http_stats) ctx.metrics.set_http(ctx.http_stats());
                 return http::Response{.status = 200,
                                       .content_type = "text/plain; version=0.0.4",
                                       .body = ctx.metrics.serialize()};
               }));
}

}  // namespace strata
