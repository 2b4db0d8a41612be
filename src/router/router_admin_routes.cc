// The router's own endpoints and the cache control it relays (docs/router.md):
//   GET /health, GET /metrics, GET /workers, POST /workers, DELETE /workers
//   POST /cache/pin, /cache/unpin, /cache/evict: to the workers that hold the blocks
//   POST /cache/flush: to every worker; GET /cache/state: the cluster view
//   POST /session/tool_start, /session/tool_end, GET /session/kv_meta: to the session's worker
// Everything but /health, /metrics and GET /workers is behind the admin key when one is
// set. Each relayed call answers per worker: {"workers": [{"url", "status", "body"}]}.
#include <openssl/crypto.h>
#include <prometheus/text_serializer.h>

#include "common/log.h"
#include "request/json_fields.h"
#include "request/turn_record.h"
#include "router/router_impl.h"

namespace strata::router {

using boost::asio::awaitable;
using nlohmann::json;
using ojson = nlohmann::ordered_json;

bool router_authorized(const Router::Impl& r, const http::Request& req) {
  const std::string& key = r.options.admin_api_key;
  if (key.empty()) return true;
  const std::string_view value = req.header("Authorization");
  constexpr std::string_view kScheme = "bearer ";
  if (value.size() != kScheme.size() + key.size() ||
      !http::iequals(value.substr(0, kScheme.size()), kScheme)) {
    return false;
  }
  return CRYPTO_memcmp(value.data() + kScheme.size(), key.data(), key.size()) == 0;
}

namespace {

http::Handler admin(Router::Impl& r, http::Handler h) {
  return [&r, h = std::move(h)](http::Exchange& ex) -> awaitable<void> {
    if (!router_authorized(r, ex.request())) {
      co_await ex.respond(router_error(
          401, "this endpoint needs 'Authorization: Bearer <admin key>'", "unauthenticated"));
      co_return;
    }
    co_await h(ex);
  };
}

struct WorkerAnswer {
  std::shared_ptr<Worker> worker;
  int status = 0;  // 0: no answer
  json body;
};

awaitable<WorkerAnswer> call(Router::Impl& r, std::shared_ptr<Worker> w, std::string method,
                             std::string target, std::string body) {
  WorkerAnswer a{.worker = w};
  auto resp = co_await r.client.request(
      r.upstream_request(*w, std::move(method), std::move(target), std::move(body), true));
  if (!resp) {
    a.body = json{{"error", {{"message", resp.error().message}, {"code", "unavailable"}}}};
    co_return a;
  }
  a.status = resp->status;
  a.body = json::parse(resp->body, nullptr, false);
  if (a.body.is_discarded()) a.body = resp->body;
  co_return a;
}

// One answer for a relayed call: 200 when a worker took it, with every worker's answer;
// else an error in the workers' shape with the first answering worker's status, message
// and code (502 when none answered), and every worker's answer beside it.
http::Response combine(const std::vector<WorkerAnswer>& answers) {
  json list = json::array();
  const WorkerAnswer* first = nullptr;  // the first worker that answered
  bool ok = false;
  for (const WorkerAnswer& a : answers) {
    list.push_back(json{{"url", a.worker->url}, {"status", a.status}, {"body", a.body}});
    if (a.status >= 200 && a.status < 300) ok = true;
    if (first == nullptr && a.status != 0) first = &a;
  }
  if (answers.empty()) {
    return router_error(503, "no worker is joined", "unavailable");
  }
  if (ok) return router_json(200, json{{"workers", list}});
  const int status = first == nullptr ? 502 : first->status;
  std::string message = "no worker answered";
  std::string code = "unavailable";
  if (first != nullptr) {
    message = first->worker->url + " answered " + std::to_string(first->status);
    code = "upstream_error";
    const json& b = first->body;
    if (b.is_object() && b.contains("error") && b["error"].is_object()) {
      const json& e = b["error"];
      if (e.contains("message") && e["message"].is_string()) {
        message = first->worker->url + ": " + e["message"].get<std::string>();
      }
      if (e.contains("code") && e["code"].is_string()) code = e["code"].get<std::string>();
    }
  }
  json out = error_json(status, message, code);
  out["workers"] = std::move(list);
  return router_json(status, out);
}

std::vector<std::shared_ptr<Worker>> joined_workers(Router::Impl& r) {
  std::vector<std::shared_ptr<Worker>> out;
  std::lock_guard lock(r.mutex);
  for (const auto& [id, w] : r.workers) {
    if (w->joined) out.push_back(w);
  }
  return out;
}

// How many blocks a worker's /cache/pin answer says it pinned and did not know:
// {"pinned_count", "unknown_count"}. nullopt for an answer without them.
struct PinAnswer {
  int64_t pinned = 0;
  int64_t unknown = 0;
};
std::optional<PinAnswer> pin_answer(const json& body) {
  if (!body.is_object()) return std::nullopt;
  const auto p = body.find("pinned_count");
  const auto u = body.find("unknown_count");
  if (p == body.end() || u == body.end() || !p->is_number_integer() || !u->is_number_integer()) {
    return std::nullopt;
  }
  return PinAnswer{.pinned = p->get<int64_t>(), .unknown = u->get<int64_t>()};
}

// The blocks of a pin the worker confirmed: all of them when it knew every hash; else
// those the index holds there, when their number is what it says it pinned; else none.
// A mark is never set for a block the worker did not pin.
std::vector<uint64_t> confirmed_pins(Router::Impl& r, WorkerId worker,
                                     const std::vector<uint64_t>& hashes, const json& answer) {
  const auto a = pin_answer(answer);
  if (!a || a->unknown < 0 || a->pinned <= 0) return {};
  if (a->unknown == 0 && a->pinned == static_cast<int64_t>(hashes.size())) return hashes;
  std::vector<uint64_t> held = r.index.held(worker, hashes);
  if (static_cast<int64_t>(held.size()) == a->pinned) return held;
  return {};
}

// /cache/pin, /cache/unpin, /cache/evict: to the workers whose index holds any of the
// blocks (every worker when none does: a pin may precede the traffic it protects). The
// body is read as a worker reads it (request/prompt_reader.h: read_cache_target). Pin
// marks follow what each worker answered (confirmed_pins); a pin with a TTL is not marked,
// since it lapses on the worker without telling the router.
awaitable<void> relay_cache(Router::Impl& r, http::Exchange& ex, std::string op) {
  const http::Request& req = ex.request();
  bool expiring = false;  // a pin with a TTL: it lapses on the worker without an event
  auto target = co_await ex.offload([&]() -> Result<CacheTarget> {
    auto body = parse_json_object_as<ojson>(req.body);
    if (!body) return std::unexpected(body.error());
    if (auto ttl = body->find("ttl_s"); ttl != body->end() && ttl->is_number()) {
      expiring = ttl->get<double>() > 0;
    }
    if (op == "evict" && !body->contains("block_hashes")) {
      return make_error(ErrorCode::kInvalidArgument, "'block_hashes' is required");
    }
    auto t = read_cache_target(std::move(*body), r.reader);
    release_memory_after(req.body.size());
    return t;
  });
  if (!target) {
    co_await ex.respond(router_error(target.error()));
    co_return;
  }
  const auto workers = joined_workers(r);
  std::vector<std::shared_ptr<Worker>> targets;
  std::map<WorkerId, std::vector<uint64_t>> hashes_of;
  for (const auto& w : workers) {
    // The router's index holds unsalted blocks only: salted ones are never in it.
    std::vector<uint64_t> hs;
    if (target->cache_salt.empty()) hs = target->hashes(w->block_size);
    bool holds = false;
    for (const WorkerMatch& m : r.index.match(hs))
      holds |= m.worker == w->id && m.matched_blocks > 0;
    if (!holds && !hs.empty()) holds = !r.index.worker_hashes(w->id, hs).empty();
    if (holds) targets.push_back(w);
    hashes_of[w->id] = std::move(hs);
  }
  if (targets.empty()) targets = workers;
  std::vector<WorkerAnswer> answers;
  for (const auto& w : targets) {
    std::string out = req.body;
    if ((w->kind != WorkerKind::kStrata || w->block_hash_algo != "strata") &&
        target->block_hashes) {
      // Another engine, or a Strata worker hashing as vLLM does (--prefix-caching-hash-algo
      // sha256_cbor), names its blocks with its own hashes.
      json b = json::parse(req.body, nullptr, false);
      json list = json::array();
      for (uint64_t h : r.index.worker_hashes(w->id, hashes_of[w->id])) {
        list.push_back(static_cast<int64_t>(h));
      }
      b["block_hashes"] = list;
      out = dump_json(b);
    }
    WorkerAnswer a = co_await call(r, w, "POST", "/cache/" + op, out);
    if (a.status >= 200 && a.status < 300) {
      if (op == "pin" && !expiring) {
        r.index.set_pinned(w->id, confirmed_pins(r, w->id, hashes_of[w->id], a.body), true);
      } else if (op == "unpin") {
        r.index.set_pinned(w->id, hashes_of[w->id], false);
      }
    }
    answers.push_back(std::move(a));
  }
  co_await ex.respond(combine(answers));
}

awaitable<void> flush_all(Router::Impl& r, http::Exchange& ex) {
  std::vector<WorkerAnswer> answers;
  for (const auto& w : joined_workers(r)) {
    answers.push_back(co_await call(r, w, "POST", "/cache/flush", ex.request().body));
  }
  co_await ex.respond(combine(answers));
}

awaitable<void> cluster_state(Router::Impl& r, http::Exchange& ex) {
  const std::string detail = ex.request().query_param("detail");
  if (!detail.empty() && detail != "tree") {
    co_await ex.respond(router_error(400, "'detail' must be 'tree'", "invalid_argument"));
    co_return;
  }
  json workers = json::array();
  for (const auto& w : joined_workers(r)) {
    WorkerAnswer a = co_await call(
        r, w, "GET", detail.empty() ? "/cache/state" : "/cache/state?detail=tree", "");
    workers.push_back(json{{"url", w->url}, {"status", a.status}, {"state", a.body}});
  }
  const PrefixIndexStats s = r.index.stats();
  json per = json::array();
  for (const WorkerIndexStats& w : s.workers) {
    per.push_back(json{{"worker", w.worker},
                       {"blocks", w.blocks},
                       {"device_blocks", w.blocks_per_tier[0]},
                       {"host_blocks", w.blocks_per_tier[1]},
                       {"storage_blocks", w.blocks_per_tier[2]},
                       {"stale", w.stale},
                       {"predicted_blocks", w.predicted_blocks},
                       {"pinned_blocks", w.pinned_blocks},
                       {"orphan_blocks", w.orphan_blocks}});
  }
  json idx{{"distinct_blocks", s.distinct_blocks},
           {"predicted_entries", s.predicted_entries},
           {"memory_bytes", s.memory_bytes},
           {"workers", per}};
  http::Response out = router_json(200, json{{"workers", workers}, {"index", idx}});
  co_await ex.respond(std::move(out));
}

// /session/*: to the worker the session is bound to.
awaitable<void> relay_session(Router::Impl& r, http::Exchange& ex) {
  const http::Request& req = ex.request();
  std::string session;
  if (req.method == "GET") {
    session = req.query_param("session_id");
  } else {
    json body = json::parse(req.body, nullptr, false);
    if (!body.is_object()) {
      co_await ex.respond(router_error(400, "the body must be a JSON object", "invalid_argument"));
      co_return;
    }
    if (body.contains("session_id") && body["session_id"].is_string()) {
      session = body["session_id"].get<std::string>();
    }
  }
  if (Status st = check_session_id(session, "session_id"); !st) {
    co_await ex.respond(router_error(st.error()));
    co_return;
  }
  // --session-store: a session another replica bound is relayed to its worker too.
  (void)co_await read_shared_binding(r, ex, session);
  std::shared_ptr<Worker> w;
  {
    std::lock_guard lock(r.mutex);
    const int64_t now = r.now_ms();
    r.sessions.touch(session, now);
    if (auto b = r.sessions.peek(session, now)) {
      if (auto it = r.workers.find(b->worker); it != r.workers.end()) w = it->second;
    }
  }
  if (!w) {
    co_await ex.respond(
        router_error(404,
                     "session '" + session +
                         "' is not bound to a worker (no request of it went through "
                         "this router, or its binding expired)",
                     "not_found"));
    co_return;
  }
  WorkerAnswer a = co_await call(r, w, req.method, req.target, req.body);
  if (a.status == 0) {
    co_await ex.respond(router_error(502,
                                     "the session's worker " + w->url + " did not answer: " +
                                         a.body["error"]["message"].get<std::string>(),
                                     "unavailable"));
    co_return;
  }
  http::Response out = router_json(a.status, a.body);
  out.headers.emplace_back("x-strata-worker", w->url);
  co_await ex.respond(std::move(out));
}

awaitable<void> add_worker_route(Router::Impl& r, http::Exchange& ex) {
  json body = json::parse(ex.request().body, nullptr, false);
  if (!body.is_object() || !body.contains("url") || !body["url"].is_string()) {
    co_await ex.respond(
        router_error(400, "the body must be an object with a 'url' string", "invalid_argument"));
    co_return;
  }
  for (const auto& [key, value] : body.items()) {
    if (key != "url" && key != "kind" && key != "kv_events" && key != "kv_events_replay" &&
        key != "block_size" && key != "role" && key != "max_running_requests") {
      co_await ex.respond(router_error(400, "unknown field '" + key + "'", "invalid_argument"));
      co_return;
    }
  }
  const bool spec = body.size() > 1;
  auto w = r.add_worker(body["url"].get<std::string>(), spec ? &body : nullptr);
  if (!w) {
    const int status = w.error().code == ErrorCode::kFailedPrecondition  ? 409
                       : w.error().code == ErrorCode::kResourceExhausted ? 507
                                                                         : 400;
    co_await ex.respond(router_error(status, w.error().message, "invalid_argument"));
    co_return;
  }
  json out;
  {
    std::lock_guard lock(r.mutex);
    out = r.worker_json(**w);
  }
  co_await ex.respond(router_json(201, out));
}

awaitable<void> delete_worker_route(Router::Impl& r, http::Exchange& ex) {
  const std::string url = ex.request().query_param("url");
  const std::string drain = ex.request().query_param("drain");
  if (url.empty() || (!drain.empty() && drain != "true" && drain != "false")) {
    co_await ex.respond(router_error(
        400, "DELETE /workers?url=URL[&drain=true|false] (drain: finish its requests first)",
        "invalid_argument"));
    co_return;
  }
  auto w = r.find_worker(url);
  if (!w) {
    co_await ex.respond(router_error(404, "no worker " + url, "not_found"));
    co_return;
  }
  if (drain == "false") {
    r.remove_worker(w->id);
    http::Response out = router_json(200, json{{"removed", w->url}});
    co_await ex.respond(std::move(out));
    co_return;
  }
  {
    std::lock_guard lock(r.mutex);
    w->draining = true;
  }
  http::Response out = router_json(200, json{{"draining", w->url}});
  co_await ex.respond(std::move(out));
}

http::Response metrics(Router::Impl& r) {
  {
    std::lock_guard lock(r.mutex);
    const int64_t now = r.now_ms();
    for (const auto& [id, w] : r.workers) {
      auto set = [&](const char* what, double v) {
        r.metrics.worker_gauges.Add({{"worker", w->url}, {"what", what}}).Set(v);
      };
      set("eligible", r.eligible(*w, now) ? 1 : 0);
      set("load_fraction", w->load_fraction);
      set("active_requests", static_cast<double>(w->active_requests));
      set("inflight_prefill_tokens", static_cast<double>(w->inflight_prefill_tokens));
      set("sessions", static_cast<double>(r.sessions.sessions_on(w->id, now)));
      set("responses", static_cast<double>(r.responses.responses_on(w->id)));
      set("turn_records", static_cast<double>(r.turn_records.records_on(w->id)));
    }
  }
  for (const WorkerIndexStats& s : r.index.stats().workers) {
    std::lock_guard lock(r.mutex);
    if (auto it = r.workers.find(s.worker); it != r.workers.end()) {
      r.metrics.worker_gauges.Add({{"worker", it->second->url}, {"what", "index_blocks"}})
          .Set(static_cast<double>(s.blocks));
    }
  }
  if (r.shared_sessions) {
    std::lock_guard lock(r.mutex);  // one reader at a time moves the counters
    const SharedSessionStats st = r.shared_sessions->stats();
    for (const auto& [what, v] :
         {std::pair{"lookups", st.lookups}, std::pair{"found", st.found},
          std::pair{"binds", st.binds}, std::pair{"races_lost", st.races_lost},
          std::pair{"errors", st.errors}}) {
      prometheus::Counter& c = r.metrics.session_store.Add({{"what", what}});
      c.Increment(static_cast<double>(v) - c.Value());  // the store's own tallies
    }
  }
  prometheus::TextSerializer ser;
  return http::Response{.status = 200,
                        .content_type = "text/plain; version=0.0.4",
                        .body = ser.Serialize(r.metrics.registry->Collect())};
}

}  // namespace

void add_router_admin_routes(http::Server& server, Router::Impl& r) {
  server.route("GET", "/health", [&r](http::Exchange& ex) -> awaitable<void> {
    int eligible = 0;
    {
      std::lock_guard lock(r.mutex);
      // Prefill-role workers take no requests of their own: they do not make the router up.
      for (const auto& [id, w] : r.workers) {
        eligible += w->role != WorkerRole::kPrefill && r.eligible(*w, r.now_ms()) ? 1 : 0;
      }
    }
    http::Response out = router_json(
        eligible > 0 ? 200 : 503,
        json{{"status", eligible > 0 ? "ok" : "no_workers"}, {"eligible_workers", eligible}});
    co_await ex.respond(std::move(out));
  });
  server.route("GET", "/metrics", [&r](http::Exchange& ex) -> awaitable<void> {
    http::Response out = co_await ex.offload([&r] { return metrics(r); });
    co_await ex.respond(std::move(out));
  });
  server.route("GET", "/workers", [&r](http::Exchange& ex) -> awaitable<void> {
    json list = json::array();
    {
      std::lock_guard lock(r.mutex);
      for (const auto& [id, w] : r.workers) list.push_back(r.worker_json(*w));
    }
    // One pass over the index's stats, not one per worker (1,024 workers: a million
    // entries). A worker not indexed yet (not joined) has no `index_blocks`.
    std::vector<std::optional<uint64_t>> index_blocks(kMaxWorkers);
    for (const WorkerIndexStats& s : r.index.stats().workers) index_blocks[s.worker] = s.blocks;
    for (json& w : list) {
      if (const auto& blocks = index_blocks[w["id"].get<WorkerId>()]) w["index_blocks"] = *blocks;
    }
    const PdOptions& pd = r.options.pd;
    http::Response out =
        router_json(200, json{{"policy", policy_name(r.options.policy)},
                              {"pd",
                               {{"enabled", pd.enabled},
                                {"min_prefill_tokens", pd.min_prefill_tokens},
                                {"max_prefill_queue_tokens", pd.max_prefill_queue_tokens}}},
                              {"workers", list}});
    co_await ex.respond(std::move(out));
  });
  server.route("POST", "/workers",
               admin(r, [&r](http::Exchange& ex) { return add_worker_route(r, ex); }));
  server.route("DELETE", "/workers",
               admin(r, [&r](http::Exchange& ex) { return delete_worker_route(r, ex); }));
  for (const char* op : {"pin", "unpin", "evict"}) {
    server.route("POST", std::string("/cache/") + op,
                 admin(r, [&r, op](http::Exchange& ex) { return relay_cache(r, ex, op); }));
  }
  server.route("POST", "/cache/flush",
               admin(r, [&r](http::Exchange& ex) { return flush_all(r, ex); }));
  server.route("GET", "/cache/state",
               admin(r, [&r](http::Exchange& ex) { return cluster_state(r, ex); }));
  for (const char* path : {"/session/tool_start", "/session/tool_end"}) {
    server.route("POST", path, admin(r, [&r](http::Exchange& ex) { return relay_session(r, ex); }));
  }
  server.route("GET", "/session/kv_meta",
               admin(r, [&r](http::Exchange& ex) { return relay_session(r, ex); }));
}

}  // namespace strata::router
