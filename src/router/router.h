// `strata route`: the KV-aware router in front of Strata, vLLM, SGLang and llama.cpp
// workers and any OpenAI-compatible server (docs/router.md; their kinds: worker_kind.h). It
// renders and tokenizes each request as the workers will, looks the prompt's blocks up in
// an index built from every worker's KV events, scores each worker (cost.h), and proxies
// the request there, streaming or not, with x-strata-worker and x-strata-route headers on
// the answer. Prefill-role workers never get requests; with --pd, a long prompt's decode
// worker is told to have it prefilled by one of them (pd_choice.h, x-strata-prefill-peer
// upstream, x-strata-prefill-worker on the answer).
//
// Pieces: the prefix index (prefix_index.h) fed by one event subscriber per worker
// (event_subscriber.h); sticky session bindings (session_table.h), shared with other router
// replicas through Redis when asked (shared_sessions.h); a circuit breaker per
// worker (circuit_breaker.h); the bounded fair queue used when every worker is saturated
// (admission_queue.h); which worker stored each response of the Responses API
// (response_table.h); the worker registry, its load polling and stale-index rebuilds; the
// HTTP routes (router_routes.cc for the OpenAI and Anthropic APIs, each generation request
// a pipeline of stages in generation.h; router_admin_routes.cc for /workers, /cache/*,
// /session/*).
//
// Threads: the front HTTP server's I/O threads run the handlers; the router's own I/O
// threads run the upstream client's sockets and the background loops (load polling,
// joining workers, the workers file, rebuilds, expiry). One mutex guards the registry,
// the session and response tables, the queue and the accounting; the index has its own lock; the
// event subscribers have their own threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"
#include "http/server.h"
#include "router/admission_queue.h"
#include "router/circuit_breaker.h"
#include "router/cost.h"
#include "router/pd_choice.h"
#include "router/response_table.h"
#include "router/session_table.h"
#include "router/shared_sessions.h"
#include "router/turn_records.h"
#include "text/jinja/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace strata::router {

// --policy: every policy is this router with other options, not another code path.
enum class Policy : uint8_t {
  kRoundRobin,   // eligible workers in turn
  kLeastLoaded,  // the least loaded (the cost's load terms only)
  kApproximate,  // the cost, from what the router sent each worker (no events)
  kPrecise,      // the cost, from the events; no sticky or load-floor bonus
  kDefault,      // precise + sticky + load-floor + backpressure
};
Result<Policy> parse_policy(std::string_view name);
std::string_view policy_name(Policy policy);

struct RouterOptions {
  http::ServerOptions http;          // bind address, threads, limits (as `serve`)
  std::string admin_api_key;         // guards /workers (POST, DELETE), /cache/*, /session/*
  std::string worker_api_key;        // sent to workers' admin endpoints; "": admin_api_key
  std::vector<std::string> workers;  // --worker URL: Strata workers (GET /server_info)
  std::string workers_file;          // --workers-file: JSON list, re-read when it changes
  Policy policy = Policy::kDefault;
  CostWeights weights;
  SessionTableOptions sessions;
  // --session-store: bindings shared with other replicas through Redis (shared_sessions.h).
  SharedSessionOptions shared_sessions;
  ResponseTableOptions responses;  // which worker stored each response (Responses API)
  // The exact tokens each worker keeps for the sessions and stored responses routed there
  // (turn_records.h): --max-turn-records, --max-turn-record-mb.
  TurnRecordOptions turn_records;
  // --keep-billing-header: read Messages requests as workers started with it do (Claude
  // Code's billing line kept in the system prompt; request/anthropic_request.h).
  bool keep_billing_header = false;
  CircuitBreakerOptions breaker;
  AdmissionQueueOptions queue;
  PdOptions pd;                // --pd: long prompts prefilled by a prefill worker (pd_choice.h)
  int64_t load_poll_ms = 200;  // GET /load (or /metrics) of every worker
  int64_t predicted_ttl_ms = 2'000;         // predict-on-route entries (precise policies)
  int64_t approximate_ttl_ms = 120'000;     // what was sent to a worker without events
  int32_t max_attempts = 3;                 // tries of one request (429/503/connect errors), >= 1
  int64_t connect_timeout_ms = 2'000;       // upstream connect
  int64_t first_byte_timeout_ms = 600'000;  // upstream answer (non-streaming) or header
  int64_t replay_timeout_ms = 1'000;        // a KV event replay
  // Responses API, an id the router has no binding for (restarted, or another replica
  // bound it): each live Strata worker is asked for it (GET /v1/responses/{id}) and given
  // this long to answer; 0: never asked (answered as unknown at once).
  int64_t response_lookup_timeout_ms = 1'000;  // --response-lookup-timeout-ms
  // Responses API, the worker holding a continued or read response does not answer
  // (connect error, timeout): tried again until this long after the request came, unless
  // its binding goes first (the worker removed or seen restarted); then unknown. 0: at once.
  int64_t response_holder_wait_ms = 5'000;  // --response-holder-wait-ms
  int64_t files_poll_ms = 1'000;            // the workers file's modification time
  int32_t io_threads = 2;                   // the router's own I/O threads (upstream, loops)
  uint64_t seed = 0;                        // temperature sampling
};

Status validate(const RouterOptions& options);

class Router {
 public:
  // `tokenizer` and `chat` (may be null: chat requests then pass through unscored) must
  // outlive the router.
  static Result<std::unique_ptr<Router>> create(RouterOptions options, const Tokenizer& tokenizer,
                                                const ChatTemplate* chat, std::string model_name);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  // Binds the front port (a clear error when taken).
  Status bind();
  int port() const;
  // Starts the router's threads, joins the --worker and --workers-file workers (in the
  // background: a worker not up yet joins when it answers), serves. Returns at once.
  void start();
  // Stops serving (running requests get timeout_s to finish), then the loops and the
  // subscribers. Idempotent.
  void shutdown(double timeout_s);

  struct Impl;

 private:
  explicit Router(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::router
