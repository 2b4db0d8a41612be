// The router's insides, shared by router.cc (registry, loops, decisions), router_workers.cc
// (joins, server info, index rebuilds, load polls), the API routes
// (router_routes.cc; a generation request's pipeline, generation.cc; stored responses'
// holders, response_holders.cc; answers in the API's shapes, api_answers.cc),
// router_admin_routes.cc (/workers, /cache/*, /session/*, /metrics) and
// router_dashboard_routes.cc (/dashboard, /workers/cache_state). Not part of the module's
// face: only router.h is.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "http/client.h"
#include "http/server.h"
#include "request/error_shape.h"
#include "request/prompt_reader.h"
#include "request/release_memory.h"
#include "router/event_subscriber.h"
#include "router/prefix_index.h"
#include "router/router.h"
#include "router/worker_kind.h"

namespace strata::router {

struct Worker;

// One search of the workers for a response id that has no binding (response_holders.cc:
// find_response_holder): what came back so far. Requests that want the same id at the same
// time share one search (Impl::response_searches); the asks it sent may outlive them all
// (their answers then wake nobody).
struct HolderSearch {
  std::mutex mutex;
  std::shared_ptr<Worker> found;             // the first worker that answered 200 for the id
  size_t pending = 0;                        // asks not finished
  size_t waiters = 0;                        // requests waiting on it
  bool over = false;                         // no request waits any more: asks stop retrying
  bool settled = false;                      // its result was counted, bound or remembered (once)
  std::vector<std::function<void()>> wakes;  // the waiting requests' wakers
};

// One worker as the router knows it. Fields below `mutex` are guarded by Impl::mutex.
struct Worker {
  WorkerId id = 0;
  std::string url;  // as given, normalised without a trailing '/'
  http::Url addr;   // parsed
  // What it is and how it reports its load (worker_kind.h): set when added, then constant.
  WorkerKind kind = WorkerKind::kStrata;
  WorkerRole role = WorkerRole::kMixed;  // written under Impl::mutex (/server_info)
  // Written by join() under Impl::mutex (worker_json reads them from other threads).
  int block_size = 0;                       // 0 until joined
  std::string kv_events, kv_events_replay;  // "" when the worker publishes none
  bool from_file = false;                   // listed in --workers-file
  nlohmann::json file_spec;                 // its entry there, as last read

