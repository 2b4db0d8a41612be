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
#include "request/release_memory.h"
#include "router/router.h"
#include "text/jinja/chat_template.h"
#include "text/tokenizer/tokenizer.h"

namespace strata::app {

void add_route_command(CLI::App& app, int& exit_code) {
  struct Options {
    std::string model;
    std::string host = "127.0.0.1";
    int port = 8080;
    std::string policy = "default";
    std::string served_model_name;
    double session_ttl_s = 600;
    double approximate_ttl_s = 120;
    double queue_timeout_s = 30;
    double upstream_timeout_s = 600;
    double shutdown_timeout_s = 30;
    std::string log_level = "info";
    router::RouterOptions r;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "route", "KV-aware router in front of strata serve (and vLLM, SGLang) workers");
  cmd->add_option("--model,--tokenizer", o->model,
                  "Folder with the workers' tokenizer.json and chat template")
      ->required();
  cmd->add_option("--host", o->host, "Bind address");
  cmd->add_option("--port", o->port, "Port (0: any free port)");
  cmd->add_option("--worker", o->r.workers, "A Strata worker's URL (repeatable)");
  cmd->add_option("--workers-file", o->r.workers_file,
                  "JSON list of {url, kv_events, kv_events_replay, block_size, role, kind} "
                  "(re-read when it changes)");
  cmd->add_option("--policy", o->policy,
                  "round-robin, least-loaded, approximate, precise or default");
  cmd->add_option("--admin-api-key", o->r.admin_api_key,
                  "Bearer key for /workers (POST, DELETE), /cache/* and /session/*");
  cmd->add_option("--worker-api-key", o->r.worker_api_key,
                  "Admin key sent to the workers (default: --admin-api-key)");
  cmd->add_option("--served-model-name", o->served_model_name, "Model name in logs");
  router::CostWeights& w = o->r.weights;
  cmd->add_option("--cost-device", w.device, "Credit per cached device token");
  cmd->add_option("--cost-host", w.host, "Credit per cached host token");
  cmd->add_option("--cost-storage", w.storage, "Credit per cached storage token");
  cmd->add_option("--cost-predicted", w.predicted, "Certainty of a block only predicted");
  cmd->add_option("--cost-eviction-risk", w.eviction_risk,
                  "Certainty lost by an unpinned block at full load");
  cmd->add_option("--cost-inflight-prefill-token", w.inflight_prefill_token,
                  "Cost per token of prefill queued on the worker");
  cmd->add_option("--cost-decode-request", w.decode_request, "Cost per running stream");
  cmd->add_option("--sticky-bonus", w.sticky_bonus, "Bonus (tokens) for a session's worker");
  cmd->add_option("--load-floor-bonus", w.load_floor_bonus,
                  "Graduated bonus (tokens) for workers with fewer sessions (0: off)");
  cmd->add_option("--temperature", w.temperature, "0: take the best; > 0: sample by cost");
  cmd->add_option("--busy-threshold", w.busy_threshold,
                  "Load fraction above which a worker gets no new work");
  cmd->add_flag("--pd", o->r.pd.enabled,
                "Prefill/decode disaggregation: a long prompt's decode worker has it prefilled "
                "by a prefill-role worker");
  cmd->add_option("--pd-min-prefill-tokens", o->r.pd.min_prefill_tokens,
                  "--pd: prefill remotely only when the decode worker lacks more prompt tokens "
                  "than this (>= 0)");
  cmd->add_option("--pd-max-prefill-queue-tokens", o->r.pd.max_prefill_queue_tokens,
                  "--pd: a prefill worker with more prompt tokens waiting than this is "
                  "overloaded (>= 0)");
  cmd->add_option("--session-ttl-s", o->session_ttl_s, "Lifetime of an idle session binding");
  cmd->add_option("--max-sessions", o->r.sessions.max_sessions, "Session bindings kept");
  cmd->add_option("--migrate-after-rejections", o->r.sessions.migrate_after_rejections,
                  "Rejections (429/503) within 30 s that move a session");
  cmd->add_option("--queue-size", o->r.queue.max_entries,
                  "Requests waiting when all are saturated");
  cmd->add_option("--queue-per-tenant", o->r.queue.max_per_tenant, "Of them, per tenant");
  cmd->add_option("--queue-timeout-s", o->queue_timeout_s, "Longest wait in the queue (then 429)");
  cmd->add_option("--breaker-failures", o->r.breaker.failure_threshold,
                  "Failures within the window that open a worker's circuit breaker");
  cmd->add_option("--breaker-window-ms", o->r.breaker.window_ms, "The breaker's window");
  cmd->add_option("--breaker-cooldown-ms", o->r.breaker.cooldown_ms, "Open this long first");
  cmd->add_option("--load-poll-ms", o->r.load_poll_ms, "How often each worker's load is read");
  cmd->add_option("--predicted-ttl-ms", o->r.predicted_ttl_ms,
                  "Predict-on-route entries live this long (0: off)");
  cmd->add_option("--approximate-ttl-s", o->approximate_ttl_s,
                  "What was sent to a worker without events counts as cached this long");
  cmd->add_option("--max-attempts", o->r.max_attempts,
                  "Tries of a request that fails before its first byte");
  cmd->add_option("--connect-timeout-ms", o->r.connect_timeout_ms, "Upstream connect timeout");
  cmd->add_option("--upstream-timeout-s", o->upstream_timeout_s,
                  "No byte from a worker for this long fails the request");
  cmd->add_option("--replay-timeout-ms", o->r.replay_timeout_ms, "A KV event replay's timeout");
  cmd->add_option("--router-threads", o->r.io_threads, "The router's upstream I/O threads");
  cmd->add_option("--http-threads", o->r.http.io_threads, "Front HTTP I/O threads (0: cores)");
  // The front server's limits, as `strata serve` names them (the rest keep their defaults).
  cmd->add_option("--http-header-timeout-s", o->r.http.header_timeout_s,
                  "Close a connection whose request header is not complete after this long")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  cmd->add_option("--http-body-timeout-s", o->r.http.body_timeout_s,
                  "Close a connection whose request body is not complete this long after its "
                  "header")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  cmd->add_option("--http-max-body-bytes", o->r.http.max_body_bytes,
                  "Largest request body, whatever its content type (413 beyond)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40))
      ->capture_default_str();
  cmd->add_option("--seed", o->r.seed, "Seed of temperature sampling");
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
    o->r.http.host = o->host;
    o->r.http.port = o->port;
    o->r.sessions.ttl_ms = static_cast<int64_t>(o->session_ttl_s * 1000);
    o->r.approximate_ttl_ms = static_cast<int64_t>(o->approximate_ttl_s * 1000);
    o->r.queue.max_wait_ms = static_cast<int64_t>(o->queue_timeout_s * 1000);
    o->r.first_byte_timeout_ms = static_cast<int64_t>(o->upstream_timeout_s * 1000);
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
    std::cout << "strata route: listening on http://" << o->host << ":" << (*router)->port()
              << " (policy " << router::policy_name(o->r.policy) << ")" << std::endl;
    int signal_number = 0;
    sigwait(&signals, &signal_number);
    STRATA_LOG_INFO("stopping the router");
    (*router)->shutdown(o->shutdown_timeout_s);
    exit_code = 0;
  });
}

}  // namespace strata::app
