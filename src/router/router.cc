// The router's registry, background loops and decisions (router.h, docs/router.md); the
// workers' joins, index rebuilds and load polls are router_workers.cc's.
#include "router/router.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "common/log.h"
#include "router/router_impl.h"

namespace strata::router {

using boost::asio::awaitable;
using nlohmann::json;

namespace {

http::ClientOptions client_options(const RouterOptions& o) {
  http::ClientOptions c;
  c.connect_timeout_ms = o.connect_timeout_ms;
  c.read_timeout_ms = o.first_byte_timeout_ms;
  c.max_idle_per_host = 256;
  return c;
}

std::string trim_url(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  if (url.find("://") == std::string::npos) url = "http://" + url;
  return url;
}

// Reads a workers-file entry or a POST /workers body (but its url) into `w`: kind
// (without one: vllm when it names a block_size, else strata), block_size, KV event
// endpoints, role and, for an OpenAI-compatible server, max_running_requests.
// kInvalidArgument naming the field and what it must be.
Status read_worker_spec(const json& spec, Worker& w) {
  auto text = [&](const char* key) -> Result<std::string> {
    const auto it = spec.find(key);
    if (it == spec.end() || it->is_null()) return std::string();
    if (!it->is_string()) return bad_argument("'" + std::string(key) + "' must be a string");
    return it->get<std::string>();
  };
  auto kind_name = text("kind");
  if (!kind_name) return std::unexpected(kind_name.error());
  if (kind_name->empty()) *kind_name = spec.contains("block_size") ? "vllm" : "strata";
  const auto kind = parse_worker_kind(*kind_name);
  if (!kind) return std::unexpected(kind.error());
  w.kind = *kind;
  const std::string a_kind = "a " + std::string(worker_kind_name(w.kind)) + " worker";
  w.block_size = default_block_size(w.kind);
  if (auto it = spec.find("block_size"); it != spec.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > 4096) {
      return bad_argument("'block_size' must be an integer in [1, 4096]");
    }
    w.block_size = it->get<int>();
  }
  if (w.kind != WorkerKind::kStrata && w.block_size == 0) {
    return bad_argument(a_kind + " needs 'block_size' (its KV block size)");
  }
  auto events = text("kv_events");
  if (!events) return std::unexpected(events.error());
  auto replay = text("kv_events_replay");
  if (!replay) return std::unexpected(replay.error());
  if (!publishes_kv_events(w.kind) && (!events->empty() || !replay->empty())) {
    return bad_argument(a_kind +
                        " publishes no KV events: remove 'kv_events' and 'kv_events_replay' "
                        "(the router scores it from what it sent there)");
  }
  w.kv_events = std::move(*events);
  w.kv_events_replay = std::move(*replay);
  auto role_name = text("role");
  if (!role_name) return std::unexpected(role_name.error());
  if (!role_name->empty()) {
    const auto role = parse_worker_role(*role_name);
    if (!role) return std::unexpected(role.error());
    w.role = *role;
  }
  if (auto it = spec.find("max_running_requests"); it != spec.end()) {
    if (w.kind != WorkerKind::kOpenAi) {
      return bad_argument("'max_running_requests' is for kind openai (" + a_kind +
                          " reports its load)");
    }
    if (!it->is_number_integer() || it->get<int64_t>() < 1 || it->get<int64_t>() > 1'000'000) {
      return bad_argument("'max_running_requests' must be an integer in [1, 1000000]");
    }
    w.max_running_requests = it->get<int64_t>();
  }
  return {};
}

}  // namespace

Result<Policy> parse_policy(std::string_view name) {
  if (name == "round-robin") return Policy::kRoundRobin;
  if (name == "least-loaded") return Policy::kLeastLoaded;
  if (name == "approximate") return Policy::kApproximate;
  if (name == "precise") return Policy::kPrecise;
  if (name == "default") return Policy::kDefault;
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown policy '" + std::string(name) +
                        "' (round-robin, least-loaded, approximate, precise, default)");
}

std::string_view policy_name(Policy policy) {
  switch (policy) {
    case Policy::kRoundRobin:
      return "round-robin";
    case Policy::kLeastLoaded:
      return "least-loaded";
    case Policy::kApproximate:
      return "approximate";
    case Policy::kPrecise:
      return "precise";
    case Policy::kDefault:
      return "default";
  }
  return "default";
}

