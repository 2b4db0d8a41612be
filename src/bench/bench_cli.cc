#include "bench/bench_cli.h"

#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bench/agentic_trace.h"
#include "bench/cluster.h"
#include "bench/depth_sweep.h"
#include "bench/load.h"
#include "bench/tool_calls.h"

namespace strata::bench {

namespace {

void add_common_options(CLI::App* cmd, TargetOptions& t, RunOptions& r,
                        const std::string& scenario) {
  cmd->add_option("--url", t.url, "A running server, e.g. http://127.0.0.1:8000");
  cmd->add_flag("--spawn", t.spawn,
                "Start `strata serve` (one per phase where the scenario needs a fresh cache) "
                "and stop it afterwards");
  cmd->add_option("--model", t.model_dir,
                  "Model folder: served with --spawn; its tokenizer counts the generated "
                  "conversations (else POST /tokenize of --url)");
  cmd->add_option("--server-arg", t.server_args,
                  "An argument for the spawned `strata serve` (repeat; each is split at "
                  "spaces), e.g. --server-arg=--kv-cache-tokens --server-arg=4096")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->expected(1)
      ->allow_extra_args(false);
  cmd->add_option("--strata-bin", t.strata_bin,
                  "The strata executable to spawn (default: this one)");
  cmd->add_option("--api-key", t.api_key, "The server's --admin-api-key, if it has one");
  cmd->add_option("--start-timeout-s", t.start_timeout_s,
                  "Seconds a spawned server may take to answer /health")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  r.out_dir = "out/bench/" + scenario;
  cmd->add_option("--out", r.out_dir, "Output folder: results.json, SVG charts, summary.md, logs")
      ->capture_default_str();
  cmd->add_option("--seed", r.seed, "Seed of every generated conversation and pause")
      ->capture_default_str();
  cmd->add_flag("--quick", r.quick, "A small, fast configuration (tiny model, seconds)");
  cmd->footer("Exit code: 0 done (all checks passed), 1 a check failed, 2 an error.");
}

// With --quick, options the user did not give take the quick configuration's value.
template <typename Options>
void overlay_quick(
    CLI::App* cmd, Options& o,
    const std::vector<std::pair<std::string, std::function<void(Options&, const Options&)>>>&
        fields) {
  if (!o.run.quick) return;
  Options quick = o;
  apply_quick(quick);
  const Options given = o;
  o = quick;
  for (const auto& [name, copy] : fields) {
    if (cmd->count(name) > 0) copy(o, given);
  }
}

void add_depth_sweep(CLI::App& bench, int& exit_code) {
  auto o = std::make_shared<DepthSweepOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "depth-sweep",
      "TTFT of a VIP conversation's next turn after a cache-cycling flood, by depth, with and "
      "without pinning its blocks");
  add_common_options(cmd, o->target, o->run, "depth-sweep");
  cmd->add_option("--kv-events-endpoint", o->target.kv_events_endpoint,
                  "KV events of the --url server (needed by the pinned phases), e.g. "
                  "tcp://127.0.0.1:5557");
  cmd->add_option("--depths", o->depths, "Conversation depths (turns warmed)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--phases", o->phases, "baseline, pinned, tier-pinned")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--flood-concurrency", o->flood_concurrency, "Simultaneous flood users")
      ->capture_default_str();
  cmd->add_option("--flood-factor", o->flood_factor,
                  "Device cache capacities the flood must evict (checked by the server's "
                  "eviction counter)")
      ->capture_default_str();
  cmd->add_option("--flood-max-tokens", o->flood_max_tokens, "Tokens each flood request generates")
      ->capture_default_str();
  cmd->add_option("--flood-request-cap", o->flood_request_cap,
                  "Give up (check fails) after this many times the flood requests the "
                  "capacity calls for")
      ->capture_default_str();
  cmd->add_option("--vip-system-tokens", o->vip_system_tokens, "The VIP's system prompt in tokens")
      ->capture_default_str();
  cmd->add_option("--measure-max-tokens", o->measure_max_tokens,
                  "Tokens the measured turn generates")
      ->capture_default_str();
  cmd->add_option("--hicache-ratio", o->hicache_ratio,
                  "--hicache-ratio of the spawned tier-pinned servers")
      ->capture_default_str();
  cmd->add_flag("--check", o->run.check,
                "Fail unless baseline is evicted (<= 5 % cached at depth > 0) and pinned phases "
                "keep >= 99 % of the reusable prompt (on with --quick)");
  cmd->callback([o, cmd, &exit_code] {
    using F = std::function<void(DepthSweepOptions&, const DepthSweepOptions&)>;
    overlay_quick<DepthSweepOptions>(
        cmd, *o,
        {{"--depths", F([](auto& a, const auto& b) { a.depths = b.depths; })},
         {"--phases", F([](auto& a, const auto& b) { a.phases = b.phases; })},
         {"--flood-concurrency",
          F([](auto& a, const auto& b) { a.flood_concurrency = b.flood_concurrency; })},
         {"--flood-max-tokens",
          F([](auto& a, const auto& b) { a.flood_max_tokens = b.flood_max_tokens; })},
         {"--vip-system-tokens",
          F([](auto& a, const auto& b) { a.vip_system_tokens = b.vip_system_tokens; })},
         {"--measure-max-tokens",
          F([](auto& a, const auto& b) { a.measure_max_tokens = b.measure_max_tokens; })}});
    exit_code = run_depth_sweep(*o);
  });
}

void add_tool_calls(CLI::App& bench, int& exit_code) {
  auto o = std::make_shared<ToolCallsOptions>();
  CLI::App* cmd =
      bench.add_subcommand("tool-calls",
                           "TTFT of agent turns resumed after tool pauses, with and without "
                           "/session/tool_start and /session/tool_end, under background traffic");
  add_common_options(cmd, o->target, o->run, "tool-calls");
  cmd->add_option("--agents", o->agents, "Concurrent agent sessions (half use the session API)")
      ->capture_default_str();
  cmd->add_option("--tool-calls", o->tool_calls, "Tool pauses per agent")->capture_default_str();
  auto pause = std::make_shared<std::vector<double>>();
  cmd->add_option("--tool-pause-s", *pause,
                  "MIN,MAX of the tool pauses in seconds (uniform, seeded; default 1,6)")
      ->delimiter(',')
      ->expected(2);
  cmd->add_option("--agent-max-tokens", o->agent_max_tokens, "Tokens of each model turn")
      ->capture_default_str();
  cmd->add_option("--agent-system-tokens", o->agent_system_tokens,
                  "The agents' system prompt in tokens")
      ->capture_default_str();
  cmd->add_option("--background-concurrency", o->background_concurrency,
                  "Users of the other traffic")
      ->capture_default_str();
  cmd->add_option("--pressure-cycles", o->pressure_cycles,
                  "The pressured variant: fresh-prompt requests during every tool pause, which "
                  "lasts until this many device pools were evicted (the server's eviction "
                  "counter); 0: off")
      ->capture_default_str();
  cmd->add_option("--pressure-concurrency", o->pressure_concurrency,
                  "Simultaneous pressure requests")
      ->capture_default_str();
  cmd->add_option("--pressure-prompt-tokens", o->pressure_prompt_tokens,
                  "Each pressure request's fresh prompt in tokens (at most a quarter of the "
                  "device pool)")
      ->capture_default_str();
  cmd->add_option("--pressure-timeout-s", o->pressure_timeout_s,
                  "The longest a pause waits for its pool cycles (the check then fails)")
      ->capture_default_str();
  cmd->add_flag("--check", o->run.check,
                "Exit 1 when a target is missed: resumed turn with/without p50 <= 1.0 and "
                "tool_end p50 <= 100 ms, or with --pressure-cycles <= 0.3 (the pool-cycled "
                "check always counts)");
  cmd->callback([o, cmd, pause, &exit_code] {
    using F = std::function<void(ToolCallsOptions&, const ToolCallsOptions&)>;
    if (pause->size() == 2) {
      o->pause_min_s = (*pause)[0];
      o->pause_max_s = (*pause)[1];
    }
    overlay_quick<ToolCallsOptions>(
        cmd, *o,
        {{"--agents", F([](auto& a, const auto& b) { a.agents = b.agents; })},
         {"--tool-calls", F([](auto& a, const auto& b) { a.tool_calls = b.tool_calls; })},
         {"--tool-pause-s", F([](auto& a, const auto& b) {
            a.pause_min_s = b.pause_min_s;
            a.pause_max_s = b.pause_max_s;
          })},
         {"--agent-max-tokens",
          F([](auto& a, const auto& b) { a.agent_max_tokens = b.agent_max_tokens; })},
         {"--agent-system-tokens",
          F([](auto& a, const auto& b) { a.agent_system_tokens = b.agent_system_tokens; })},
         {"--background-concurrency",
          F([](auto& a, const auto& b) { a.background_concurrency = b.background_concurrency; })},
         {"--pressure-prompt-tokens",
          F([](auto& a, const auto& b) { a.pressure_prompt_tokens = b.pressure_prompt_tokens; })},
         {"--pressure-timeout-s",
          F([](auto& a, const auto& b) { a.pressure_timeout_s = b.pressure_timeout_s; })}});
    exit_code = run_tool_calls(*o);
  });
}

void add_load(CLI::App& bench, int& exit_code) {
  auto o = std::make_shared<LoadOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "load",
      "Concurrency sweep of multi-turn chat: TTFT and inter-token latency percentiles, "
      "throughput, cache hit rate");
  add_common_options(cmd, o->target, o->run, "load");
  cmd->add_option("--concurrency", o->concurrency, "Concurrent users per level")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--requests-per-level", o->requests_per_level, "Requests sent at each level")
      ->capture_default_str();
  cmd->add_option("--max-tokens", o->max_tokens, "Tokens generated per request")
      ->capture_default_str();
  cmd->callback([o, cmd, &exit_code] {
    using F = std::function<void(LoadOptions&, const LoadOptions&)>;
    overlay_quick<LoadOptions>(
        cmd, *o,
        {{"--concurrency", F([](auto& a, const auto& b) { a.concurrency = b.concurrency; })},
         {"--requests-per-level",
          F([](auto& a, const auto& b) { a.requests_per_level = b.requests_per_level; })},
         {"--max-tokens", F([](auto& a, const auto& b) { a.max_tokens = b.max_tokens; })}});
    exit_code = run_load(*o);
  });
}

