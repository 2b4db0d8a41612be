// GET /health (answered on the I/O thread: it never waits behind the engine or the worker
// pool) and GET /metrics (Prometheus text: the engine's gauges from a consistent snapshot
// taken on the scheduler thread, the same figures under vLLM's names for the model-server
// protocol, and the HTTP layer's counters).
#include "server/routes.h"

namespace strata {
namespace {

// The engine's figures besides the cache's (those are written from the CacheState itself,
// Metrics::set_cache).
EngineGaugeValues engine_gauges(const EngineCounters& c, bool pd_enabled) {
  EngineGaugeValues g;
  g.scheduler_events = {{"retracted", c.requests_retracted},
                        {"preempted", c.requests_preempted},
                        {"restores_made_room", c.restores_made_room},
                        {"queued_holds_released", c.queued_holds_released},
                        {"forward_steps", c.forward_steps},
                        {"overlapped_steps", c.overlapped_steps},
                        {"prompt_logits_hits", c.prompt_logits_hits},
                        {"shared_prefill_waits", c.shared_prefill_waits}};
  g.prefill_budget_tokens = c.prefill_budget_tokens;
  if (pd_enabled) {
    g.pd_events = {{"rooms_ordered", c.pd_rooms_ordered},
                   {"rooms_done", c.pd_rooms_done},
                   {"pages_received", c.pd_pages_received},
                   {"bytes_received", c.pd_bytes_received},
                   {"orders_accepted", c.pd_orders_accepted},
                   {"orders_rejected", c.pd_orders_rejected},
                   {"orders_done", c.pd_orders_done},
                   {"orders_failed", c.pd_orders_failed},
                   {"pages_sent", c.pd_pages_sent},
                   {"bytes_sent", c.pd_bytes_sent},
                   {"stage_pages_copied", c.pd_stage_pages_copied},
                   {"stage_copy_faults", c.pd_stage_copy_faults}};
    for (size_t i = 0; i < kPdFallbacks; ++i) {
      g.pd_fallbacks.emplace_back(pd_fallback_name(static_cast<PdFallback>(i)), c.pd_fallbacks[i]);
    }
    g.pd_state = {{"rooms_active", c.pd_rooms_active},
                  {"quarantined_pages", c.pd_quarantined_pages},
                  {"peers_alive", c.pd_peers_alive}};
  }
  for (size_t i = 0; i < c.tool_sessions_by_state.size(); ++i) {
    g.tool_sessions.emplace_back(
        std::string(tool_session_state_name(static_cast<ToolSessionState>(i))),
        c.tool_sessions_by_state[i]);
  }
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
                 auto state = ctx.engine.cache().state().get();
                 if (!state) return error_response(state.error());
                 ctx.metrics.set_cache(*state);
                 ctx.metrics.set_engine(engine_gauges(state->engine, ctx.engine.pd_info().enabled));
                 ctx.metrics.set_vllm(vllm_gauge_values(*state, ctx.engine.block_hasher().algo()),
                                      ctx.options.model_name);
                 if (ctx.http_stats) ctx.metrics.set_http(ctx.http_stats());
                 ctx.metrics.set_conversations(ctx.conversations.stats());
                 ctx.metrics.set_stored_responses(ctx.responses.stats());
                 ctx.metrics.set_cache_events(ctx.cache_events.subscribers(),
                                              ctx.cache_events.dropped_subscribers());
                 return http::Response{.status = 200,
                                       .content_type = "text/plain; version=0.0.4",
                                       .body = ctx.metrics.serialize()};
               }));
}

}  // namespace strata