  // Guarded by Impl::mutex.
  bool joined = false;        // /server_info read (or given by the file) and indexed
  bool draining = false;      // DELETE /workers?drain: no new requests
  bool reachable = false;     // the last load poll answered
  int32_t poll_failures = 0;  // load polls failed in a row
  // Load reports answered 200 that the router could not read (a Strata /load that is not
  // JSON or has a field of the wrong type): each is also a failed poll.
  uint64_t unreadable_load_reports = 0;
  bool joining = false, polling = false;  // a join or a poll is in flight
  int64_t join_tried_ms = -1'000'000;
  std::string last_error;
  CircuitBreaker breaker;
  // The worker's last report, and when.
  double load_fraction = 0;
  int64_t reported_running = 0, reported_waiting = 0, reported_queued_prefill = 0;
  int64_t free_pages = 0, evictable_pages = 0, total_pages = 0;
  int64_t recommended_pause_until_ms = 0;
  int64_t load_at_ms = 0;
  LoadSource load_source = LoadSource::kRouter;  // what the last poll read
  // How many requests it computes at once: Strata's /load, llama.cpp's slots, an openai
  // entry's `max_running_requests` (its load_fraction is then the router's active requests
  // over it); 0 unknown.
  int64_t max_running_requests = 0;
  // llama.cpp's llamacpp:prompt_tokens_total: a smaller one means the server restarted.
  std::optional<int64_t> reported_prompt_tokens_total;
  bool load_warned = false;  // a poll read no load where the kind has one: logged once
  // The router's own accounting of what it sent there and is still running.
  int64_t inflight_prefill_tokens = 0;  // prompts not past their first token yet
  int64_t decode_requests = 0;          // streams past their first token
  int64_t active_requests = 0;
  uint64_t requests = 0, new_sessions = 0, failures = 0, retried_away = 0;
  uint64_t prefill_orders = 0;  // --pd: requests whose prefill the router sent here
  // The worker's PD channel, from /server_info `pd` (re-read when the worker answers again
  // after failed polls, or its event stream restarted: a restarted worker may have a new id).
  std::string pd_worker_id;  // "": no PD channel (`pd` null, or not a Strata worker)
  std::string pd_endpoint;   // a prefill worker's control-plane endpoint ("" for decode)
  PdTransport pd_transport = PdTransport::kNone;  // kNone without a usable channel
  // The worker process's identity (/server_info and /load `instance_id`): a new one means
  // the worker restarted, and its index (blocks, predictions, pins) is forgotten at once.
  std::string instance_id;     // "" until known (and for other engines)
  bool needs_rebuild = false;  // the index was reset: read the worker's tree again
  // Its --max-prompt-tokens (its context length when unset); 0 until known.
  int64_t max_prompt_tokens = 0;
  // The worker's block hashes (/server_info `block_hash_algo`; absent: "strata", the
  // router's own). Another algorithm's tree cannot be read into the index as it is.
  std::string block_hash_algo = "strata";
  bool info_stale = false;  // /server_info to be read again
  bool refreshing = false;  // ... in flight
  // Set by join() under Impl::mutex (worker_json reads it from other threads); null:
  // approximate (no events).
  std::unique_ptr<EventSubscriber> events;

  explicit Worker(CircuitBreakerOptions b) : breaker(b) {}
};

// What one load poll brought back (poll_load): the page the kind reports its load on
// (Strata /load; /metrics; an OpenAI-compatible server's /v1/models, to see it answer), and
// llama.cpp's /slots.
struct LoadAnswers {
  Result<http::ClientResponse> page;
  std::optional<Result<http::ClientResponse>> slots;  // llama.cpp only
};

// Prometheus metrics of the router.
struct RouterMetrics {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  prometheus::Family<prometheus::Counter>& decisions;  // {reason, worker}
  prometheus::Family<prometheus::Counter>& requests;   // {status}
  prometheus::Counter& retries;
  prometheus::Counter& predicted_cached_tokens;
  prometheus::Counter& reported_cached_tokens;
  prometheus::Counter& prompt_tokens;
  prometheus::Counter& queued;
  prometheus::Counter& rejected_429;
  prometheus::Counter& streams_broken;
  prometheus::Histogram& decision_seconds;
  prometheus::Histogram& queue_seconds;
  prometheus::Family<prometheus::Gauge>& worker_gauges;   // {worker, what}
  prometheus::Family<prometheus::Counter>& pd_decisions;  // {decision} (pd_decision_name)
  prometheus::Counter& pd_kv_transfer_tokens;             // usage.kv_transfer.tokens reported
  prometheus::Counter& pd_remote_without_transfer;        // remote, but usage had no kv_transfer
  prometheus::Family<prometheus::Counter>& response_lookups;  // {result}: found, not_found
  prometheus::Counter& holder_waits;  // pauses before trying a response's worker again
  prometheus::Family<prometheus::Counter>& session_store;  // {what}: SharedSessionStats
  RouterMetrics();
};

struct RouteChoice {
  std::shared_ptr<Worker> worker;
  std::string reason;
  int64_t predicted_cached_tokens = 0;
  int64_t prompt_tokens = 0;
  int64_t charged_prefill = 0;  // added to the worker's inflight_prefill_tokens
  bool all_saturated = false;
  bool session_bound = false;  // choose() bound the request's session here (new or moved)
  // A retry away from the session's worker after it refused the request (429/503) once:
  // the session stays bound there (session_table.h, Migration), here or in the shared store.
  bool detour = false;
  uint64_t probe = 0;  // the breaker's half-open probe number (CircuitBreaker::admit)
  // --pd, a remote prefill: the prefill worker, its PD id (sent to the decode worker as
  // x-strata-prefill-peer), and the prompt tokens charged to its inflight_prefill_tokens
  // until the first byte. Null / "" / 0 when the decode worker prefills locally.
  std::shared_ptr<Worker> prefill;
  std::string prefill_peer;
  int64_t charged_remote_prefill = 0;
  // The blocks predicted on `worker` (predict-on-route), dropped again if it refuses.
  std::vector<uint64_t> predicted_hashes;
};

// What a request brings to a decision.
struct RouteRequest {
  std::vector<int32_t> tokens;  // empty: not scored by cache (unparseable for the router)
  std::string session;          // "" when none
  std::string tenant;
  std::vector<WorkerId> exclude;  // tried already
  std::vector<WorkerId> refused;  // of them: those that answered 429/503 (backpressure)
  bool pd_local_only = false;     // salted or with log-probabilities: never a remote prefill
  // Only this worker may take the request (a Responses request continuing a response it
  // stored); nullopt: any. choose() returns nullopt when it is not eligible.
  std::optional<WorkerId> only_worker;
  // The worker that continues exact recorded tokens for this request (its session's, or the
  // previous response's: turn_records.h), and the prompt it computes from them; it is scored
  // on these tokens, every other worker on `tokens`. nullopt: none.
  std::optional<WorkerId> exact_worker;
  std::vector<int32_t> exact_tokens;
};

struct Router::Impl {
  RouterOptions options;
  // How prompts are read: the workers' own reading (request/), with the workers' tokenizer
  // and chat template (chat() null: chat requests pass through unscored).
  PromptReader reader;
  std::string model_name;