void add_cluster(CLI::App& bench, int& exit_code) {
  auto o = std::make_shared<ClusterOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "cluster",
      "Routing policies side by side: N `strata serve` workers behind one `strata route` per "
      "policy, on shared-prefix groups, agentic sessions, a worker killed and restarted, or a "
      "production trace (--trace)");
  add_common_options(cmd, o->target, o->run, "cluster");
  cmd->add_option("--router", o->target.url,
                  "A running `strata route` (instead of --spawn): its policy as it runs, no "
                  "failure workload");
  cmd->add_option("--workers", o->workers,
                  "Spawned workers, at most 1,024 (--server-arg goes to each)")
      ->capture_default_str();
  cmd->add_option("--worker-kv-tokens", o->worker_kv_tokens,
                  "Each worker's --kv-cache-tokens (small, so that placement matters; with "
                  "--trace the default is 360,000, about an H100's for an 8B model)")
      ->capture_default_str();
  cmd->add_option("--simulate", o->simulate_profile,
                  "Spawn simulated workers: `strata serve --simulate PROFILE` "
                  "(docs/simulation.md), dozens of them on a few cores");
  cmd->add_option("--trace", o->trace_path,
                  "Replay a Mooncake-format trace (JSON lines: timestamp ms, input_length, "
                  "output_length, hash_ids); the workload is then `trace` unless --workloads "
                  "says otherwise");
  cmd->add_option("--trace-block-tokens", o->trace_block_tokens,
                  "Tokens per hash id of the trace (Mooncake's: 512)")
      ->capture_default_str();
  cmd->add_option("--time-scale", o->time_scale,
                  "Trace arrivals at timestamp times this (0.1: ten times faster)")
      ->capture_default_str();
  cmd->add_option("--trace-limit", o->trace_limit,
                  "Replay only the trace's first N requests (0: all)")
      ->capture_default_str();
  cmd->add_flag("--trace-sessions", o->trace_sessions,
                "Send each trace request's prefix family as its session_id (the format has no "
                "sessions), so that session bindings apply");
  cmd->add_flag("--retry-refused", o->retry_refused,
                "Trace: send a request refused with 429/503 again after its Retry-After (at "
                "most 20 times), as a client would");
  cmd->add_option("--routers", o->routers,
                  "Router replicas in front of the same workers, requests through each in turn "
                  "(> 1 needs --session-store)")
      ->capture_default_str();
  cmd->add_option("--session-store", o->session_store,
                  "redis://HOST:PORT the spawned routers share session bindings through");
  cmd->add_option("--kill-router-at", o->kill_router_at,
                  "Trace: kill the first router replica (SIGKILL) when arrivals reach this "
                  "fraction of their span; its clients go through the others (0: never)")
      ->capture_default_str();
  cmd->add_option("--worker-threads", o->worker_threads, "Each worker's --threads")
      ->capture_default_str();
  cmd->add_option("--policies", o->policies,
                  "round-robin, least-loaded, approximate, precise, default, default-no-floor "
                  "(default with --load-floor-bonus 0)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--workloads", o->workloads, "shared-prefix, agentic, failure, trace")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--router-arg", o->router_args,
                  "An argument for every spawned `strata route` (repeat; split at spaces)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->expected(1)
      ->allow_extra_args(false);
  cmd->add_option("--max-tokens", o->max_tokens,
                  "Tokens generated per request (the trace's: its output_length)")
      ->capture_default_str();
  cmd->add_option("--prefix-kv-fraction", o->prefix_kv_fraction,
                  "Shared-prefix: the prefixes together, as a fraction of the cluster's device KV")
      ->capture_default_str();
  cmd->add_option("--groups", o->shared.groups, "Shared-prefix: groups (distinct prefixes)")
      ->capture_default_str();
  cmd->add_option("--users-per-group", o->shared.users_per_group, "Shared-prefix: users per group")
      ->capture_default_str();
  cmd->add_option("--rates", o->shared.rates_per_s,
                  "Shared-prefix: Poisson arrival rates swept, requests per second")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--requests-per-rate", o->shared.requests_per_rate,
                  "Shared-prefix: requests at each rate")
      ->capture_default_str();
  cmd->add_option("--sessions", o->agentic.sessions, "Agentic: sessions")->capture_default_str();
  cmd->add_option("--session-rate", o->agentic.session_rate_per_s,
                  "Agentic: new sessions per second (Poisson)")
      ->capture_default_str();
  cmd->add_option("--boilerplate-tokens", o->agentic.boilerplate_tokens,
                  "Agentic and failure: the system prompt every session shares")
      ->capture_default_str();
  cmd->add_option("--tool-calls", o->agentic.tool_calls,
                  "Agentic and failure: tool pauses per session")
      ->capture_default_str();
  auto pause = std::make_shared<std::vector<double>>();
  cmd->add_option("--tool-pause-s", *pause,
                  "MIN,MAX of the tool pauses in seconds (uniform, seeded; default 1,3)")
      ->delimiter(',')
      ->expected(2);
  cmd->add_option("--failure-duration-s", o->failure_duration_s,
                  "Failure: seconds over which sessions arrive")
      ->capture_default_str();
  cmd->add_option("--failure-session-rate", o->failure_session_rate_per_s,
                  "Failure: new sessions per second")
      ->capture_default_str();
  cmd->add_option("--kill-at", o->kill_at, "Failure: when the busiest worker is killed (fraction)")
      ->capture_default_str();
  cmd->add_option("--restart-at", o->restart_at, "Failure: when it is restarted (fraction)")
      ->capture_default_str();
  cmd->add_flag("--check", o->run.check,
                "Exit 1 when a target is missed: shared-prefix default TTFT p90 <= 1/3 of "
                "round-robin's where it saturates and hit >= 0.9 of the reusable share; agentic "
                "sessions per worker >= half the mean and hit within 5 points of precise; "
                "failure: no failed request but those streaming on the killed worker, the "
                "restarted worker back within 10 s; trace: default hit >= 0.9 of the ideal, "
                "TTFT p99 <= 1/5 of round-robin's, prefix families per worker >= half the mean");
  cmd->callback([o, cmd, pause, &exit_code] {
    using F = std::function<void(ClusterOptions&, const ClusterOptions&)>;
    if (pause->size() == 2) {
      o->agentic.pause_min_s = (*pause)[0];
      o->agentic.pause_max_s = (*pause)[1];
    }
    overlay_quick<ClusterOptions>(
        cmd, *o,
        {{"--workers", F([](auto& a, const auto& b) { a.workers = b.workers; })},
         {"--worker-kv-tokens",
          F([](auto& a, const auto& b) { a.worker_kv_tokens = b.worker_kv_tokens; })},
         {"--policies", F([](auto& a, const auto& b) { a.policies = b.policies; })},
         {"--max-tokens", F([](auto& a, const auto& b) { a.max_tokens = b.max_tokens; })},
         {"--groups", F([](auto& a, const auto& b) { a.shared.groups = b.shared.groups; })},
         {"--users-per-group",
          F([](auto& a, const auto& b) { a.shared.users_per_group = b.shared.users_per_group; })},
         {"--rates",
          F([](auto& a, const auto& b) { a.shared.rates_per_s = b.shared.rates_per_s; })},
         {"--requests-per-rate", F([](auto& a, const auto& b) {
            a.shared.requests_per_rate = b.shared.requests_per_rate;
          })},
         {"--sessions", F([](auto& a, const auto& b) { a.agentic.sessions = b.agentic.sessions; })},
         {"--session-rate", F([](auto& a, const auto& b) {
            a.agentic.session_rate_per_s = b.agentic.session_rate_per_s;
          })},
         {"--boilerplate-tokens", F([](auto& a, const auto& b) {
            a.agentic.boilerplate_tokens = b.agentic.boilerplate_tokens;
          })},
         {"--tool-calls",
          F([](auto& a, const auto& b) { a.agentic.tool_calls = b.agentic.tool_calls; })},
         {"--tool-pause-s", F([](auto& a, const auto& b) {
            a.agentic.pause_min_s = b.agentic.pause_min_s;
            a.agentic.pause_max_s = b.agentic.pause_max_s;
          })},
         {"--failure-duration-s",
          F([](auto& a, const auto& b) { a.failure_duration_s = b.failure_duration_s; })},
         {"--failure-session-rate", F([](auto& a, const auto& b) {
            a.failure_session_rate_per_s = b.failure_session_rate_per_s;
          })}});
    // With --trace (after --quick, which would size the pools for its own workloads).
    if (!o->trace_path.empty()) {
      if (cmd->count("--workloads") == 0) o->workloads = {kTrace};
      if (cmd->count("--worker-kv-tokens") == 0) o->worker_kv_tokens = kTraceWorkerKvTokens;
    }
    exit_code = run_cluster(*o);
  });
}