Status validate(const RouterOptions& o) {
  if (auto st = http::validate(o.http); !st) return st;
  if (auto st = validate(o.weights); !st) return st;
  if (auto st = validate(o.sessions); !st) return st;
  if (auto st = validate(o.shared_sessions); !st) return st;
  if (auto st = validate(o.responses); !st) return st;
  if (auto st = validate(o.turn_records); !st) return st;
  if (auto st = validate(o.breaker); !st) return st;
  if (auto st = validate(o.queue); !st) return st;
  if (auto st = validate(o.pd); !st) return st;
  auto bad = [](std::string m) { return make_error(ErrorCode::kInvalidArgument, std::move(m)); };
  if (o.load_poll_ms < 10) return bad("--load-poll-ms must be >= 10");
  if (o.predicted_ttl_ms < 0) return bad("--predicted-ttl-ms must be >= 0");
  if (o.approximate_ttl_ms < 1) return bad("--approximate-ttl-s must be > 0");
  if (o.max_attempts < 1 || o.max_attempts > 16) return bad("--max-attempts must be in [1, 16]");
  if (o.connect_timeout_ms < 1) return bad("--connect-timeout-ms must be >= 1");
  if (o.first_byte_timeout_ms < 1) return bad("--upstream-timeout-s must be > 0");
  if (o.replay_timeout_ms < 1) return bad("--replay-timeout-ms must be >= 1");
  if (o.response_lookup_timeout_ms < 0) return bad("--response-lookup-timeout-ms must be >= 0");
  if (o.response_holder_wait_ms < 0) return bad("--response-holder-wait-ms must be >= 0");
  if (o.io_threads < 1 || o.io_threads > 64) return bad("--router-threads must be in [1, 64]");
  return {};
}

RouterMetrics::RouterMetrics()
    : decisions(prometheus::BuildCounter()
                    .Name("strata_router_decisions_total")
                    .Help("Routing decisions by reason and worker")
                    .Register(*registry)),
      requests(prometheus::BuildCounter()
                   .Name("strata_router_requests_total")
                   .Help("Proxied generation requests by final status")
                   .Register(*registry)),
      retries(prometheus::BuildCounter()
                  .Name("strata_router_retries_total")
                  .Help("Requests sent again to another worker before their first byte")
                  .Register(*registry)
                  .Add({})),
      predicted_cached_tokens(
          prometheus::BuildCounter()
              .Name("strata_router_predicted_cached_tokens_total")
              .Help("Prompt tokens the index predicted cached on the chosen worker")
              .Register(*registry)
              .Add({})),
      reported_cached_tokens(prometheus::BuildCounter()
                                 .Name("strata_router_reported_cached_tokens_total")
                                 .Help("Cached prompt tokens the workers reported in usage")
                                 .Register(*registry)
                                 .Add({})),
      prompt_tokens(prometheus::BuildCounter()
                        .Name("strata_router_prompt_tokens_total")
                        .Help("Prompt tokens of routed requests (as the router tokenized them)")
                        .Register(*registry)
                        .Add({})),
      queued(prometheus::BuildCounter()
                 .Name("strata_router_queued_total")
                 .Help("Requests that waited in the router queue (every worker saturated)")
                 .Register(*registry)
                 .Add({})),
      rejected_429(prometheus::BuildCounter()
                       .Name("strata_router_rejected_total")
                       .Help("Requests answered 429 by the router (queue full or wait over)")
                       .Register(*registry)
                       .Add({})),
      streams_broken(prometheus::BuildCounter()
                         .Name("strata_router_streams_broken_total")
                         .Help("Streams whose worker failed after the first byte")
                         .Register(*registry)
                         .Add({})),
      decision_seconds(
          prometheus::BuildHistogram()
              .Name("strata_router_decision_seconds")
              .Help("Time to choose a worker (index match and cost)")
              .Register(*registry)
              .Add({}, prometheus::Histogram::BucketBoundaries{1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4,
                                                               1e-3, 1e-2})),
      queue_seconds(prometheus::BuildHistogram()
                        .Name("strata_router_queue_seconds")
                        .Help("Time requests waited in the router queue")
                        .Register(*registry)
                        .Add({}, prometheus::Histogram::BucketBoundaries{0.01, 0.05, 0.1, 0.5, 1, 5,
                                                                         10, 30})),
      worker_gauges(
          prometheus::BuildGauge()
              .Name("strata_router_worker")
              .Help("Per worker: eligible, load_fraction, active requests, sessions, stored "
                    "responses bound to it, index blocks")
              .Register(*registry)),
      pd_decisions(prometheus::BuildCounter()
                       .Name("strata_router_pd_decisions_total")
                       .Help("--pd: routed requests by where their prompt was prefilled")
                       .Register(*registry)),
      pd_kv_transfer_tokens(prometheus::BuildCounter()
                                .Name("strata_router_pd_kv_transfer_tokens_total")
                                .Help("Prompt tokens whose KV a prefill worker moved to the "
                                      "decode worker (the workers' usage.kv_transfer)")
                                .Register(*registry)
                                .Add({})),
      pd_remote_without_transfer(
          prometheus::BuildCounter()
              .Name("strata_router_pd_remote_without_transfer_total")
              .Help("Requests sent for a remote prefill whose usage reported no kv_transfer "
                    "(the decode worker prefilled locally)")
              .Register(*registry)
              .Add({})),
      response_lookups(prometheus::BuildCounter()
                           .Name("strata_router_response_lookups_total")
                           .Help("Responses API: requests for ids without a binding, by result "
                                 "(found: asked of the workers, bound to the one that has it; "
                                 "not_found: asked, none had it; remembered_not_found: none had "
                                 "it when asked within --response-miss-ttl-ms, not asked again)")
                           .Register(*registry)),
      holder_waits(prometheus::BuildCounter()
                       .Name("strata_router_response_holder_waits_total")
                       .Help("Responses API: pauses before trying again a worker that holds the "
                             "response and did not answer")
                       .Register(*registry)
                       .Add({})),
      session_store(prometheus::BuildCounter()
                        .Name("strata_router_session_store_total")
                        .Help("--session-store: calls to the bindings shared with other "
                              "replicas, by outcome (lookups, found, binds, races_lost: a new "
                              "session another replica bound first; errors: the store did not "
                              "answer and this router routed on its own bindings)")
                        .Register(*registry)) {}