  boost::asio::io_context io;  // upstream client + background loops
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  http::Client client;
  http::Server http;
  PrefixIndex index;         // from the events (+ predict-on-route entries)
  PrefixIndex approx_index;  // only what the router sent (the approximate policy)
  RouterMetrics metrics;
  std::atomic<bool> stopping{false};

  std::mutex mutex;
  std::map<WorkerId, std::shared_ptr<Worker>> workers;  // GUARDED_BY(mutex)
  SessionTable sessions;                                // GUARDED_BY(mutex)
  // --session-store: the bindings every replica shares (null: this router's table alone).
  // Set at creation, then constant; thread-safe itself.
  std::unique_ptr<SharedSessions> shared_sessions;
  ResponseTable responses;  // GUARDED_BY(mutex)
  // Searches for unbound response ids under way, by id (find_response_holder).
  std::map<std::string, std::shared_ptr<HolderSearch>, std::less<>>
      response_searches;         // GUARDED_BY(mutex)
  TurnRecordTable turn_records;  // GUARDED_BY(mutex)
  AdmissionQueue queue;          // GUARDED_BY(mutex)
  // Waiting requests' wake-ups, by ticket.
  std::unordered_map<uint64_t, std::function<void()>> queue_wakers;  // GUARDED_BY(mutex)
  std::mt19937_64 rng;                                               // GUARDED_BY(mutex)
  uint64_t round_robin = 0;                                          // GUARDED_BY(mutex)
  // Decisions of the cost so far: where choose()'s ties start (cost.h, Choice). With
  // --session-store, counted from a random start (replicas' rotations out of step).
  uint64_t cost_decisions = 0;      // GUARDED_BY(mutex)
  int64_t workers_file_mtime = -1;  // GUARDED_BY(mutex)

  Impl(RouterOptions o, const Tokenizer& t, const ChatTemplate* c, std::string model);

  int64_t now_ms() const { return SteadyClock::instance().now_ms(); }
  std::string worker_key() const {
    return options.worker_api_key.empty() ? options.admin_api_key : options.worker_api_key;
  }

