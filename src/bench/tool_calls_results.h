// The results of a tool-calls run (tool_calls.h), apart from running it: the record of
// every resumed turn and its pause, the per-arm summaries, the pool-cycle arithmetic of the
// pressured variant, the checks against the targets, the summary table and the files
// written from them (results.json, tool_calls_ttft.svg, summary.md). The runner
// (tool_calls.cc) fills a ToolCallsRecord; the functions here only read it.
//
// Pure functions apart from write_tool_calls_outputs() (writes files); call them from the
// thread that owns the record.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/http_client.h"
#include "bench/report.h"
#include "bench/stats.h"
#include "bench/tool_calls.h"
#include "common/result.h"

namespace strata::bench {

// What left the device pool while one agent was paused: the growth of /cache/state's
// counters from the pause's start (after tool_start) to its end (before tool_end). Counts
// every page the server evicted, whoever owned it.
struct PauseEvictions {
  int64_t evicted_pages = 0;       // device pages freed or demoted (evicted_pages_total)
  int64_t demoted_pages = 0;       // of which demoted to the host (demoted_pages_total)
  int64_t host_evicted_pages = 0;  // host pages dropped (host_evicted_pages_total)
  int64_t target_pages = 0;        // what the pressure had to evict; 0 without pressure
  double cycled_after_s = -1;      // pause start -> target reached; -1 when it was not
  bool target_reached() const { return target_pages == 0 || evicted_pages >= target_pages; }
};

// One resumed turn (the one that carries a tool's answer) and the pause before it.
struct ResumedTurn {
  int32_t agent = 0;
  int32_t call = 0;
  bool with_api = false;
  double drawn_pause_s = 0;           // the pause drawn from the range
  double pause_s = 0;                 // as it lasted (longer under pressure: until the pool cycled)
  double tool_start_s = 0;            // latency of POST /session/tool_start
  double tool_end_s = 0;              // latency of POST /session/tool_end
  nlohmann::ordered_json tool_start;  // the answers
  nlohmann::ordered_json tool_end;
  bool restore_failed = false;  // tool_end answered 503
  double ttft_s = 0;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  CachedTiers cached;
  PauseEvictions evictions;
};

// The device and host pools, from /cache/state at the start.
struct PoolSize {
  int64_t page_size = 0;
  int64_t device_pages = 0;  // > 0
  int64_t host_pages = 0;    // 0 without a host tier
};

// The pressure requests of a whole run.
struct PressureTotals {
  int64_t prompt_tokens_target = 0;  // each request's prompt, as run
  int64_t request_cap = 0;
  int64_t requests = 0;  // completed
  int64_t failed = 0;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // should stay near 0: the prompts share no prefix
  std::string first_error;
};

// What a run measured (a partial record after an error or an interrupt).
struct ToolCallsRecord {
  std::string model;
  nlohmann::ordered_json machine;      // machine_info()
  nlohmann::ordered_json server;       // url, argv, log
  nlohmann::ordered_json first_state;  // /cache/state at the start
  PoolSize pool;
  int64_t evicted_pages_during_run = -1;  // -1: the last /cache/state read failed
  int64_t background_requests = 0;
  PressureTotals pressure;
  std::vector<ResumedTurn> turns;  // in the order they completed
  std::string error;               // why the run stopped early; "" if it did not
};

// Pages the pressure must evict in one pause: ceil(cycles * device_pages); 0 for cycles 0.
int64_t pressure_target_pages(double cycles, int64_t device_pages);
// How many pools `pages` make: pages / pool_pages (0 for an empty pool).
double pool_cycles(int64_t pages, int64_t pool_pages);
// The pressure prompt as run: the option, at most a quarter of the device pool, >= 16.
int64_t pressure_prompt_tokens(int64_t option_tokens, int64_t device_tokens);
// A bound on the pressure requests of a run: four times what `pauses` pauses need if none
// overlapped (each fills the pool, then evicts `cycles` pools), and at least 16.
int64_t pressure_request_cap(double cycles, int64_t device_tokens, int64_t prompt_tokens,
                             int64_t pauses);

struct ArmSummary {
  std::string name;
  Summary ttft;
  Summary resume;  // tool_end + TTFT
  Summary tool_end;
  double cached_fraction = 0;
  double host_cached_mean = 0;
  int64_t failed_restores = 0;
  Summary pool_cycles;  // device pools evicted per pause
};

ArmSummary summarize_arm(const std::vector<ResumedTurn>& turns, const PoolSize& pool,
                         bool with_api);

// Device and host pool cycles per pause over both arms.
struct CycleSummary {
  int64_t pauses = 0;
  int64_t pauses_cycled = 0;  // that reached their target
  int64_t evicted_pages = 0;  // summed over the pauses (overlapping pauses count twice)
  int64_t demoted_pages = 0;
  Summary device_cycles;  // per pause
  Summary host_cycles;    // per pause; NaN-free zeros without a host tier
};

CycleSummary summarize_cycles(const std::vector<ResumedTurn>& turns, const PoolSize& pool);

// with.resume.p50 / without.resume.p50; NaN when either is missing or without's is 0.
double resume_ratio(const ArmSummary& with, const ArmSummary& without);

// The pressured run's validity: the pool was cycled in every pause (exit code 1 if not,
// --check or not). Empty without pressure.
std::vector<Check> cycle_checks(const ToolCallsOptions& o, const ToolCallsRecord& r);
// The targets: without pressure, tool_end p50 and the resume ratio; with
// pressure, the pressured resume ratio. Always reported; fail the run only with --check.
std::vector<Check> target_checks(const ToolCallsOptions& o, const ToolCallsRecord& r);

// One row per arm: resumed turns, TTFT, tool_end, resume time, cached shares, failed
// restores, pool cycles per pause.
Table arms_table(const std::vector<ArmSummary>& arms);

// The content of results.json.
nlohmann::ordered_json tool_calls_results_json(const ToolCallsOptions& o, const ToolCallsRecord& r,
                                               const std::vector<Check>& checks);

// The Markdown summary (table, resume ratio, pressure lines, checks).
std::string tool_calls_summary_markdown(const ToolCallsOptions& o, const ToolCallsRecord& r,
                                        const std::vector<Check>& checks);

// Writes results.json, tool_calls_ttft.svg and summary.md to o.run.out_dir.
Status write_tool_calls_outputs(const ToolCallsOptions& o, const ToolCallsRecord& r,
                                const std::vector<Check>& checks);

}  // namespace strata::bench