Router::Impl::Impl(RouterOptions o, const Tokenizer& t, const ChatTemplate* c, std::string model)
    : options(std::move(o)),
      reader(t, c),
      model_name(std::move(model)),
      client(io.get_executor(), client_options(options)),
      http(options.http),
      sessions(options.sessions),
      responses(options.responses),
      turn_records(options.turn_records),
      queue(options.queue),
      rng(options.seed) {}

http::Response router_error(int status, const std::string& message, const std::string& code) {
  return http::Response{.status = status, .body = dump_json(error_json(status, message, code))};
}

http::Response router_error(const Error& e) {
  return router_error(http_status(e.code), e.message, std::string(error_code_name(e.code)));
}

http::Response router_json(int status, const json& body) {
  return http::Response{.status = status, .body = dump_json(body)};
}

// ---- registry ----

Result<std::shared_ptr<Worker>> Router::Impl::add_worker(const std::string& raw_url,
                                                         const json* spec) {
  const std::string url = trim_url(raw_url);
  auto addr = http::parse_url(url);
  if (!addr) return std::unexpected(addr.error());
  auto w = std::make_shared<Worker>(options.breaker);
  w->url = url;
  w->addr = *addr;
  if (spec != nullptr) {
    if (auto st = read_worker_spec(*spec, *w); !st) return std::unexpected(st.error());
  }
  std::lock_guard lock(mutex);
  for (const auto& [id, other] : workers) {
    if (other->url == url) {
      return make_error(ErrorCode::kFailedPrecondition, "worker " + url + " is already routed to");
    }
  }
  WorkerId id = 0;
  while (id < kMaxWorkers && workers.contains(id)) ++id;
  if (id == kMaxWorkers) {
    return make_error(ErrorCode::kResourceExhausted,
                      "at most " + std::to_string(kMaxWorkers) + " workers");
  }
  w->id = id;
  workers.emplace(id, w);
  STRATA_LOG_INFO("worker {} added: {} ({})", id, url, worker_kind_name(w->kind));
  return w;
}

void Router::Impl::remove_worker(WorkerId id) {
  std::shared_ptr<Worker> w;
  {
    std::lock_guard lock(mutex);
    auto it = workers.find(id);
    if (it == workers.end()) return;
    w = it->second;
    workers.erase(it);
    sessions.unbind_worker(id);
    responses.unbind_worker(id);  // its stored responses are no longer reachable
    turn_records.forget_worker(id);
  }
  if (w->events) w->events->stop();
  index.remove_worker(id);
  approx_index.remove_worker(id);
  STRATA_LOG_INFO("worker {} removed: {}", id, w->url);
}

std::shared_ptr<Worker> Router::Impl::find_worker(const std::string& url) {
  const std::string u = trim_url(url);
  std::lock_guard lock(mutex);
  for (const auto& [id, w] : workers) {
    if (w->url == u) return w;
  }
  return nullptr;
}

std::vector<std::shared_ptr<Worker>> Router::Impl::worker_list() {
  std::lock_guard lock(mutex);
  std::vector<std::shared_ptr<Worker>> out;
  for (const auto& [id, w] : workers) out.push_back(w);
  return out;
}

json Router::Impl::worker_json(const Worker& w) {
  const int64_t now = now_ms();
  const json prompt_tokens_total =
      w.reported_prompt_tokens_total ? json(*w.reported_prompt_tokens_total) : json(nullptr);
  json j{{"id", w.id},
         {"url", w.url},
         {"kind", worker_kind_name(w.kind)},
         {"role", worker_role_name(w.role)},
         {"block_size", w.block_size},
         {"joined", w.joined},
         {"draining", w.draining},
         {"reachable", w.reachable},
         {"poll_failures", w.poll_failures},
         {"unreadable_load_reports", w.unreadable_load_reports},
         {"breaker", breaker_state_name(w.breaker.state(now))},
         {"eligible", eligible(w, now)},
         {"max_prompt_tokens", w.max_prompt_tokens},
         {"load",
          {{"source", load_source_name(w.load_source)},
           {"load_fraction", w.load_fraction},
           {"running", w.reported_running},
           {"waiting", w.reported_waiting},
           {"queued_prefill_tokens", w.reported_queued_prefill},
           {"free_pages", w.free_pages},
           {"evictable_pages", w.evictable_pages},
           {"total_pages", w.total_pages},
           {"max_running_requests", w.max_running_requests},
           {"prompt_tokens_total", prompt_tokens_total}}},
         {"router",
          {{"active_requests", w.active_requests},
           {"inflight_prefill_tokens", w.inflight_prefill_tokens},
           {"decode_requests", w.decode_requests},
           {"requests", w.requests},
           {"new_sessions", w.new_sessions},
           {"failures", w.failures},
           {"prefill_orders", w.prefill_orders},
           {"sessions", sessions.sessions_on(w.id, now)},
           {"responses", responses.responses_on(w.id)},
           {"turn_records", turn_records.records_on(w.id)}}},
         {"pd", w.pd_worker_id.empty() ? json(nullptr)
                                       : json{{"worker_id", w.pd_worker_id},
                                              {"endpoint", w.pd_endpoint},
                                              {"transport", pd_transport_name(w.pd_transport)},
                                              {"prefill_usable", prefill_usable(w, now)}}},
         {"kv_events", w.kv_events.empty() ? json(nullptr) : json(w.kv_events)},
         {"instance_id", w.instance_id.empty() ? json(nullptr) : json(w.instance_id)},
         {"last_error", w.last_error}};
  if (w.events) {
    const EventSubscriberStats s = w.events->stats();
    j["events"] = {{"batches", s.batches},
                   {"events", s.events},
                   {"gaps", s.gaps},
                   {"replays_ok", s.replays_ok},
                   {"replays_failed", s.replays_failed},
                   {"decode_errors", s.decode_errors},
                   {"last_seq", s.last_seq}};
  }
  return j;
}

