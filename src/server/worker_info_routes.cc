// GET /server_info and GET /load: what a router (strata route, docs/router.md) reads of a
// worker. /server_info once when the worker joins (model, page size, the KV event sockets
// to subscribe to, capacities, role); /load every few hundred milliseconds (running and
// waiting requests, free and evictable pages, whether the worker is saturated and how long
// to hold traffic back), each with the process's instance_id. Both are public like /health: they
// carry no cached content.
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>

#include "server/routes.h"

namespace strata {
namespace {

using nlohmann::json;

// "tcp://*:5557" or "tcp://0.0.0.0:5557" as the router can connect to it: the wildcard
// becomes the host the router reached this server on (its Host header, port dropped).
std::string connectable(const std::string& endpoint, const http::Request& req) {
  const size_t scheme = endpoint.find("://");
  if (scheme == std::string::npos) return endpoint;
  const size_t host_start = scheme + 3;
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon < host_start) return endpoint;
  const std::string host = endpoint.substr(host_start, colon - host_start);
  if (host != "*" && host != "0.0.0.0" && host != "[::]" && host != "::") return endpoint;
  std::string seen(req.header("host"));
  if (seen.empty()) return endpoint.substr(0, host_start) + "127.0.0.1" + endpoint.substr(colon);
  if (seen.front() == '[') {
    seen = seen.substr(0, seen.find(']') + 1);
  } else if (const size_t c = seen.rfind(':'); c != std::string::npos) {
    seen.resize(c);
  }
  return endpoint.substr(0, host_start) + seen + endpoint.substr(colon);
}

// This process's identity: random, drawn once at start-up. A router that sees it change
// knows the worker restarted (its cache and pins are gone) even if no event told it.
const std::string& instance_id() {
  static const std::string id = [] {
    std::random_device rd;
    char buf[33];
    std::snprintf(buf, sizeof buf, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
    return std::string(buf);
  }();
  return id;
}

json server_info(RouteContext& ctx, const http::Request& req, const CacheState& s) {
  const EngineOptions& eo = ctx.engine.options();
  json kv_events = nullptr;
  if (!ctx.options.kv_events_endpoint.empty()) {
    kv_events = {
        {"endpoint", connectable(ctx.options.kv_events_endpoint, req)},
        {"replay_endpoint", ctx.options.kv_events_replay_endpoint.empty()
                                ? json(nullptr)
                                : json(connectable(ctx.options.kv_events_replay_endpoint, req))},
        {"format", "vllm"}};
  }
  json host = nullptr;
  if (s.host) {
    host = {{"capacity_pages", s.host->pool.capacity_pages},
            {"capacity_tokens", s.host->pool.capacity_pages * s.tree.page_size}};
  }
  json storage = nullptr;
  if (s.storage) storage = {{"backend", s.storage->backend}};
  const PdInfo pd_info = ctx.engine.pd_info();
  json pd = nullptr;
  if (pd_info.enabled) {
    pd = {
        {"worker_id", pd_info.worker_id},
        {"endpoint", pd_info.endpoint.empty() ? std::string() : connectable(pd_info.endpoint, req)},
        {"transport", pd_info.transport},
        {"peers_alive", pd_info.peers_alive}};
  }
  return json{
      {"engine", "strata"},
      {"instance_id", instance_id()},
      {"model", ctx.options.model_name},
      {"role", worker_role_name(pd_info.role)},
      {"pd", pd},
      {"page_size", s.tree.page_size},
      {"kv_cache_dtype", s.kv_dtype},
      {"block_hash_algo", block_hash_algo_name(ctx.engine.options().prefix_caching_hash_algo)},
      {"max_model_len", ctx.engine.model_config().max_position_embeddings},
      {"max_prompt_tokens", ctx.options.max_prompt_tokens},
      {"max_running_requests", eo.max_running_requests},
      {"kv_events", kv_events},
      {"device",
       {{"capacity_pages", s.device.capacity_pages},
        {"capacity_tokens", s.device.capacity_pages * s.tree.page_size},
        {"page_bytes", s.device.page_bytes}}},
      {"host", host},
      {"storage", storage},
      {"admin_key_required", !ctx.options.admin_api_key.empty()}};
}

// The load a router combines with its own accounting (docs/router.md, "Load"), from the
// gauges the scheduler publishes after every iteration (no wait on the engine):
//   batch    = running / max_running_requests
//   memory   = (used device pages that cannot be reclaimed
//               + pages computed again lately after eviction for room removed them) / capacity
//   load_fraction = max(batch, memory) + waiting / max_running_requests
// The recomputed pages (about those of the last ten seconds, RadixTree::
// recomputed_pages_recent) are what the pool lacked for its working set: a worker whose
// cache holds the KV of sessions waiting on tools has it all evictable, yet evicting it
// means computing it again when they come back (the seed's Q1, eviction storms). Counted as
// memory in use, they make a router send new work elsewhere before the storm grows.
// The worker is saturated when requests wait and the batch or the pool is full
// (load_fraction >= 1); recommended_pause_ms is then how long a router should hold new
// work back: 200 ms per waiting batch, bounded to [50, 2000] ms.
json load_json(RouteContext& ctx) {
  const EngineOptions& eo = ctx.engine.options();
  const EngineCounters c = ctx.engine.counters();
  const double max_running = std::max<double>(1, eo.max_running_requests);
  const int64_t cap = std::max<int64_t>(1, ctx.engine.num_pages());
  const int64_t reclaimable = c.free_pages + c.evictable_pages;
  const double batch = static_cast<double>(c.running) / max_running;
  const double memory =
      static_cast<double>(std::max<int64_t>(0, cap - reclaimable) + c.recomputed_pages_recent) /
      static_cast<double>(cap);
  const double fraction = std::max(batch, memory) + static_cast<double>(c.waiting) / max_running;
  const bool saturated = c.waiting > 0 && fraction >= 1.0;
  int64_t pause_ms = 0;
  if (saturated) {
    const double batches = static_cast<double>(c.waiting) / max_running;
    pause_ms = std::clamp<int64_t>(static_cast<int64_t>(200.0 * batches), 50, 2000);
  }
  return json{{"instance_id", instance_id()},
              {"running", c.running},
              {"waiting", c.waiting},
              {"max_running_requests", eo.max_running_requests},
              {"queued_prefill_tokens", c.queued_prefill_tokens},
              {"page_size", eo.page_size},
              {"device",
               {{"total_pages", cap},
                {"free_pages", c.free_pages},
                {"evictable_pages", c.evictable_pages},
                {"recomputed_pages_recent", c.recomputed_pages_recent}}},
              {"prefill_budget_tokens", c.prefill_budget_tokens},
              {"kv_events_next_seq", ctx.cache_events.next_seq()},
              {"load_fraction", fraction},
              {"saturated", saturated},
              {"recommended_pause_ms", pause_ms}};
}

}  // namespace

void add_worker_info_routes(http::Server& server, RouteContext& ctx) {
  server.route("GET", "/server_info", blocking([&ctx](const http::Request& req) {
                 auto state = ctx.engine.cache().state().get();
                 if (!state) return error_response(state.error());
                 return json_response(200, server_info(ctx, req, *state));
               }));
  // Answered on the I/O thread: a router polls it and must not wait behind the engine.
  server.route("GET", "/load", [&ctx](http::Exchange& ex) -> boost::asio::awaitable<void> {
    http::Response r = json_response(200, load_json(ctx));
    co_await ex.respond(std::move(r));
  });
}

}  // namespace strata
