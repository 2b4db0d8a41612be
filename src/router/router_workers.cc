// The router's workers through their life (router_impl.h): joining (GET /server_info, the
// KV event subscription, the first read of the tree), their server info refreshed, their
// index rebuilt from their tree when it went stale (replayed from the tree's event count:
// event_subscriber.h), and their load polled (/load, vLLM's or SGLang's /metrics,
// llama.cpp's /slots) into the figures the decisions read (docs/router.md).
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>

#include "common/log.h"
#include "router/router_impl.h"

namespace strata::router {

using boost::asio::awaitable;
using nlohmann::json;

void Router::Impl::apply_server_info(Worker& w, const json& info) {
  if (auto id = info.find("instance_id"); id != info.end() && id->is_string()) {
    note_instance(w, id->get<std::string>());
  }
  if (auto m = info.find("max_prompt_tokens"); m != info.end() && m->is_number_integer()) {
    w.max_prompt_tokens = m->get<int64_t>();
  }
  if (w.max_prompt_tokens <= 0) {
    if (auto m = info.find("max_model_len"); m != info.end() && m->is_number_integer()) {
      w.max_prompt_tokens = m->get<int64_t>();
    }
  }
  if (info.contains("role") && info["role"].is_string()) {
    if (auto role = parse_worker_role(info["role"].get<std::string>())) w.role = *role;
  }
  if (auto a = info.find("block_hash_algo"); a != info.end() && a->is_string()) {
    w.block_hash_algo = a->get<std::string>();
  }
  w.pd_worker_id.clear();
  w.pd_endpoint.clear();
  w.pd_transport = PdTransport::kNone;
  auto it = info.find("pd");
  if (it == info.end() || !it->is_object()) return;
  auto str = [&](const char* key) {
    auto f = it->find(key);
    return f != it->end() && f->is_string() ? f->get<std::string>() : std::string();
  };
  // A channel whose transport the router does not know is not used: the router cannot say
  // how the pages would travel, so the worker's prefills stay local.
  auto transport = parse_pd_transport(str("transport"));
  if (!transport) {
    STRATA_LOG_WARN("worker {} ({}): PD channel not used: {}", w.id, w.url,
                    transport.error().message);
    return;
  }
  w.pd_worker_id = str("worker_id");
  w.pd_endpoint = str("endpoint");
  w.pd_transport = *transport;
}

awaitable<void> Router::Impl::refresh_info(std::shared_ptr<Worker> w) {
  http::ClientRequest req = upstream_request(*w, "GET", "/server_info", "", false);
  req.read_timeout_ms = 2'000;
  auto r = co_await client.request(std::move(req));
  json info;
  if (r && r->status == 200) info = json::parse(r->body, nullptr, false);
  std::lock_guard lock(mutex);
  w->refreshing = false;
  if (!info.is_object()) co_return;  // info_stale stays: the next poll tries again
  const WorkerRole role_before = w->role;
  const std::string pd_id_before = w->pd_worker_id;
  apply_server_info(*w, info);
  w->info_stale = false;
  if (role_before != w->role || pd_id_before != w->pd_worker_id) {
    STRATA_LOG_INFO("worker {} ({}): now role {}, PD id '{}'", w->id, w->url,
                    worker_role_name(w->role), w->pd_worker_id);
  }
}

awaitable<void> Router::Impl::join(std::shared_ptr<Worker> w) {
  if (w->kind == WorkerKind::kStrata) {
    http::ClientRequest req = upstream_request(*w, "GET", "/server_info", "", false);
    req.read_timeout_ms = 2'000;
    auto r = co_await client.request(std::move(req));
    std::string error;
    json info;
    if (!r) {
      error = r.error().message;
    } else if (r->status != 200) {
      error = "GET /server_info answered " + std::to_string(r->status);
    } else {
      info = json::parse(r->body, nullptr, false);
      if (!info.is_object() || !info.contains("page_size") ||
          !info["page_size"].is_number_integer()) {
        error = "GET /server_info: not a Strata worker's answer";
      }
    }
    if (!error.empty()) {
      std::lock_guard lock(mutex);
      w->joining = false;
      w->last_error = error;
      co_return;
    }
    // Under the mutex: the admin routes' threads read these (worker_json) meanwhile. This
    // coroutine is their only writer, so its own reads below need no lock.
    std::lock_guard lock(mutex);
    w->block_size = info["page_size"].get<int>();
    apply_server_info(*w, info);
    if (info.contains("kv_events") && info["kv_events"].is_object()) {
      const json& ev = info["kv_events"];
      if (ev.contains("endpoint") && ev["endpoint"].is_string()) {
        w->kv_events = ev["endpoint"].get<std::string>();
      }
      if (ev.contains("replay_endpoint") && ev["replay_endpoint"].is_string()) {
        w->kv_events_replay = ev["replay_endpoint"].get<std::string>();
      }
    }
  }
  if (auto st = index.add_worker(w->id, w->block_size); !st) {
    std::lock_guard lock(mutex);
    w->joining = false;
    w->last_error = st.error().message;
    co_return;
  }
  (void)approx_index.add_worker(w->id, w->block_size);
  if (!w->kv_events.empty() && options.policy != Policy::kApproximate) {
    EventSubscriberOptions so;
    so.endpoint = w->kv_events;
    so.replay_endpoint = w->kv_events_replay;
    so.replay_timeout_ms = static_cast<int>(options.replay_timeout_ms);
    so.replay_on_join = false;  // what came before: the worker's tree (rebuild_index)
    auto sub = EventSubscriber::start(
        w->id, &index, so,
        [this](WorkerId id, const std::string& reason) { on_stale(id, reason); });
    // Under the mutex, as the fields above: worker_json reads `events` from the admin
    // routes' threads (ThreadSanitizer saw the race). This coroutine is its only writer.
    std::lock_guard lock(mutex);
    if (!sub) {
      w->last_error = "KV events: " + sub.error().message;
    } else {
      w->events = std::move(*sub);
    }
  }
  {
    std::lock_guard lock(mutex);
    w->joined = true;
    w->joining = false;
    w->last_error.clear();
  }
  if (w->events && w->kind == WorkerKind::kStrata) {
    // What the worker cached before the router came: its tree, read once the subscription
    // had time to take effect (later changes then arrive as events).
    boost::asio::steady_timer t(io, std::chrono::milliseconds(200));
    co_await t.async_wait(boost::asio::use_awaitable);
    co_await rebuild_index(w);
  }
  STRATA_LOG_INFO("worker {} joined: {} (block size {}, {}, role {})", w->id, w->url, w->block_size,
                  w->events ? "KV events " + w->kv_events : std::string("approximate"),
                  worker_role_name(w->role));
}

void Router::Impl::on_stale(WorkerId id, const std::string& reason) {
  STRATA_LOG_WARN("worker {}: KV index stale ({}), rebuilding", id, reason);
  std::shared_ptr<Worker> w;
  {
    std::lock_guard lock(mutex);
    auto it = workers.find(id);
    if (it == workers.end()) return;
    w = it->second;
    w->info_stale = true;  // a restarted worker (its sequence went back) may have a new PD id
  }
  boost::asio::co_spawn(io, rebuild_index(w), boost::asio::detached);
}

// A Strata worker's tree (GET /cache/state?detail=tree) replaces its index. Its block
// hashes are the router's own (the same function, no salt); salted blocks never match a
// request's unsalted hashes, as on the worker. Other workers stay approximate (scored
// with WorkerMatch::stale) until their events carry them again.
awaitable<void> Router::Impl::rebuild_index(std::shared_ptr<Worker> w) {
  if (w->kind != WorkerKind::kStrata) co_return;
  std::string algo;
  {
    std::lock_guard lock(mutex);
    algo = w->block_hash_algo;
  }
  if (algo != "strata") {
    // Its tree names blocks by another hash (vLLM's sha256_cbor, issue 55) and holds no
    // tokens to hash again: the index learns that worker from its events only (their
    // token ids are hashed the router's way), and is not read from its tree.
    STRATA_LOG_WARN(
        "worker {} ({}): its blocks are hashed with {}, not the router's: its index "
        "is not rebuilt from its tree, only from its events",
        w->id, w->url, algo);
    co_return;
  }
  for (int attempt = 0; attempt < 5 && !stopping; ++attempt) {
    http::ClientRequest req = upstream_request(*w, "GET", "/cache/state?detail=tree", "", true);
    req.read_timeout_ms = 10'000;
    auto r = co_await client.request(std::move(req));
    if (r && r->status == 200) {
      json state = json::parse(r->body, nullptr, false);
      if (state.is_object() && state.contains("nodes") && state["nodes"].is_array()) {
        std::vector<SnapshotBlock> blocks;
        std::vector<uint64_t> pinned;
        // A worker's tree is read field by field with its types checked (json::value() would
        // throw on a wrongly typed field, here on the router's I/O thread): a node or field
        // of the wrong shape is skipped.
        const json none = json::array();
        auto array_field = [&none](const json& n, const char* key) -> const json& {
          const auto it = n.find(key);
          return it != n.end() && it->is_array() ? *it : none;
        };
        for (const json& n : state["nodes"]) {
          if (!n.is_object()) continue;
          uint8_t mask = 0;
          for (const json& t : array_field(n, "tiers")) {
            if (t == "device") mask |= tier_bit(Tier::kDevice);
            if (t == "host") mask |= tier_bit(Tier::kHost);
            if (t == "storage") mask |= tier_bit(Tier::kStorage);
          }
          const auto loading = n.find("loading");
          if (loading != n.end() && loading->is_boolean() && loading->get<bool>()) {
            mask &= static_cast<uint8_t>(~tier_bit(Tier::kDevice));
          }
          const json& pin_counts = array_field(n, "pin_counts");
          size_t i = 0;
          for (const json& h : array_field(n, "block_hashes")) {
            const size_t k = i++;
            if (!h.is_number_integer()) continue;
            const auto hash = static_cast<uint64_t>(h.get<int64_t>());
            blocks.push_back(
                SnapshotBlock{.worker_hash = hash, .router_hash = hash, .tier_mask = mask});
            // The worker's own word on its pins replaces the router's marks.
            if (k < pin_counts.size() && pin_counts[k].is_number_unsigned() &&
                pin_counts[k].get<uint64_t>() > 0) {
              pinned.push_back(hash);
            }
          }
        }
        index.rebuild_worker(w->id, blocks);
        index.replace_pins(w->id, pinned);
        index.mark_stale(w->id, false);
        // Events applied while the tree was on its way were replaced with it: the subscriber
        // replays from the snapshot's sequence number (an older worker does not send one).
        const auto next_seq = state.find("kv_events_next_seq");
        if (w->events && next_seq != state.end() && next_seq->is_number_unsigned()) {
          w->events->resync(next_seq->get<uint64_t>());
        }
        STRATA_LOG_INFO("worker {}: KV index rebuilt from its tree ({} blocks)", w->id,
                        blocks.size());
        co_return;
      }
    }
    boost::asio::steady_timer t(io, std::chrono::milliseconds(200 << attempt));
    co_await t.async_wait(boost::asio::use_awaitable);
  }
  STRATA_LOG_WARN("worker {}: could not rebuild its KV index; it stays approximate", w->id);
}

awaitable<void> Router::Impl::poll_load(std::shared_ptr<Worker> w) {
  const int64_t timeout_ms = std::max<int64_t>(500, options.load_poll_ms * 5);
  // The page each kind reports its load on (worker_kind.h), and a llama.cpp server's slots
  // besides. llama-server wants its --api-key there (the worker key); /v1/models is public.
  const bool strata = w->kind == WorkerKind::kStrata;
  const bool llamacpp = w->kind == WorkerKind::kLlamaCpp;
  const char* target = strata                           ? "/load"
                       : w->kind == WorkerKind::kOpenAi ? "/v1/models"
                                                        : "/metrics";
  std::optional<Result<http::ClientResponse>> slots;
  if (llamacpp) {
    http::ClientRequest req = upstream_request(*w, "GET", "/slots", "", true);
    req.read_timeout_ms = timeout_ms;
    slots = co_await client.request(std::move(req));
  }
  http::ClientRequest req = upstream_request(*w, "GET", target, "", llamacpp);
  req.read_timeout_ms = timeout_ms;
  auto page = co_await client.request(std::move(req));
  const LoadAnswers answers{std::move(page), std::move(slots)};
  if (apply_load(*w, answers)) wake_queue();
  bool refresh = false;
  bool rebuild = false;
  {
    std::lock_guard lock(mutex);
    if (strata && w->info_stale && w->reachable && !w->refreshing) {
      w->refreshing = true;
      refresh = true;
    }
    rebuild = std::exchange(w->needs_rebuild, false);
  }
  if (refresh) co_await refresh_info(w);
  if (rebuild && w->events) co_await rebuild_index(w);
}

namespace {

bool answered_200(const Result<http::ClientResponse>& r) {
  return r && r->status == 200;
}

// llama-server's answer for a page it does not serve: 501 without --metrics or with
// --no-slots (404 from a build without the route).
bool not_served(const Result<http::ClientResponse>& r) {
  return r && (r->status == 501 || r->status == 404);
}

std::string poll_error(std::string_view target, const Result<http::ClientResponse>& r) {
  if (!r) return "load poll: GET " + std::string(target) + ": " + r.error().message;
  return "load poll: GET " + std::string(target) + " answered " + std::to_string(r->status);
}

// A load poll's answers read as the worker's kind reports (before the router's lock): the
// error of a worker that did not answer as one that is up, or a Strata worker's report.
// An OpenAI-compatible server is up when it answers below 500 (a 401 or 404 still says it
// serves); a llama.cpp server when it answered one of its pages, or refused both as not
// served (it is up, without either): 503 is llama-server loading its model. A Strata
// worker's body that is not JSON, or a field of the wrong type, is a failed poll that
// names the field.
struct PollReading {
  std::string error;  // "": the worker is up
  std::optional<StrataLoad> strata;
  bool unreadable = false;  // answered 200 with a report the router cannot read
};

PollReading read_poll(WorkerKind kind, const LoadAnswers& a) {
  PollReading out;
  switch (kind) {
    case WorkerKind::kOpenAi:
      if (!a.page || a.page->status >= 500) out.error = poll_error("/v1/models", a.page);
      break;
    case WorkerKind::kLlamaCpp: {
      const bool slots_ok = a.slots && answered_200(*a.slots);
      const bool both_off = a.slots && not_served(*a.slots) && not_served(a.page);
      if (!slots_ok && !answered_200(a.page) && !both_off) {
        out.error = a.slots && !answered_200(*a.slots) && !not_served(*a.slots)
                        ? poll_error("/slots", *a.slots)
                        : poll_error("/metrics", a.page);
      }
      break;
    }
    case WorkerKind::kStrata:
      if (!answered_200(a.page)) {
        out.error = poll_error("/load", a.page);
      } else if (auto load = read_strata_load(a.page->body); load) {
        out.strata = std::move(*load);
      } else {
        out.error = "load poll: GET /load: unreadable report: " + load.error().message;
        out.unreadable = true;
      }
      break;
    default:
      if (!answered_200(a.page)) out.error = poll_error("/metrics", a.page);
  }
  return out;
}

// Another engine's load, in the router's terms (worker_kind.h); `missing` says why the poll
// read less than the kind reports. Caller holds the router's mutex (reads w's counts).
LoadReport other_engine_load(const Worker& w, const LoadAnswers& a, std::string& missing) {
  std::optional<LoadReport> report;
  if (w.kind == WorkerKind::kVllm || w.kind == WorkerKind::kSglang) {
    report = read_engine_metrics(w.kind, a.page->body);
  } else if (w.kind == WorkerKind::kLlamaCpp) {
    std::optional<LlamaCppSlots> slots;
    if (a.slots && answered_200(*a.slots)) {
      auto s = read_llamacpp_slots((*a.slots)->body);
      if (s) {
        slots = *s;
      } else {
        missing = s.error().message;
      }
    }
    std::optional<std::string_view> metrics;
    if (answered_200(a.page)) metrics = a.page->body;
    report = read_llamacpp_load(slots ? &*slots : nullptr, metrics ? &*metrics : nullptr);
  } else {
    // An OpenAI-compatible server reports nothing: its load is the router's own count of
    // the requests it sent there and are still running, over its max_running_requests.
    report = LoadReport{};
    report->max_running = w.max_running_requests;
    if (w.max_running_requests > 0) {
      report->load_fraction =
          static_cast<double>(w.active_requests) / static_cast<double>(w.max_running_requests);
    }
  }
  if (report) return *report;
  // Most likely the worker is another engine than its entry says (issue 33: llama.cpp
  // servers entered as vllm were routed, and read no load).
  missing = "kind " + std::string(worker_kind_name(w.kind)) +
            ", but no load in its answers to the load poll: the router counts only what it "
            "sent there (is the kind right? llama.cpp is llamacpp, any other "
            "OpenAI-compatible server openai; llama-server reports with /slots or --metrics)";
  return LoadReport{};
}

}  // namespace

bool Router::Impl::apply_load(Worker& worker, const LoadAnswers& a) {
  Worker* w = &worker;
  const int64_t now = now_ms();
  PollReading reading = read_poll(w->kind, a);
  std::lock_guard lock(mutex);
  w->polling = false;
  w->load_at_ms = now;
  if (!reading.error.empty()) {
    w->reachable = false;
    ++w->poll_failures;
    if (reading.unreadable) ++w->unreadable_load_reports;
    w->last_error = std::move(reading.error);
    return false;
  }
  const bool was_saturated = w->load_fraction > options.weights.busy_threshold;
  // Back after failed polls: it may have restarted with another role or PD id.
  if (w->poll_failures > 0) w->info_stale = true;
  w->reachable = true;
  w->poll_failures = 0;
  if (reading.strata) {
    const StrataLoad& l = *reading.strata;
    note_instance(*w, l.instance_id);
    // Batches the subscriber never received show here when no later batch reveals them.
    if (l.kv_events_next_seq && w->events) {
      w->events->note_published(static_cast<uint64_t>(*l.kv_events_next_seq));
    }
    w->load_source = LoadSource::kStrataLoad;
    w->load_fraction = l.load_fraction;
    w->reported_running = l.running;
    w->reported_waiting = l.waiting;
    w->reported_queued_prefill = l.queued_prefill_tokens;
    w->max_running_requests = l.max_running_requests;
    if (l.has_device) {
      w->free_pages = l.free_pages;
      w->evictable_pages = l.evictable_pages;
      w->total_pages = l.total_pages;
    }
    w->recommended_pause_until_ms = l.recommended_pause_ms > 0 ? now + l.recommended_pause_ms : 0;
    return was_saturated && w->load_fraction <= options.weights.busy_threshold;
  }
  std::string missing;
  const LoadReport report = other_engine_load(*w, a, missing);
  if (missing.empty()) {
    w->load_warned = false;
  } else if (!w->load_warned) {
    STRATA_LOG_WARN("worker {} ({}): {}", w->id, w->url, missing);
    w->load_warned = true;
  }
  // llama.cpp has no instance id: its prompt-token counter going back says it restarted,
  // with an empty cache, so what the router predicted there is gone.
  if (report.prompt_tokens_total && w->reported_prompt_tokens_total &&
      *report.prompt_tokens_total < *w->reported_prompt_tokens_total) {
    STRATA_LOG_WARN(
        "worker {} ({}) restarted (its prompt token count went back): its index "
        "is forgotten",
        w->id, w->url);
    index.reset_worker(w->id);
    approx_index.reset_worker(w->id);
  }
  w->reported_prompt_tokens_total = report.prompt_tokens_total;
  w->load_source = report.source;
  w->load_fraction = report.load_fraction;
  w->reported_running = report.running;
  w->reported_waiting = report.waiting;
  if (w->kind != WorkerKind::kOpenAi) w->max_running_requests = report.max_running;
  if (report.context_tokens > 0) w->max_prompt_tokens = report.context_tokens;
  return was_saturated && w->load_fraction <= options.weights.busy_threshold;
}

}  // namespace strata::router