bool Router::Impl::eligible(const Worker& w, int64_t now) const {
  return w.joined && !w.draining && (w.reachable || w.poll_failures < 3) && w.breaker.can_send(now);
}

bool Router::Impl::prefill_usable(const Worker& w, int64_t now) const {
  return w.role == WorkerRole::kPrefill && !w.pd_worker_id.empty() && eligible(w, now) &&
         w.breaker.state(now) == BreakerState::kClosed;
}

void Router::Impl::note_instance(Worker& w, const std::string& id) {
  if (id.empty() || id == w.instance_id) return;
  if (!w.instance_id.empty()) {
    STRATA_LOG_WARN("worker {} ({}) restarted (instance {} -> {}): its index is forgotten", w.id,
                    w.url, w.instance_id, id);
    index.reset_worker(w.id);
    approx_index.reset_worker(w.id);
    index.mark_stale(w.id, true);
    if (w.events) w.events->restarted();
    // Its stored responses and its conversation records went with the old process: they
    // are unknown ids now, and its sessions' next turns are rendered afresh there.
    responses.unbind_worker(w.id);
    turn_records.forget_worker(w.id);
    w.needs_rebuild = true;
    w.info_stale = true;  // it may have a new role or PD id
  }
  w.instance_id = id;
}

void Router::Impl::stored_response(const Worker& w, const std::string& response_id) {
  std::lock_guard lock(mutex);
  auto it = workers.find(w.id);
  if (it == workers.end() || it->second.get() != &w) return;
  if (auto st = responses.bind(response_id, w.id); !st) {
    STRATA_LOG_DEBUG("response id from {} not bound: {}", w.url, st.error().message);
  }
}

void Router::Impl::learned_turn(const Worker& w, TurnKey kind, const std::string& key,
                                std::optional<ConversationRecord> record,
                                std::optional<std::string> instructions) {
  std::lock_guard lock(mutex);
  auto it = workers.find(w.id);
  if (it == workers.end() || it->second.get() != &w) return;
  if (!record) {
    turn_records.erase(kind, key);
    return;
  }
  turn_records.put(
      kind, key,
      TurnEntry{
          .worker = w.id, .record = std::move(*record), .instructions = std::move(instructions)});
}

void Router::Impl::refused(const RouteChoice& c) {
  if (c.predicted_hashes.empty()) return;
  index.drop_predicted(c.worker->id, c.predicted_hashes);
  approx_index.drop_predicted(c.worker->id, c.predicted_hashes);
}

http::ClientRequest Router::Impl::upstream_request(const Worker& w, std::string method,
                                                   std::string target, std::string body,
                                                   bool admin) {
  http::ClientRequest r;
  r.method = std::move(method);
  r.host = w.addr.host;
  r.port = w.addr.port;
  r.target = std::move(target);
  r.body = std::move(body);
  if (!r.body.empty()) r.headers.emplace_back("Content-Type", "application/json");
  if (admin && !worker_key().empty()) {
    r.headers.emplace_back("Authorization", "Bearer " + worker_key());
  }
  return r;
}