// Writes an agentic trace (agentic_trace.h) for `bench cluster --trace`; prints its shape.
int write_agentic_trace(const AgenticTraceOptions& o, const std::string& path) {
  if (auto ok = validate(o); !ok) {
    std::fprintf(stderr, "strata bench make-trace: %s\n", ok.error().message.c_str());
    return 2;
  }
  const std::vector<AgenticTraceLine> lines = make_agentic_trace(o);
  {
    std::ofstream out(path, std::ios::trunc);
    write_trace_jsonl(out, lines);
    out.flush();
    if (!out) {
      std::fprintf(stderr, "strata bench make-trace: cannot write %s\n", path.c_str());
      return 2;
    }
  }
  std::vector<TraceRequest> requests;
  int64_t output_tokens = 0;
  for (const AgenticTraceLine& l : lines) {
    requests.push_back(l.request);
    output_tokens += l.request.output_tokens;
  }
  const TraceIdeal ideal = trace_ideal_hit(requests, o.block_tokens, 1);
  const double span_s = requests.back().timestamp_ms / 1000.0;
  std::printf(
      "%s: %lld sessions, %zu calls over %.1f s (%.1f calls/s), %lld prompt tokens (mean "
      "%.0f), %lld output tokens; ideal hit %.1f %% of prompt tokens\n",
      path.c_str(), static_cast<long long>(o.sessions), lines.size(), span_s,
      span_s > 0 ? static_cast<double>(lines.size()) / span_s : 0.0,
      static_cast<long long>(ideal.prompt_tokens),
      static_cast<double>(ideal.prompt_tokens) / static_cast<double>(lines.size()),
      static_cast<long long>(output_tokens), 100.0 * ideal.token_fraction());
  return 0;
}