  // ---- registry (router.cc) ----
  // Adds a worker (not yet joined); kInvalidArgument for a bad URL or spec,
  // kFailedPrecondition when it is already there, kResourceExhausted beyond 64.
  Result<std::shared_ptr<Worker>> add_worker(const std::string& url, const nlohmann::json* spec);
  void remove_worker(WorkerId id);
  std::shared_ptr<Worker> find_worker(const std::string& url);
  std::vector<std::shared_ptr<Worker>> worker_list();
  nlohmann::json worker_json(const Worker& w);  // caller holds mutex

  // A worker whose instance id changed is another process: forgets its index (blocks,
  // predictions, pins) and marks it to be rebuilt from its tree. `id` "": the report has
  // none (nothing changes). Caller holds mutex.
  void note_instance(Worker& w, const std::string& id);
  // The worker refused a request (4xx): the blocks choose() predicted there are not coming.
  void refused(const RouteChoice& c);
  // Binds a stored response's id to the worker that answered it, unless that worker has
  // left the registry meanwhile (its id may be another worker's by now).
  void stored_response(const Worker& w, const std::string& response_id);
  // Keeps the record a worker answered a turn of `key` with (nullopt: it keeps none now, and
  // neither does the router), unless that worker has left the registry meanwhile.
  void learned_turn(const Worker& w, TurnKey kind, const std::string& key,
                    std::optional<ConversationRecord> record,
                    std::optional<std::string> instructions);
  // Adds the --workers-file's new entries and removes those no longer listed. At start
  // (`strict`) a bad file or entry is an error naming it; later ones are logged and skipped.
  Status read_workers_file(bool strict);
  boost::asio::awaitable<void> background_loop();

  // Can take new requests: joined, not draining, answering, breaker closed (or probing).
  bool eligible(const Worker& w, int64_t now) const;  // caller holds mutex
  // --pd: can compute a decode worker's prefill: eligible, breaker closed, PD id known.
  bool prefill_usable(const Worker& w, int64_t now) const;  // caller holds mutex
  bool policy_uses_cache() const;

  // ---- the workers' life (router_workers.cc) ----
  // Joins a worker: reads /server_info (Strata), registers it in the index, subscribes.
  boost::asio::awaitable<void> join(std::shared_ptr<Worker> w);
  // Takes a Strata worker's /server_info role and `pd` in (caller holds mutex).
  void apply_server_info(Worker& w, const nlohmann::json& info);
  // Reads /server_info again (a worker back after failed polls may have restarted).
  boost::asio::awaitable<void> refresh_info(std::shared_ptr<Worker> w);
  // Reads the worker's load the way its kind reports it (worker_kind.h).
  boost::asio::awaitable<void> poll_load(std::shared_ptr<Worker> w);
  // Takes a load poll's answers in; true when the worker just stopped being saturated.
  bool apply_load(Worker& w, const LoadAnswers& a);
  // Reads a Strata worker's tree (GET /cache/state?detail=tree) into its index, then has
  // its subscriber replay the events from the tree's count; not for a worker that hashes
  // blocks otherwise than the router (block_hash_algo).
  boost::asio::awaitable<void> rebuild_index(std::shared_ptr<Worker> w);
  // The subscriber found the worker's index stale: rebuilds it (on the I/O context).
  void on_stale(WorkerId id, const std::string& reason);