Status Router::Impl::read_workers_file(bool strict) {
  const std::string& file = options.workers_file;
  // A bad file or entry: an error at start (nothing runs yet), logged and skipped later.
  auto bad = [&](const std::string& what) -> Status {
    const std::string m = "--workers-file " + file + ": " + what;
    if (strict) return make_error(ErrorCode::kInvalidArgument, m);
    STRATA_LOG_ERROR("{}; skipped", m);
    return {};
  };
  std::error_code ec;
  const auto mtime = std::filesystem::last_write_time(file, ec);
  if (ec) return strict ? bad(ec.message()) : Status{};
  const int64_t stamp = mtime.time_since_epoch().count();
  {
    std::lock_guard lock(mutex);
    if (stamp == workers_file_mtime) return {};
    workers_file_mtime = stamp;
  }
  std::ifstream f(file);
  std::stringstream ss;
  ss << f.rdbuf();
  json list = json::parse(ss.str(), nullptr, false);
  if (!list.is_array()) return bad("not a JSON list of workers");
  std::set<std::string> listed;
  for (size_t i = 0; i < list.size(); ++i) {
    const json& spec = list[i];
    const std::string entry = "entry " + std::to_string(i + 1);
    if (!spec.is_object() || !spec.contains("url") || !spec["url"].is_string()) {
      if (auto st = bad(entry + " is without a 'url' string"); !st) return st;
      continue;
    }
    const std::string url = trim_url(spec["url"].get<std::string>());
    listed.insert(url);
    if (auto old = find_worker(url)) {
      bool changed = false;
      {
        std::lock_guard lock(mutex);
        changed = old->from_file && old->file_spec != spec;
      }
      if (!changed) continue;
      // An entry that changed (its kind corrected, say) is another worker now; a bad one
      // leaves the worker as it was.
      Worker probe(options.breaker);
      if (auto st = read_worker_spec(spec, probe); !st) {
        if (auto st2 = bad(entry + " (" + url + "): " + st.error().message); !st2) return st2;
        continue;
      }
      STRATA_LOG_INFO("--workers-file: the entry of {} changed; the worker is added again", url);
      remove_worker(old->id);
    }
    auto w = add_worker(url, &spec);
    if (!w) {
      if (auto st = bad(entry + " (" + url + "): " + w.error().message); !st) return st;
      continue;
    }
    std::lock_guard lock(mutex);
    (*w)->from_file = true;
    (*w)->file_spec = spec;
  }
  for (const auto& w : worker_list()) {
    if (w->from_file && !listed.contains(w->url)) remove_worker(w->id);
  }
  return {};
}

awaitable<void> Router::Impl::background_loop() {
  boost::asio::steady_timer timer(io);
  int64_t last_file_check = 0;
  while (!stopping) {
    const int64_t now = now_ms();
    if (!options.workers_file.empty() && now - last_file_check >= options.files_poll_ms) {
      last_file_check = now;
      (void)read_workers_file(false);
    }
    std::vector<std::shared_ptr<Worker>> to_join, to_poll, to_remove;
    {
      std::lock_guard lock(mutex);
      for (const auto& [id, w] : workers) {
        if (!w->joined && !w->joining && now - w->join_tried_ms >= 1'000) {
          w->joining = true;
          w->join_tried_ms = now;
          to_join.push_back(w);
        }
        if (w->joined && !w->polling && now - w->load_at_ms >= options.load_poll_ms) {
          w->polling = true;
          to_poll.push_back(w);
        }
        if (w->draining && w->active_requests == 0) to_remove.push_back(w);
      }
      sessions.expire(now);
      for (Ticket t : queue.expired(now)) {
        auto it = queue_wakers.find(static_cast<uint64_t>(t));
        if (it != queue_wakers.end()) it->second();
      }
    }
    for (auto& w : to_join) boost::asio::co_spawn(io, join(w), boost::asio::detached);
    for (auto& w : to_poll) boost::asio::co_spawn(io, poll_load(w), boost::asio::detached);
    for (auto& w : to_remove) remove_worker(w->id);
    index.expire(now);
    approx_index.expire(now);
    timer.expires_after(std::chrono::milliseconds(20));
    co_await timer.async_wait(boost::asio::use_awaitable);
  }
}

// ---- decisions ----

Router::Impl::PromptMatches Router::Impl::match_prompt(const RouteRequest& req) {
  PromptMatches pm;
  std::vector<std::pair<WorkerId, int>> sizes;
  {
    std::lock_guard lock(mutex);
    for (const auto& [id, w] : workers) {
      if (w->joined) sizes.emplace_back(id, w->block_size);
    }
  }
  const PrefixIndex& idx = options.policy == Policy::kApproximate ? approx_index : index;
  if (policy_uses_cache() && !req.tokens.empty()) {
    for (const auto& [id, bs] : sizes) {
      if (!pm.hashes.contains(bs)) pm.hashes[bs] = PrefixIndex::hash_tokens(req.tokens, bs);
    }
    // Each joined worker's block size by id, so that a match is kept in one lookup (not a
    // scan of every worker per match: quadratic at 1,024 workers).
    std::vector<int> block_size_of(kMaxWorkers, 0);
    for (const auto& [id, bs] : sizes) block_size_of[id] = bs;
    for (const auto& [bs, hs] : pm.hashes) {
      for (const WorkerMatch& m : idx.match(hs)) {
        if (block_size_of[m.worker] == bs) pm.matches[m.worker] = m;
      }
    }
  }
  if (policy_uses_cache() && req.exact_worker && !req.exact_tokens.empty()) {
    pm.matches.erase(*req.exact_worker);
    for (const auto& [id, bs] : sizes) {
      if (id != *req.exact_worker) continue;
      pm.exact_hashes = PrefixIndex::hash_tokens(req.exact_tokens, bs);
      for (const WorkerMatch& m : idx.match(pm.exact_hashes)) {
        if (m.worker == id) pm.matches[id] = m;
      }
    }
  }
  return pm;
}

