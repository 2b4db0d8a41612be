// `strata route`: the KV-aware router in front of Strata (and vLLM, SGLang) workers
// (router/router.h, docs/router.md).
#include <pthread.h>

#include <csignal>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "app/commands.h"
#include "common/log.h"
#include "http/server.h"
#include "request/release_memory.h"
#include "router/router.h"
#include "text/jinja/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace strata::app {

namespace {

// What `strata route` itself decides; the router's options are router::RouterOptions.
struct RouteOptions {
  std::string model;
  std::string policy = "default";
  std::string served_model_name;
  double shutdown_timeout_s = 30;
  std::string log_level = "info";
  router::RouterOptions r;
};

// A flag in seconds (fractions allowed) that fills a field in milliseconds; the field keeps
// its default when the flag is absent.
CLI::Option* add_seconds_flag(CLI::App& cmd, const std::string& name, int64_t& field_ms,
                              const std::string& help) {
  return cmd.add_option_function<double>(
      name, [&field_ms](double s) { field_ms = static_cast<int64_t>(s * 1000); }, help);
}

// The sticky session bindings (router/session_table.h). "Session" here is a binding of a
// session id to a worker, not a conversation record: the flags say "binding".
void add_session_binding_flags(CLI::App& cmd, router::SessionTableOptions& o) {
  add_seconds_flag(cmd, "--session-binding-ttl-s,--session-ttl-s", o.ttl_ms,
                   "Lifetime of an idle session binding (--session-ttl-s is the old name)");
  cmd.add_option("--max-session-bindings,--max-sessions", o.max_sessions,
                 "Session bindings kept (--max-sessions is the old name)");
  cmd.add_option("--migrate-after-rejections", o.migrate_after_rejections,
                 "Rejections (429/503) within 30 s that move a session");
}

// Bindings shared by router replicas (router/shared_sessions.h).
void add_session_store_flags(CLI::App& cmd, router::SharedSessionOptions& o) {
  cmd.add_option("--session-store", o.url,
                 "redis://[:password@]host[:port][/db]: share session bindings with the other "
                 "router replicas in front of the same workers (docs/router.md)");
  cmd.add_option("--session-store-namespace", o.name_space,
                 "Keys strata:router:<namespace>:session:*; replicas of one cluster share it")
      ->capture_default_str();
  cmd.add_option("--session-store-timeout-ms", o.timeout_ms,
                 "Longest wait for the store per call (then routed on this router's own "
                 "bindings)")
      ->capture_default_str();
}

// The cost of sending a request to a worker (router/cost.h).
void add_cost_flags(CLI::App& cmd, router::CostWeights& w) {
  cmd.add_option("--cost-device", w.device, "Credit per cached device token");
  cmd.add_option("--cost-host", w.host, "Credit per cached host token");
  cmd.add_option("--cost-storage", w.storage, "Credit per cached storage token");
  cmd.add_option("--cost-predicted", w.predicted, "Certainty of a block only predicted");
  cmd.add_option("--cost-eviction-risk", w.eviction_risk,
                 "Certainty lost by an unpinned block at full load");
  cmd.add_option("--cost-inflight-prefill-token", w.inflight_prefill_token,
                 "Cost per token of prefill queued on the worker");
  cmd.add_option("--cost-decode-request", w.decode_request, "Cost per running stream");
  cmd.add_option("--sticky-bonus", w.sticky_bonus, "Bonus (tokens) for a session's worker");
  cmd.add_option("--load-floor-bonus", w.load_floor_bonus,
                 "Graduated bonus (tokens) for workers with fewer sessions (0: off)");
  cmd.add_option("--temperature", w.temperature, "0: take the best; > 0: sample by cost");
  cmd.add_option("--busy-threshold", w.busy_threshold,
                 "Load fraction above which a worker gets no new work");
}

}  // namespace