void add_make_trace(CLI::App& bench, int& exit_code) {
  auto o = std::make_shared<AgenticTraceOptions>();
  auto path = std::make_shared<std::string>();
  CLI::App* cmd = bench.add_subcommand(
      "make-trace",
      "Write an agentic trace in Mooncake's format (plus session_id) for `bench cluster "
      "--trace`: agent sessions on shared system prompts whose prompts grow call by call "
      "(docs/benchmarks.md)");
  cmd->add_option("--out", *path, "The trace file to write (JSON lines)")->required();
  cmd->add_option("--sessions", o->sessions, "Agent sessions")->capture_default_str();
  cmd->add_option("--session-rate", o->session_rate_per_s,
                  "New sessions per second (Poisson arrivals)")
      ->capture_default_str();
  cmd->add_option("--templates", o->templates,
                  "Distinct system prompts with tool schemas, shared by the sessions")
      ->capture_default_str();
  cmd->add_option("--template-skew", o->template_skew,
                  "Zipf exponent of the sessions' choice of template (0: uniform)")
      ->capture_default_str();
  cmd->add_option("--template-tokens-min", o->template_tokens_min)->capture_default_str();
  cmd->add_option("--template-tokens-max", o->template_tokens_max)->capture_default_str();
  cmd->add_option("--task-tokens-min", o->task_tokens_min, "The user's task, own to a session")
      ->capture_default_str();
  cmd->add_option("--task-tokens-max", o->task_tokens_max)->capture_default_str();
  cmd->add_option("--calls-min", o->calls_min, "Model calls per session")->capture_default_str();
  cmd->add_option("--calls-max", o->calls_max)->capture_default_str();
  cmd->add_option("--output-tokens-min", o->output_tokens_min, "Each call's completion")
      ->capture_default_str();
  cmd->add_option("--output-tokens-max", o->output_tokens_max)->capture_default_str();
  cmd->add_option("--tool-tokens-min", o->tool_tokens_min,
                  "Each tool result, appended before the next call")
      ->capture_default_str();
  cmd->add_option("--tool-tokens-max", o->tool_tokens_max)->capture_default_str();
  cmd->add_option("--tool-seconds", o->tool_seconds_mean,
                  "Mean run time of a tool between two calls (exponential)")
      ->capture_default_str();
  cmd->add_option("--seconds-per-output-token", o->seconds_per_output_token,
                  "Expected answer time per output token, before the tool runs")
      ->capture_default_str();
  cmd->add_option("--max-prompt-tokens", o->max_prompt_tokens,
                  "A session ends before a call whose prompt would be longer")
      ->capture_default_str();
  cmd->add_option("--block-tokens", o->block_tokens,
                  "Tokens per hash id (replay with the same --trace-block-tokens)")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "Seed of every draw")->capture_default_str();
  cmd->footer("Exit code: 0 written, 2 an error.");
  cmd->callback([o, path, &exit_code] { exit_code = write_agentic_trace(*o, *path); });
}

}  // namespace

void add_bench_scenarios(CLI::App& bench, int& exit_code) {
  add_depth_sweep(bench, exit_code);
  add_tool_calls(bench, exit_code);
  add_load(bench, exit_code);
  add_cluster(bench, exit_code);
  add_make_trace(bench, exit_code);
}

}  // namespace strata::bench