std::optional<RouteChoice> Router::Impl::choose(const RouteRequest& req) {
  const auto t0 = std::chrono::steady_clock::now();
  // Phase 1 (no router lock): the prompt's blocks on every worker, per block size.
  const PromptMatches pm = match_prompt(req);
  const auto& matches = pm.matches;
  // Phase 2 (router lock): candidates, cost, accounting.
  std::lock_guard lock(mutex);
  const int64_t now = now_ms();
  std::optional<SessionBinding> binding;
  if (!req.session.empty()) binding = sessions.lookup(req.session, now);
  const bool use_sessions = options.policy == Policy::kDefault;
  std::vector<WorkerCandidate> cands;
  std::vector<std::shared_ptr<Worker>> ws;
  for (const auto& [id, w] : workers) {
    if (!w->joined) continue;
    WorkerCandidate c;
    c.id = id;
    c.eligible = eligible(*w, now) &&
                 std::find(req.exclude.begin(), req.exclude.end(), id) == req.exclude.end() &&
                 (!req.only_worker || *req.only_worker == id);
    c.prefill_only = w->role == WorkerRole::kPrefill;
    c.block_size = w->block_size;
    if (auto it = matches.find(id); it != matches.end()) {
      const WorkerMatch& m = it->second;
      c.cached_device_blocks = m.device_blocks;
      c.cached_host_blocks = m.host_blocks;
      c.cached_storage_blocks = m.storage_blocks;
      c.pinned_blocks = m.pinned_blocks;
      c.predicted_blocks = m.predicted_blocks;
    }
    c.inflight_prefill_tokens = std::max(w->inflight_prefill_tokens, w->reported_queued_prefill);
    c.decode_requests = std::max(w->decode_requests, w->reported_running);
    c.load_fraction = w->load_fraction;
    if (now < w->recommended_pause_until_ms) {
      c.load_fraction = std::max(c.load_fraction, options.weights.busy_threshold + 0.01);
    }
    if (options.policy != Policy::kDefault) c.load_fraction = 0;  // no backpressure
    c.sessions_assigned = sessions.sessions_on(id, now);
    c.sticky = use_sessions && binding && !binding->migrate && binding->worker == id;
    if (req.exact_worker == id) c.prompt_tokens = static_cast<int64_t>(req.exact_tokens.size());
    cands.push_back(c);
    ws.push_back(w);
  }
  CostWeights weights = options.weights;
  if (options.policy != Policy::kDefault) {
    weights.sticky_bonus = 0;
    weights.load_floor_bonus = 0;
  }
  if (options.policy == Policy::kLeastLoaded || options.policy == Policy::kRoundRobin) {
    weights.device = weights.host = weights.storage = 0;
  }
  std::optional<Decision> d;
  if (options.policy == Policy::kRoundRobin) {
    std::vector<size_t> ok;
    for (size_t i = 0; i < cands.size(); ++i) {
      if (cands[i].eligible) ok.push_back(i);
    }
    if (!ok.empty()) {
      Decision rr;
      rr.worker = cands[ok[round_robin++ % ok.size()]].id;
      rr.reason = RouteReason::kLoad;
      rr.pool_size = static_cast<int32_t>(ok.size());
      d = rr;
    }
  } else {
    RequestFeatures f;
    f.prompt_tokens = static_cast<int64_t>(req.tokens.size());
    f.has_session = !req.session.empty();
    f.new_session = f.has_session && !binding;
    f.tie_break = cost_decisions++;
    d = strata::router::choose(f, cands, weights, rng);
  }
  if (!d) return std::nullopt;
  RouteChoice out;
  size_t k = 0;
  while (ws[k]->id != d->worker) ++k;
  out.worker = ws[k];
  out.reason = req.only_worker                         ? "previous_response"
               : options.policy == Policy::kRoundRobin ? "round_robin"
                                                       : std::string(route_reason_name(d->reason));
  const bool exact = req.exact_worker == d->worker;
  out.prompt_tokens = static_cast<int64_t>(exact ? req.exact_tokens.size() : req.tokens.size());
  out.predicted_cached_tokens = d->terms.cached_tokens;
  out.all_saturated = d->all_saturated && options.policy == Policy::kDefault;
  metrics.decision_seconds.Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  if (out.all_saturated) return out;  // queued, not sent: nothing charged
  charge(out, req, binding, pm, now);
  const Worker& w = *out.worker;
  STRATA_LOG_DEBUG(
      "route -> worker {} ({}): reason {}, cost {:.0f} (prefill {:.0f}, load {:.0f}, sticky "
      "{:.0f}, floor {:.0f}), cached {} of {} tokens, runner-up {} at {:.0f}",
      w.id, w.url, out.reason, d->terms.cost, d->terms.prefill, d->terms.load, d->terms.sticky,
      d->terms.floor, d->terms.cached_tokens, out.prompt_tokens, d->runner_up, d->runner_up_cost);
  return out;
}