  // ---- decisions (router.cc) ----
  // nullopt: no eligible worker.
  std::optional<RouteChoice> choose(const RouteRequest& req);
  // choose()'s first phase, without the router's lock: the prompt's block hashes at each
  // joined worker's block size, and each worker's match (RouteRequest::exact_tokens' for
  // the exact worker).
  struct PromptMatches {
    std::map<int, std::vector<uint64_t>> hashes;  // by block size
    std::map<WorkerId, WorkerMatch> matches;
    std::vector<uint64_t> exact_hashes;  // the exact worker's own blocks
  };
  PromptMatches match_prompt(const RouteRequest& req);
  // choose()'s last phase, for a request that is sent: its prefill worker (--pd), the
  // charges (prefill tokens, active requests, the breaker's probe), the session's binding,
  // and its blocks predicted on the chosen worker. Caller holds mutex.
  void charge(RouteChoice& out, const RouteRequest& req,
              const std::optional<SessionBinding>& binding, const PromptMatches& pm, int64_t now);
  // --pd, after the decode worker `out.worker` was chosen and before it is charged: decides
  // where the prompt is prefilled (pd_choice.h), counts and logs the decision, and for a
  // remote prefill fills out.prefill* and charges the prefill worker. Caller holds mutex.
  void choose_prefill_worker(RouteChoice& out, const std::map<WorkerId, WorkerMatch>& matches,
                             const std::map<int, std::vector<uint64_t>>& hashes, int64_t now);
  // --session-store: takes the shared binding of `session` (a worker URL) into this router's
  // table, bound to the worker of that URL unless it is bound there already. false: the URL
  // is none of this router's workers (the binding is then left as it is).
  bool adopt_shared_binding(const std::string& session, const std::string& url);
  // The request reached its first token (prefill done) or ended; undoes choose()'s charge.
  void first_token(const RouteChoice& c);
  void finished(const RouteChoice& c, bool started);
  // The upstream outcome, for the breaker and the session's rejection window.
  void outcome(const RouteChoice& c, UpstreamOutcome o, const std::string& session, uint64_t probe);
  // A waiting ticket may go (capacity freed): wakes the next queued request.
  void wake_queue();

  // ---- upstream calls (router.cc) ----
  http::ClientRequest upstream_request(const Worker& w, std::string method, std::string target,
                                       std::string body, bool admin);
};

// Sends the exchange's request as it is to any eligible worker, answering with its answer.
boost::asio::awaitable<void> forward_any(Router::Impl& r, http::Exchange& ex);

// --session-store (shared_sessions.h): what the store said of a request's session before it
// was routed.
struct SharedBinding {
  bool asked = false;              // there is a store and the request has a session
  bool answered = false;           // the store answered (else: routed on this router's table)
  std::optional<std::string> url;  // the worker the session is bound to there
};
// Reads the session's shared binding (refreshing its TTL) off the I/O thread and adopts it
// (Impl::adopt_shared_binding). Nothing asked without a store or a session.
boost::asio::awaitable<SharedBinding> read_shared_binding(Router::Impl& r, http::Exchange& ex,
                                                          const std::string& session);
// After choose() sent the session to c.worker: writes that binding for the other replicas
// when it changed here or the store had another; a new session is written only if absent,
// and when another replica bound it first meanwhile its binding is adopted (later turns
// follow it; this request goes where it was sent).
boost::asio::awaitable<void> publish_shared_binding(Router::Impl& r, http::Exchange& ex,
                                                    const std::string& session,
                                                    const SharedBinding& before,
                                                    const RouteChoice& c);

// Routes (router_routes.cc, router_admin_routes.cc).
void add_router_routes(http::Server& server, Router::Impl& r);
void add_router_admin_routes(http::Server& server, Router::Impl& r);
// /dashboard, its assets, /dashboard/config, /workers/cache_state (router_dashboard_routes.cc).
void add_router_dashboard_routes(http::Server& server, Router::Impl& r);

// Shared by the route files.
// Errors in the workers' shape (request/error_shape.h): type "invalid_request_error" for
// a 4xx, "server_error" for a 5xx; `code` names the error.
http::Response router_error(int status, const std::string& message, const std::string& code);
http::Response router_error(const Error& e);
http::Response router_json(int status, const nlohmann::json& body);
bool router_authorized(const Router::Impl& r, const http::Request& req);

}  // namespace strata::router
