// `strata bench cluster`: the router's policies side by side (issue 14). For every workload
// and policy, N fresh `strata serve` workers (small KV pools, so that placement matters, one
// thread each) and one `strata route --policy P` in front of them (cluster_fleet.h), then the
// workload's traffic through the router, deterministic from --seed (cluster_workload.h):
//
// 1. shared-prefix: G groups whose prefixes together take --prefix-kv-fraction of the
//    cluster's device KV; after an unmeasured warm-up request per group, one-turn questions
//    arriving as a Poisson process at each rate of a sweep (open loop: a request is sent at
//    its time whatever is in flight).
// 2. agentic: sessions arriving as a Poisson process, all sharing one boilerplate system
//    prompt, alternating model turns and tool pauses (session_id in every request).
// 3. failure: workload 2's shape over a fixed duration; the worker that served the most
//    requests so far is killed (SIGKILL) at --kill-at of it and restarted where it was at
//    --restart-at.
// 4. trace (--trace FILE, issue 33): a production trace in Mooncake's format replayed open
//    loop, each request at its timestamp times --time-scale, its prompt the token blocks of
//    its hash ids (cluster_trace.h) sent as token ids to /v1/completions with max_tokens =
//    its output length and ignore_eos; scored against the trace's ideal hit.
//
// With --simulate PROFILE every spawned worker is `strata serve --simulate PROFILE`
// (docs/simulation.md), so that dozens of them run on a few cores.
//
// Each workload starts from cold workers and a fresh router, so that no policy inherits
// another's cache. Every request is streamed; the router's x-strata-worker header says
// where it went, `usage` what was cached there, and the router's /metrics (read before and
// after) what it predicted and how long requests queued. Figures, checks and files:
// cluster_results.h. With --router URL, the workloads run against that router as it is
// (one policy; no failure workload, which needs to kill a worker).
//
// Threads: run_cluster() runs on the main thread, which also starts, kills and restarts
// the processes; requests run on their own threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/cluster_results.h"
#include "bench/cluster_trace.h"
#include "bench/cluster_workload.h"
#include "bench/target.h"
#include "common/result.h"

namespace strata::bench {

struct ClusterOptions {
  TargetOptions target;  // --spawn --model (workers and routers), or --router URL (as url)
  RunOptions run;
  int32_t workers = 3;              // spawned workers, in [1, router::kMaxWorkers = 1,024]
  int64_t worker_kv_tokens = 4096;  // each worker's --kv-cache-tokens, >= 256
  int32_t worker_threads = 1;       // each worker's --threads, >= 1
  std::string simulate_profile;     // --simulate: every worker simulated on this profile
  std::vector<std::string> policies = {"round-robin", "least-loaded", "approximate", "precise",
                                       "default"};
  std::vector<std::string> workloads = {kSharedPrefix, kAgentic, kFailure};
  std::vector<std::string> router_args;  // --router-arg: to every spawned router
  int32_t max_tokens = 12;               // generated per request (ignore_eos), >= 2
  double prefix_kv_fraction = 0.7;       // shared prefixes / cluster device KV, in (0, 4]
  SharedPrefixShape shared = {.groups = 6,
                              .users_per_group = 4,
                              .prefix_tokens = 1024,  // sized at run time from the pools
                              .question_min_tokens = 20,
                              .question_max_tokens = 60,
                              .rates_per_s = {1, 2},
                              .requests_per_rate = 12};
  AgenticShape agentic = {.sessions = 9,
                          .session_rate_per_s = 0.5,
                          .boilerplate_tokens = 1200,
                          .task_min_tokens = 60,
                          .task_max_tokens = 150,
                          .tool_calls = 3,
                          .pause_min_s = 1,
                          .pause_max_s = 3,
                          .tool_result_min_tokens = 30,
                          .tool_result_max_tokens = 100};
  double failure_duration_s = 24;           // sessions of workload 3 arrive over this, > 0
  double failure_session_rate_per_s = 0.6;  // new sessions per second of workload 3, > 0
  double kill_at = 0.3;                     // fraction of the duration when a worker is killed
  double restart_at = 0.55;    // fraction when it is restarted, kill_at < restart_at < 1
  double join_timeout_s = 60;  // a router's workers must all have joined by then
  // Workload 4 (cluster_trace.h).
  std::string trace_path;                             // --trace: a Mooncake-format trace
  int64_t trace_block_tokens = kMooncakeBlockTokens;  // tokens per hash id, >= 1
  double time_scale = 1;                              // arrivals times this, in (0, 1000]
  int64_t trace_limit = 0;                            // the first N requests; 0: all
  // --trace-sessions: each request carries its prefix family as session_id, so that the
  // default policy's session bindings apply (Mooncake's format has no sessions).
  bool trace_sessions = false;
  // --retry-refused: a trace request answered 429/503 is sent again after its Retry-After
  // (at most 20 times), as a client would; without it, a refusal is the request's end.
  bool retry_refused = false;
  // Router replicas (issue 33): --routers N spawned `strata route` in front of the same
  // workers, each request through one of them in turn; --session-store URL (a Redis every
  // replica shares bindings through; needed for N > 1) and --kill-router-at F (the first
  // replica killed when the trace's arrivals reach F of their span; 0: never).
  int32_t routers = 1;  // in [1, 16]
  std::string session_store;
  double kill_router_at = 0;  // in [0, 1)
  ClusterTargets targets;
};

// Each worker's --kv-cache-tokens for a trace when none is given: about what one H100
// (80 GB) holds for Qwen3-8B in BF16 (16 GB of weights, 90 % of the memory used, 144 KiB of
// KV per token), the model and GPU of profiles/h100-qwen3-8b.json.
inline constexpr int64_t kTraceWorkerKvTokens = 360'000;

void apply_quick(ClusterOptions& o);
Status validate(const ClusterOptions& o);
// The router's arguments of a policy name (round-robin, least-loaded, approximate,
// precise, default, default-no-floor = default with --load-floor-bonus 0).
Result<std::vector<std::string>> policy_router_args(const std::string& policy);
// Exit code: 0 done, 1 a phase sent no successful request or, with --check, a target was
// missed; 2 an error.
int run_cluster(const ClusterOptions& o);

}  // namespace strata::bench
