// The depth sweep's results, apart from running it: the checks on a record, the summary
// table and results.json, from hand-made runs (no server).
#include "bench/depth_sweep_results.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace strata::bench {
namespace {

DepthRun run(SweepPhase phase, int32_t depth, double ttft_s, int64_t cached, int64_t reusable) {
  DepthRun r;
  r.phase = phase;
  r.depth = depth;
  r.ttft_s = ttft_s;
  r.prompt_tokens = reusable + 20;
  r.new_tokens = 20;
  r.reusable_tokens = reusable;
  r.cached_tokens = cached;
  r.capacity_pages = 100;
  r.target_evicted_pages = 300;
  r.evicted_pages = 320;
  r.flood_cycled = true;
  r.blocks_pinned = 7;
  return r;
}

SweepRecord two_phases() {
  SweepRecord s;
  s.phases = {SweepPhase::kBaseline, SweepPhase::kPinned};
  s.depths = {0, 2};
  s.model = "m";
  s.runs = {
      run(SweepPhase::kBaseline, 0, 0.4, 0, 1000), run(SweepPhase::kBaseline, 2, 0.8, 0, 2000),
      run(SweepPhase::kPinned, 0, 0.1, 1000, 1000), run(SweepPhase::kPinned, 2, 0.2, 1990, 2000)};
  DepthRun skipped;
  skipped.phase = SweepPhase::kTierPinned;
  skipped.depth = 0;
  skipped.skipped = true;
  skipped.skip_reason = "no host tier";
  s.runs.push_back(skipped);
  return s;
}

TEST(DepthSweepResultsTest, OnlyPinnedPhasesPin) {
  EXPECT_FALSE(pins_vip(SweepPhase::kBaseline));
  EXPECT_TRUE(pins_vip(SweepPhase::kPinned));
  EXPECT_TRUE(pins_vip(SweepPhase::kTierPinned));
}

TEST(DepthSweepResultsTest, PhaseTtftsSkipSkippedRuns) {
  const SweepRecord s = two_phases();
  EXPECT_EQ(phase_ttfts(s, SweepPhase::kPinned), (std::vector<double>{0.1, 0.2}));
  EXPECT_TRUE(phase_ttfts(s, SweepPhase::kTierPinned).empty());
}

TEST(DepthSweepResultsTest, ChecksFloodAlwaysTargetsOnlyWithCheck) {
  DepthSweepOptions o;
  const SweepRecord s = two_phases();
  EXPECT_EQ(sweep_checks(o, s).size(), 4u);  // one flood check per run that ran
  o.run.check = true;
  const std::vector<Check> checks = sweep_checks(o, s);
  // + baseline evicted at depth 2 (not 0), + pinned prefix kept at depths 0 and 2.
  ASSERT_EQ(checks.size(), 7u);
  EXPECT_TRUE(all_passed(checks));
  SweepRecord lost = s;
  lost.runs[3].cached_tokens = 1000;  // half the pinned prefix recomputed
  EXPECT_FALSE(all_passed(sweep_checks(o, lost)));
}

TEST(DepthSweepResultsTest, SummaryHasOneRowPerDepthAndSpeedups) {
  const Table t = sweep_summary_table(two_phases());
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_EQ(t.header[3], "BL TTFT");
  EXPECT_EQ(t.header[4], "PIN TTFT");
  EXPECT_EQ(t.header[5], "Speedup PIN");
  EXPECT_EQ(t.rows[1][0], "2");
  EXPECT_EQ(t.rows[1][5], format_ratio(4.0));
}

TEST(DepthSweepResultsTest, ResultsJsonRecordsRunsAndVerdict) {
  DepthSweepOptions o;
  const SweepRecord s = two_phases();
  const auto j = sweep_results_json(o, s, sweep_checks(o, s));
  EXPECT_EQ(j["scenario"], "depth-sweep");
  EXPECT_EQ(j["runs"].size(), 5u);
  EXPECT_EQ(j["runs"][4]["skip_reason"], "no host tier");
  EXPECT_EQ(j["speedups"].size(), 2u);
  EXPECT_TRUE(j["passed"].get<bool>());
  SweepRecord failed = s;
  failed.error = "boom";
  EXPECT_FALSE(sweep_results_json(o, failed, {})["passed"].get<bool>());
}

}  // namespace
}  // namespace strata::bench
