// `strata bench depth-sweep`: the seed's V5 experiment. A VIP conversation with a long
// system prompt is warmed through turn D; in the pinned phases its blocks are pinned by the
// hashes a KV event subscriber saw stored while it warmed (as a router would); a flood of
// other multi-turn conversations then cycles the device cache `flood_factor` times
// (computed from /cache/state's capacity and verified by its eviction counter); once the
// flood has drained, turn D+1 is sent and its TTFT and cached tokens (per tier) measured.
// Phases: baseline (no pin), pinned, tier-pinned (hierarchical cache: the flood may demote
// the pinned blocks to the host pool, never drop them).
//
// Threads: run_depth_sweep() runs on the calling (main) thread and starts the flood's
// worker threads itself.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/conversation.h"
#include "bench/target.h"
#include "common/result.h"

namespace strata::bench {

enum class SweepPhase { kBaseline, kPinned, kTierPinned };

std::string_view phase_name(SweepPhase p);
Result<SweepPhase> parse_phase(std::string_view name);

struct DepthSweepOptions {
  TargetOptions target;
  RunOptions run;
  std::vector<int32_t> depths = {0, 2, 6, 10, 16};  // turns warmed before the measured one
  std::vector<std::string> phases = {"baseline", "pinned", "tier-pinned"};
  int32_t flood_concurrency = 4;     // simultaneous flood users, >= 1
  double flood_factor = 3;           // device capacities the flood must evict, > 0
  int32_t flood_max_tokens = 4;      // tokens each flood request generates, >= 1
  double flood_request_cap = 4;      // stop the flood at this many times the requests the
                                     // capacity calls for (the check then fails), >= 1
  int64_t vip_system_tokens = 3000;  // the VIP's system prompt, in tokens, >= 16
  int32_t measure_max_tokens = 8;    // tokens the measured turn generates, >= 1
  double hicache_ratio = 2;          // --hicache-ratio of a spawned tier-pinned server
  // VIP turn lengths (its system prompt and turn count come from the fields above).
  ConversationShape vip_shape{
      .system_min_tokens = 3000, .system_max_tokens = 3000, .min_turns = 18, .max_turns = 18};
  ConversationShape flood_shape;      // the defaults: 300-800 system, 20-30 turns
  double baseline_max_cached = 0.05;  // --check: baseline cached fraction at depth > 0
  double pinned_min_cached = 0.99;    // --check: pinned cached / (prompt - new turn)
};

// The --quick configuration: depths 0 2, baseline and pinned (tier-pinned when the server
// has a host tier), short turns, a short system prompt, a small flood, checks on.
void apply_quick(DepthSweepOptions& o);

Status validate(const DepthSweepOptions& o);

// Runs the sweep, writes results.json, the charts and summary.md to run.out_dir, prints
// the summary table. Exit code: 0 all checks passed, 1 a check failed, 2 an error.
int run_depth_sweep(const DepthSweepOptions& o);

}  // namespace strata::bench
