// The results of a cluster run (cluster.h), apart from running it: what every routed
// request did, the figures of one policy on one workload, the rate where round-robin
// saturates, the checks against the targets, the tables and the files written from
// them (results.json, summary.md, the SVG charts). The runner fills PhaseRecords; the
// functions here only read them.
//
// Pure functions apart from write_cluster_outputs() (writes files); call them from the
// thread that owns the records.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/report.h"
#include "bench/stats.h"
#include "common/result.h"

namespace strata::bench {

// Workload names, as on the command line and in results.json.
inline constexpr const char* kSharedPrefix = "shared-prefix";
inline constexpr const char* kAgentic = "agentic";
inline constexpr const char* kFailure = "failure";
// kTrace ("trace") is in cluster_trace.h.

// One request sent through the router.
struct RoutedRequest {
  int64_t session = -1;     // agentic and failure; trace: the prefix family; -1 for shared-prefix
  int32_t turn = 0;         // within the session (trace: 0 for a family's first request, else 1)
  int64_t trace_line = -1;  // trace: the request's line in the file
  int32_t group = -1;       // shared-prefix group; -1 otherwise
  double start_s = 0;       // sent, since the phase started
  double end_s = 0;         // answered (or failed)
  bool ok = false;
  int status = 0;              // the router's HTTP status; 0 when no answer came
  bool broken_stream = false;  // answered 200, then the stream failed
  std::string worker;          // x-strata-worker; "" when unknown
  double ttft_s = 0;
  std::vector<double> itl_s;  // gaps between content chunks
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // usage.prompt_tokens_details.cached_tokens
  int64_t completion_tokens = 0;
  // Router replicas (--routers): sent again through another replica after the first
  // refused the connection or broke before the answer's end (it was killed).
  int32_t router_failovers = 0;
  // --retry-refused: answers 429/503 waited out (their Retry-After) and sent again.
  int32_t refused_retries = 0;
  double retry_after_s = 0;     // the last refusal's Retry-After (0: none)
  int64_t reusable_tokens = 0;  // shared-prefix: what a perfect placement finds cached;
                                // trace: what one infinite cache would hit (the ideal)
  std::string error;
};

// Growth of the router's /metrics counters over a phase.
struct RouterCounters {
  double prompt_tokens = 0;            // strata_router_prompt_tokens_total
  double predicted_cached_tokens = 0;  // strata_router_predicted_cached_tokens_total
  double reported_cached_tokens = 0;   // strata_router_reported_cached_tokens_total
  double queued = 0;                   // strata_router_queued_total
  double queue_seconds_sum = 0;        // strata_router_queue_seconds_sum
  double queue_seconds_count = 0;      // strata_router_queue_seconds_count
  double retries = 0;                  // strata_router_retries_total
  double rejected = 0;                 // strata_router_rejected_total
  double streams_broken = 0;           // strata_router_streams_broken_total
  double decision_seconds_sum = 0;     // strata_router_decision_seconds_sum
  double decision_seconds_count = 0;   // strata_router_decision_seconds_count
  // strata_router_decision_seconds_bucket: upper bound (le, +inf for the last) -> count
  // of decisions at most that long (cumulative).
  std::map<double, double> decision_buckets;
};

// The upper bound of the histogram bucket holding the q-quantile (q in (0, 1]) of
// cumulative `buckets`; NaN when they count nothing. The true quantile is at most that.
double bucket_quantile(const std::map<double, double>& buckets, double q);

// The sum over every sample of each counter above in a Prometheus text exposition
// (labels ignored; a metric absent reads 0).
RouterCounters parse_router_metrics(const std::string& text);
RouterCounters operator-(const RouterCounters& a, const RouterCounters& b);

// One policy on one workload (on shared-prefix: at one rate).
struct PhaseRecord {
  std::string workload;
  std::string policy;
  std::vector<std::string> router_args;  // how that router was started
  double rate_per_s = 0;                 // shared-prefix: the level's arrival rate
  double arrival_span_s = 0;             // the last planned arrival (open loop)
  double wall_s = 0;                     // first send to last answer
  int64_t sessions_planned = 0;
  std::vector<std::string> workers;     // URLs, in the router's order
  std::vector<RoutedRequest> requests;  // in the order they ended
  RouterCounters router;                // summed over the router replicas alive at the phase's end
  int32_t routers = 1;                  // router replicas in front of the workers
  double killed_router_at_s = -1;       // --kill-router-at: when replica 1 was killed; -1: not
  // Trace: each worker's strata_kv_evicted_pages_total over the phase (the workers' order;
  // -1 where a worker did not answer); empty when they were not read.
  std::vector<int64_t> evicted_pages_per_worker;
  // Trace with --spawn: CPU seconds the router replicas and the workers used over the
  // phase (processes alive at both ends; -1: not measured). On a shared host, what the
  // cluster's processes took from one another.
  double router_cpu_s = -1;
  double worker_cpu_s = -1;
  // Failure workload: the killed worker (index into workers), when it was killed, and
  // when its restart answered /health, since the phase started; -1: not done.
  int32_t killed_worker = -1;
  double killed_at_s = -1;
  double restarted_at_s = -1;
  std::string error;  // why the phase stopped early; "" if it did not
};

// The figures of one phase.
struct PolicyFigures {
  std::string name;
  int64_t requests = 0;  // sent
  int64_t failed_requests = 0;
  Summary ttft;  // successful requests
  Summary itl;
  double wall_s = 0;
  double output_tokens_per_s = 0;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  double cache_hit_fraction = 0;             // cached / prompt tokens (usage), successful requests
  double reusable_fraction = 0;              // shared-prefix: reusable / prompt tokens
  double predicted_hit_fraction = 0;         // router: predicted cached / routed prompt tokens
  std::vector<int64_t> requests_per_worker;  // successful requests by worker
  std::vector<int64_t> sessions_per_worker;  // sessions by the worker of their first turn
  double queue_mean_s = 0;                   // router queue, over requests that waited
  int64_t queued = 0;
  int64_t retries = 0;           // moved: sent again to another worker before their first byte
  int64_t rejected = 0;          // answered 429 by the router
  int64_t router_failovers = 0;  // requests sent again through another router replica
  int32_t replicas = 1;          // router replicas (PhaseRecord::routers)
  int64_t refused_retries = 0;   // --retry-refused: refusals waited out and sent again
  std::vector<int64_t> evicted_pages_per_worker;  // trace (PhaseRecord's)
  double router_cpu_s = -1;                       // trace (PhaseRecord's)
  double worker_cpu_s = -1;                       // trace (PhaseRecord's)
  // Prompt tokens computed (not cached) by worker, successful requests: the prefill load.
  std::vector<int64_t> computed_tokens_per_worker;
  // The router's decisions over the phase: count, mean, and the bucket bounds of the
  // median and the 99th percentile (NaN when none was timed; +inf beyond the histogram's
  // last finite bound, decision_top_bound_s).
  int64_t decisions = 0;
  double decision_mean_s = 0;
  double decision_p50_s = 0;
  double decision_p99_s = 0;
  double decision_top_bound_s = 0;
  // Failure workload:
  int64_t failed_streaming_on_killed = 0;  // in flight on the killed worker when it died
  int64_t failed_other = 0;                // every other failure
  double back_after_s = -1;                // restart -> first request routed to it; -1: none was
};

PolicyFigures summarize_phase(const PhaseRecord& phase);

// max / min of the counts; NaN when a count is 0 or there are none.
double spread(const std::vector<int64_t>& counts);

// The shared-prefix level where round-robin saturates: the first whose TTFT p90 is at least
// twice the first level's, or whose answers took 1.5 times the arrivals' span; the last
// level when none does. `levels` are round-robin's phases by increasing rate; -1 if empty.
int32_t saturation_level(const std::vector<PhaseRecord>& levels);

// The targets (ratios within one run).
struct ClusterTargets {
  double max_ttft_p90_ratio = 1.0 / 3;    // shared-prefix: default / round-robin at saturation
  double min_hit_of_reusable = 0.9;       // shared-prefix: default's hit / reusable share
  double min_session_share = 0.5;         // agentic: every worker's new sessions / the mean
  double max_hit_drop = 0.05;             // agentic: precise's hit - default's hit
  double max_back_after_s = 10;           // failure: restart -> traffic again
  double min_hit_of_ideal = 0.9;          // trace: default's hit / the trace's ideal hit
  double max_trace_ttft_p99_ratio = 0.2;  // trace: default / round-robin TTFT p99
  double min_trace_session_share = 0.5;   // trace: every worker's prefix families / the mean
};

// Everything a run measured; the phases of every workload and policy.
struct ClusterRecord {
  std::string model;
  nlohmann::ordered_json machine;
  nlohmann::ordered_json parameters;  // options as run
  nlohmann::ordered_json cluster;     // workers, pool, page size, prefix sizing
  std::vector<PhaseRecord> phases;    // in the order they ran
  std::string error;
};

// The phases of one workload (and policy: "" for all), in run order.
std::vector<const PhaseRecord*> phases_of(const ClusterRecord& r, const std::string& workload,
                                          const std::string& policy = "");

// The policy whose agentic hit fraction the default's is held to: "default-no-floor" when
// it ran, else "precise".
std::string no_floor_reference(const ClusterRecord& r);

// The targets whose policies ran; always reported, failing the run only with --check.
std::vector<Check> cluster_checks(const ClusterRecord& r, const ClusterTargets& t);
// The run's validity, which counts with or without --check: every phase sent and completed
// requests, and none stopped on an error.
std::vector<Check> validity_checks(const ClusterRecord& r);

// One row per policy.
Table policies_table(const std::vector<PolicyFigures>& figures, bool failure_columns);

// The trace workload's row per policy (balance as min–max (mean) over the workers).
Table trace_table(const std::vector<PolicyFigures>& figures);

nlohmann::ordered_json cluster_results_json(const ClusterRecord& r,
                                            const std::vector<Check>& checks);
std::string cluster_summary_markdown(const ClusterRecord& r, const std::vector<Check>& checks);
// Writes results.json, summary.md and the charts (cluster_*.svg) to `out_dir`.
Status write_cluster_outputs(const std::string& out_dir, const ClusterRecord& r,
                             const std::vector<Check>& checks);

}  // namespace strata::bench