void Router::Impl::charge(RouteChoice& out, const RouteRequest& req,
                          const std::optional<SessionBinding>& binding, const PromptMatches& pm,
                          int64_t now) {
  Worker& w = *out.worker;
  const bool exact = req.exact_worker == w.id;
  if (options.pd.enabled && !req.pd_local_only)
    choose_prefill_worker(out, pm.matches, pm.hashes, now);
  // A remote prefill leaves the decode worker no prefill to do (its own load report
  // corrects this should it fall back to a local one).
  out.charged_prefill =
      out.prefill ? 0 : std::max<int64_t>(0, out.prompt_tokens - out.predicted_cached_tokens);
  w.inflight_prefill_tokens += out.charged_prefill;
  ++w.active_requests;
  ++w.requests;
  out.probe = w.breaker.admit(now).probe;
  // One refusal by the session's worker moves only this request; repeated ones mark the
  // binding to migrate, and then the session moves with it (session_table.h).
  out.detour =
      binding && !binding->migrate && binding->worker != w.id &&
      std::find(req.refused.begin(), req.refused.end(), binding->worker) != req.refused.end();
  if (!req.session.empty() && !out.detour &&
      (!binding || binding->worker != w.id || binding->migrate)) {
    if (!binding) ++w.new_sessions;
    out.session_bound = sessions.bind(req.session, w.id, now).has_value();
  }
  metrics.decisions.Add({{"reason", out.reason}, {"worker", w.url}}).Increment();
  // Predict-on-route: siblings of this request (an agent's fan-out) find these blocks
  // here before the worker's events arrive; a worker without events keeps them longer.
  const std::vector<int32_t>& sent = exact ? req.exact_tokens : req.tokens;
  const auto it = pm.hashes.find(w.block_size);
  const std::vector<uint64_t>* blocks =
      exact && !pm.exact_hashes.empty() ? &pm.exact_hashes
                                        : (!exact && it != pm.hashes.end() ? &it->second : nullptr);
  if (blocks != nullptr) {
    const int64_t ttl = w.events ? options.predicted_ttl_ms : options.approximate_ttl_ms;
    if (ttl > 0) index.insert_predicted(w.id, *blocks, now, ttl);
    approx_index.insert_predicted(w.id, *blocks, now, options.approximate_ttl_ms);
    out.predicted_hashes = *blocks;
  } else if (options.policy == Policy::kApproximate && !sent.empty()) {
    out.predicted_hashes = PrefixIndex::hash_tokens(sent, w.block_size);
    approx_index.insert_predicted(w.id, out.predicted_hashes, now, options.approximate_ttl_ms);
  }
}

void Router::Impl::choose_prefill_worker(RouteChoice& out,
                                         const std::map<WorkerId, WorkerMatch>& matches,
                                         const std::map<int, std::vector<uint64_t>>& hashes,
                                         int64_t now) {
  const Worker& decode = *out.worker;
  std::vector<PrefillCandidate> cands;
  std::vector<std::shared_ptr<Worker>> ws;
  for (const auto& [id, w] : workers) {
    if (!w->joined || w->role != WorkerRole::kPrefill) continue;
    PrefillCandidate c;
    c.id = id;
    c.usable = prefill_usable(*w, now) && w->block_size == decode.block_size;
    if (auto it = matches.find(id); it != matches.end()) {
      const WorkerMatch& m = it->second;
      const int64_t run = int64_t{m.device_blocks} + m.host_blocks + m.storage_blocks;
      c.cached_tokens = std::min(out.prompt_tokens, run * w->block_size);
    }
    c.queued_prefill_tokens = std::max(w->inflight_prefill_tokens, w->reported_queued_prefill);
    c.saturated =
        w->load_fraction > options.weights.busy_threshold || now < w->recommended_pause_until_ms;
    cands.push_back(c);
    ws.push_back(w);
  }
  PdRequest pr;
  pr.prompt_tokens = out.prompt_tokens;
  pr.decode_cached_tokens = std::min(out.prompt_tokens, out.predicted_cached_tokens);
  pr.decode_has_channel = !decode.pd_worker_id.empty();
  pr.tie_break = cost_decisions;  // ties rotate with the decisions, as the decode choice's do
  const PdChoice pd = choose_prefill(pr, cands, options.pd);
  metrics.pd_decisions.Add({{"decision", std::string(pd_decision_name(pd.decision))}}).Increment();
  if (!pd.prefill_worker) {
    STRATA_LOG_DEBUG(
        "pd: {} for worker {}: prompt {} tokens, {} uncached there, {} prefill workers",
        pd_decision_name(pd.decision), decode.id, pr.prompt_tokens, pd.remote_tokens, cands.size());
    return;
  }
  size_t k = 0;
  while (ws[k]->id != *pd.prefill_worker) ++k;
  Worker& p = *ws[k];
  out.prefill = ws[k];
  out.prefill_peer = p.pd_worker_id;
  out.charged_remote_prefill = pd.prefill_compute_tokens;
  p.inflight_prefill_tokens += out.charged_remote_prefill;
  ++p.prefill_orders;
  // Predict-on-route: the prefill worker's tree will hold the prompt too, so a sibling
  // request finds its prefix there before the events arrive.
  if (auto it = hashes.find(p.block_size); it != hashes.end()) {
    const int64_t ttl = p.events ? options.predicted_ttl_ms : options.approximate_ttl_ms;
    if (ttl > 0) index.insert_predicted(p.id, it->second, now, ttl);
    approx_index.insert_predicted(p.id, it->second, now, options.approximate_ttl_ms);
  }
  STRATA_LOG_DEBUG(
      "pd: remote for worker {}: prompt {} tokens, {} uncached there; prefill worker {} ({}, "
      "PD id {}) computes {} (cached {}, queued {})",
      decode.id, pr.prompt_tokens, pd.remote_tokens, p.id, p.url, p.pd_worker_id,
      pd.prefill_compute_tokens, cands[k].cached_tokens, cands[k].queued_prefill_tokens);
}

