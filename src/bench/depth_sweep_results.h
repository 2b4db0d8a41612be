// The results of a depth sweep (depth_sweep.h), apart from running it: the record of each
// (phase, depth) run, the checks on them, the summary table, and the files written from
// them (results.json, the TTFT and cached-share charts, summary.md). The runner
// (depth_sweep.cc) fills a SweepRecord; the functions here only read it.
//
// Pure functions apart from write_sweep_outputs() (writes files); call them from the
// thread that owns the record.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/conversation.h"
#include "bench/depth_sweep.h"
#include "bench/http_client.h"
#include "bench/report.h"
#include "common/result.h"

namespace strata::bench {

// One (phase, depth) measurement. Durations in seconds, sizes in tokens or pages as named.
struct DepthRun {
  SweepPhase phase = SweepPhase::kBaseline;
  int32_t depth = 0;
  bool skipped = false;
  std::string skip_reason;
  nlohmann::ordered_json server;  // url, argv, log, capacity

  // Warm-up of turns 0..D.
  int64_t warm_prompt_tokens = 0;
  int64_t warm_completion_tokens = 0;
  double warm_ttft_s = 0;
  double warm_e2e_s = 0;
  int64_t blocks_captured = 0;
  int64_t blocks_expected = 0;
  int64_t blocks_pinned = 0;

  // Flood.
  int64_t capacity_tokens = 0;
  int64_t capacity_pages = 0;
  int64_t page_size = 0;
  int64_t target_evicted_pages = 0;
  int64_t evicted_pages = 0;
  int64_t flood_requests = 0;
  int64_t flood_request_cap = 0;
  int64_t flood_prompt_tokens = 0;
  int64_t flood_cached_tokens = 0;
  double flood_s = 0;
  bool flood_cycled = false;
  int64_t auto_unpinned_blocks = 0;
  int64_t pinned_blocks_after_flood = 0;

  // Turn D+1.
  double ttft_s = std::numeric_limits<double>::quiet_NaN();
  double e2e_s = 0;
  int64_t prompt_tokens = 0;
  int64_t new_tokens = 0;       // the new turn: prompt - (warm prompt + reply + its end token)
  int64_t reusable_tokens = 0;  // prompt - new_tokens
  int64_t cached_tokens = 0;
  CachedTiers cached;

  // Cached share of the reusable prompt, in [0, 1]; NaN when nothing was reusable.
  double cached_fraction() const {
    return reusable_tokens > 0 ? static_cast<double>(cached_tokens) / reusable_tokens
                               : std::numeric_limits<double>::quiet_NaN();
  }
};

// What a sweep has measured so far (a partial record after an error or an interrupt).
struct SweepRecord {
  std::vector<SweepPhase> phases;           // as run: parsed, duplicates dropped, in order
  std::vector<int32_t> depths;              // as run: sorted, duplicates dropped
  std::shared_ptr<const Conversation> vip;  // the VIP conversation; null before it is made
  std::string model;                        // the served model's id ("" before a server)
  nlohmann::ordered_json machine;           // machine_info()
  nlohmann::ordered_json first_state;       // /cache/state of the first server, at start
  std::vector<DepthRun> runs;               // in the order run, skipped ones included
  std::string error;                        // why the sweep stopped early; "" if it did not
};

// Whether phase `p` pins the VIP's blocks (pinned and tier-pinned do, baseline does not).
bool pins_vip(SweepPhase p);

// TTFTs (seconds) of the runs of phase `p` that were not skipped, in the order run.
std::vector<double> phase_ttfts(const SweepRecord& s, SweepPhase p);

// The flood-cycled check of every run, then with --check the cached-share targets:
// baseline at most o.baseline_max_cached beyond depth 0, pinned phases at least
// o.pinned_min_cached.
std::vector<Check> sweep_checks(const DepthSweepOptions& o, const SweepRecord& s);

// One row per depth: prompt and new-turn tokens, then per phase TTFT, speedup over the
// baseline, cached share, host-cached tokens (tier-pinned) and blocks pinned.
Table sweep_summary_table(const SweepRecord& s);

// The content of results.json.
nlohmann::ordered_json sweep_results_json(const DepthSweepOptions& o, const SweepRecord& s,
                                          const std::vector<Check>& checks);

// Writes results.json, depth_sweep_ttft.svg, depth_sweep_cached.svg and summary.md to
// o.run.out_dir.
Status write_sweep_outputs(const DepthSweepOptions& o, const SweepRecord& s,
                           const std::vector<Check>& checks);

}  // namespace strata::bench