void add_route_command(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<RouteOptions>();
  router::RouterOptions& r = o->r;
  r.http.port = 8080;
  CLI::App* cmd = app.add_subcommand(
      "route", "KV-aware router in front of strata serve (and vLLM, SGLang) workers");
  cmd->add_option("--model,--tokenizer", o->model,
                  "Folder with the workers' tokenizer.json and chat template")
      ->required();
  http::add_listen_flags(*cmd, r.http);
  cmd->add_option("--worker", r.workers, "A Strata worker's URL (repeatable)");
  cmd->add_option("--workers-file", r.workers_file,
                  "JSON list of {url, kind, block_size, kv_events, kv_events_replay, role, "
                  "max_running_requests}; kind: strata, vllm, sglang, llamacpp or openai "
                  "(docs/router.md; re-read when it changes)");
  cmd->add_option("--policy", o->policy,
                  "round-robin, least-loaded, approximate, precise or default");
  cmd->add_option("--admin-api-key", r.admin_api_key,
                  "Bearer key for /workers (POST, DELETE), /cache/* and /session/*");
  cmd->add_option("--worker-api-key", r.worker_api_key,
                  "Admin key sent to the workers (default: --admin-api-key), and to "
                  "llama.cpp workers' /slots and /metrics (llama-server --api-key)");
  cmd->add_option("--served-model-name", o->served_model_name, "Model name in logs");
  add_cost_flags(*cmd, r.weights);
  cmd->add_flag("--pd", r.pd.enabled,
                "Prefill/decode disaggregation: a long prompt's decode worker has it prefilled "
                "by a prefill-role worker");
  cmd->add_option("--pd-min-prefill-tokens", r.pd.min_prefill_tokens,
                  "--pd: prefill remotely only when the decode worker lacks more prompt tokens "
                  "than this (>= 0)");
  cmd->add_option("--pd-max-prefill-queue-tokens", r.pd.max_prefill_queue_tokens,
                  "--pd: a prefill worker with more prompt tokens waiting than this is "
                  "overloaded (>= 0)");
  add_session_binding_flags(*cmd, r.sessions);
  add_session_store_flags(*cmd, r.shared_sessions);
  cmd->add_option("--max-response-bindings", r.responses.max_responses,
                  "Responses API: stored responses whose worker the router remembers (the "
                  "least recently used is forgotten first)")
      ->capture_default_str();
  cmd->add_flag("--keep-billing-header", r.keep_billing_header,
                "Read Messages requests with Claude Code's billing line kept in the system "
                "prompt, as workers started with --keep-billing-header do");
  cmd->add_option("--max-turn-records", r.turn_records.max_records,
                  "Exact tokens kept of the workers' sessions and stored responses, to predict "
                  "their next turns (the least recently used is forgotten first)")
      ->capture_default_str();
  cmd->add_option_function<int64_t>(
         "--max-turn-record-mb", [&r](int64_t mb) { r.turn_records.max_bytes = mb << 20; },
         "Memory those records may hold, in MiB")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->default_str("256");
  cmd->add_option("--response-lookup-timeout-ms", r.response_lookup_timeout_ms,
                  "Responses API: a response id the router has no binding for is asked of every "
                  "live Strata worker, each given this long to answer (0: answered as unknown)")
      ->capture_default_str();
  cmd->add_option("--response-miss-ttl-ms", r.responses.miss_ttl_ms,
                  "Responses API: an id no worker had when asked is answered as unknown without "
                  "asking again for this long (0: asked every time; at most 10,000 remembered)")
      ->capture_default_str();
  cmd->add_option("--response-holder-wait-ms", r.response_holder_wait_ms,
                  "Responses API: a continuation (or GET/DELETE) whose worker does not answer is "
                  "tried again for this long before it is answered as unknown (0: at once)")
      ->capture_default_str();
  cmd->add_option("--queue-size", r.queue.max_entries, "Requests waiting when all are saturated");
  cmd->add_option("--queue-per-tenant", r.queue.max_per_tenant, "Of them, per tenant");
  add_seconds_flag(*cmd, "--queue-timeout-s", r.queue.max_wait_ms,
                   "Longest wait in the queue (then 429)");
  cmd->add_option("--breaker-failures", r.breaker.failure_threshold,
                  "Failures within the window that open a worker's circuit breaker");
  cmd->add_option("--breaker-window-ms", r.breaker.window_ms, "The breaker's window");
  cmd->add_option("--breaker-cooldown-ms", r.breaker.cooldown_ms, "Open this long first");
  cmd->add_option("--load-poll-ms", r.load_poll_ms, "How often each worker's load is read");
  cmd->add_option("--predicted-ttl-ms", r.predicted_ttl_ms,
                  "Predict-on-route entries live this long (0: off)");
  add_seconds_flag(*cmd, "--approximate-ttl-s", r.approximate_ttl_ms,
                   "What was sent to a worker without events counts as cached this long");
  cmd->add_option("--max-attempts", r.max_attempts,
                  "Tries of a request that fails before its first byte");
  cmd->add_option("--connect-timeout-ms", r.connect_timeout_ms, "Upstream connect timeout");
  add_seconds_flag(*cmd, "--upstream-timeout-s", r.first_byte_timeout_ms,
                   "No byte from a worker for this long fails the request");
  cmd->add_option("--replay-timeout-ms", r.replay_timeout_ms, "A KV event replay's timeout");
  cmd->add_option("--router-threads", r.io_threads, "The router's upstream I/O threads");
  cmd->add_option("--http-threads", r.http.io_threads, "Front HTTP I/O threads (0: cores)");
  // The front server's limits, as `strata serve` names them (the rest keep their defaults).
  cmd->add_option("--http-header-timeout-s", r.http.header_timeout_s,
                  "Close a connection whose request header is not complete after this long")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  cmd->add_option("--http-body-timeout-s", r.http.body_timeout_s,
                  "Close a connection whose request body is not complete this long after its "
                  "header")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  cmd->add_option("--http-max-body-bytes", r.http.max_body_bytes,
                  "Largest request body, whatever its content type (413 beyond)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  cmd->add_option("--seed", r.seed, "Seed of temperature sampling");
  cmd->add_option("--shutdown-timeout-s", o->shutdown_timeout_s,
                  "On SIGINT/SIGTERM: running requests get this long");
  cmd->add_option("--log-level", o->log_level,
                  "trace | debug | info | warn | error (debug: "
                  "every decision with its terms)");
  cmd->callback([o, &exit_code] {
    auto fail = [&](const std::string& m) {
      std::cerr << "strata route: " << m << "\n";
      exit_code = 1;
    };
    if (!set_log_level(o->log_level)) return fail("unknown --log-level '" + o->log_level + "'");
    auto policy = router::parse_policy(o->policy);
    if (!policy) return fail("--policy: " + policy.error().message);
    o->r.policy = *policy;
    if (o->r.workers.empty() && o->r.workers_file.empty()) {
      STRATA_LOG_WARN("no --worker and no --workers-file: add workers with POST /workers");
    }
    auto tokenizer = Tokenizer::load(o->model);
    if (!tokenizer) return fail(tokenizer.error().message);
    std::optional<ChatTemplate> chat;
    if (auto src = (*tokenizer)->chat_template(); src) {
      auto parsed = ChatTemplate::parse(std::string(*src));
      if (!parsed) return fail("chat template: " + parsed.error().message);
      chat.emplace(std::move(*parsed));
    }
    const std::string name = o->served_model_name.empty()
                                 ? std::filesystem::absolute(o->model).filename().string()
                                 : o->served_model_name;
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    tune_allocator();  // as `strata serve`: large bodies leave no arena behind
    auto router = router::Router::create(o->r, **tokenizer, chat ? &*chat : nullptr, name);
    if (!router) return fail(router.error().message);
    if (auto st = (*router)->bind(); !st) return fail(st.error().message);
    (*router)->start();
    // The port line is read by tests and scripts: keep its format.
    std::cout << "strata route: listening on http://" << o->r.http.host << ":" << (*router)->port()
              << " (policy " << router::policy_name(o->r.policy) << ")" << std::endl;
    int signal_number = 0;
    sigwait(&signals, &signal_number);
    STRATA_LOG_INFO("stopping the router");
    (*router)->shutdown(o->shutdown_timeout_s);
    exit_code = 0;
  });
}

}  // namespace strata::app