bool Router::Impl::policy_uses_cache() const {
  return options.policy != Policy::kRoundRobin && options.policy != Policy::kLeastLoaded;
}

void Router::Impl::first_token(const RouteChoice& c) {
  std::lock_guard lock(mutex);
  Worker& w = *c.worker;
  w.inflight_prefill_tokens -= c.charged_prefill;
  if (c.prefill) c.prefill->inflight_prefill_tokens -= c.charged_remote_prefill;
  ++w.decode_requests;
}

void Router::Impl::finished(const RouteChoice& c, bool started) {
  {
    std::lock_guard lock(mutex);
    Worker& w = *c.worker;
    if (started) {
      --w.decode_requests;
    } else {
      w.inflight_prefill_tokens -= c.charged_prefill;
      if (c.prefill) c.prefill->inflight_prefill_tokens -= c.charged_remote_prefill;
    }
    --w.active_requests;
  }
  wake_queue();
}

bool Router::Impl::adopt_shared_binding(const std::string& session, const std::string& url) {
  std::lock_guard lock(mutex);
  const int64_t now = now_ms();
  for (const auto& [id, w] : workers) {
    if (w->url != url) continue;
    const std::optional<SessionBinding> local = sessions.peek(session, now);
    if (!local || local->worker != id) (void)sessions.bind(session, id, now);
    return true;
  }
  return false;
}

void Router::Impl::outcome(const RouteChoice& c, UpstreamOutcome o, const std::string& session,
                           uint64_t probe) {
  std::lock_guard lock(mutex);
  Worker& w = *c.worker;
  const int64_t now = now_ms();
  w.breaker.on_outcome(o, now, probe);
  if (o != UpstreamOutcome::kOk && o != UpstreamOutcome::kBackpressure) ++w.failures;
  if (o == UpstreamOutcome::kBackpressure && !session.empty()) {
    sessions.record_rejection(session, w.id, now);
  }
}

void Router::Impl::wake_queue() {
  std::lock_guard lock(mutex);
  if (queue.size() == 0) return;
  if (auto t = queue.pop_next(now_ms())) {
    auto it = queue_wakers.find(static_cast<uint64_t>(*t));
    if (it != queue_wakers.end()) it->second();
  }
}

// ---- Router ----

Result<std::unique_ptr<Router>> Router::create(RouterOptions options, const Tokenizer& tokenizer,
                                               const ChatTemplate* chat, std::string model_name) {
  if (auto st = validate(options); !st) return std::unexpected(st.error());
  auto impl = std::make_unique<Impl>(std::move(options), tokenizer, chat, std::move(model_name));
  if (!impl->options.shared_sessions.url.empty()) {
    auto store = SharedSessions::create(impl->options.shared_sessions,
                                        impl->options.sessions.ttl_ms, SteadyClock::instance());
    if (!store) return std::unexpected(store.error());
    impl->shared_sessions = std::move(*store);
    // Replicas take requests in turn and each counts only its own decisions: from the
    // same start their rotations run in step, and the k-th request of every replica breaks
    // its ties toward the same worker. Each replica starts at a point of its own.
    impl->cost_decisions = std::random_device{}();
  }
  for (const std::string& url : impl->options.workers) {
    auto w = impl->add_worker(url, nullptr);
    if (!w) return make_error(w.error().code, "--worker " + url + ": " + w.error().message);
  }
  if (!impl->options.workers_file.empty()) {
    if (!std::filesystem::exists(impl->options.workers_file)) {
      return make_error(ErrorCode::kNotFound,
                        "--workers-file " + impl->options.workers_file + " does not exist");
    }
    if (auto st = impl->read_workers_file(true); !st) return std::unexpected(st.error());
  }
  add_router_routes(impl->http, *impl);
  add_router_admin_routes(impl->http, *impl);
  add_router_dashboard_routes(impl->http, *impl);
  return std::unique_ptr<Router>(new Router(std::move(impl)));
}

Router::Router(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Router::~Router() {
  shutdown(0);
}

Status Router::bind() {
  return impl_->http.bind();
}

int Router::port() const {
  return impl_->http.port();
}

void Router::start() {
  Impl& r = *impl_;
  r.work.emplace(r.io.get_executor());
  boost::asio::co_spawn(r.io, r.background_loop(), boost::asio::detached);
  for (int i = 0; i < r.options.io_threads; ++i) {
    r.threads.emplace_back([&r] { r.io.run(); });
  }
  r.http.start();
}

void Router::shutdown(double timeout_s) {
  Impl& r = *impl_;
  if (r.stopping.exchange(true)) return;
  r.http.shutdown(timeout_s);
  for (const auto& w : r.worker_list()) {
    if (w->events) w->events->stop();
  }
  r.work.reset();
  r.io.stop();
  for (auto& t : r.threads) t.join();
  r.threads.clear();
}

}  // namespace strata::router
