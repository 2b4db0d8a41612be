// The tool-calls scenario's results, apart from running it: the pool-cycle arithmetic of
// the pressured variant, the per-arm summaries, the checks and what results.json and
// summary.md say, from hand-made turns (no server).
#include "bench/tool_calls_results.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

namespace strata::bench {
namespace {

ResumedTurn turn(int32_t agent, bool with_api, double ttft_s, double tool_end_s,
                 int64_t evicted_pages, int64_t target_pages) {
  ResumedTurn r;
  r.agent = agent;
  r.with_api = with_api;
  r.ttft_s = ttft_s;
  r.tool_end_s = tool_end_s;
  r.prompt_tokens = 1000;
  r.cached_tokens = with_api ? 990 : 0;
  r.cached.host = with_api ? 900 : 0;
  r.evictions.evicted_pages = evicted_pages;
  r.evictions.demoted_pages = evicted_pages / 2;
  r.evictions.host_evicted_pages = 10;
  r.evictions.target_pages = target_pages;
  return r;
}

ToolCallsRecord record(int64_t target_pages) {
  ToolCallsRecord r;
  r.model = std::string("m");
  r.machine = {{"cpu_model", "test CPU"}, {"cores", 2}};
  r.pool = PoolSize{.page_size = 16, .device_pages = 100, .host_pages = 400};
  r.turns = {turn(0, true, 0.1, 0.05, 250, target_pages),
             turn(0, true, 0.2, 0.05, 210, target_pages), turn(1, false, 1.0, 0, 300, target_pages),
             turn(1, false, 2.0, 0, 200, target_pages)};
  r.pressure.requests = 42;
  r.pressure.prompt_tokens_target = 256;
  r.pressure.prompt_tokens = 42 * 260;
  return r;
}

const Check* find(const std::vector<Check>& checks, const std::string& name) {
  for (const Check& c : checks) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

TEST(ToolCallsResultsTest, PoolCycleArithmetic) {
  EXPECT_EQ(pressure_target_pages(0, 100), 0);
  EXPECT_EQ(pressure_target_pages(2, 100), 200);
  EXPECT_EQ(pressure_target_pages(1.5, 101), 152);  // rounded up
  EXPECT_EQ(pressure_target_pages(1, 0), 0);
  EXPECT_DOUBLE_EQ(pool_cycles(250, 100), 2.5);
  EXPECT_DOUBLE_EQ(pool_cycles(5, 0), 0);
  // A quarter of the pool at most, 16 at least.
  EXPECT_EQ(pressure_prompt_tokens(1024, 16384), 1024);
  EXPECT_EQ(pressure_prompt_tokens(1024, 2048), 512);
  EXPECT_EQ(pressure_prompt_tokens(1024, 32), 16);
}

TEST(ToolCallsResultsTest, RequestCapCoversEveryPauseFourTimes) {
  EXPECT_EQ(pressure_request_cap(0, 16384, 1024, 16), 0);
  // (2 + 1) pools of 16,384 tokens in 1,024-token prompts: 48 per pause, x4, x16 pauses.
  EXPECT_EQ(pressure_request_cap(2, 16384, 1024, 16), 48 * 4 * 16);
  EXPECT_EQ(pressure_request_cap(0.01, 100, 50, 1), 16);  // the floor
}

TEST(ToolCallsResultsTest, TargetReachedOnlyWithEnoughEvictions) {
  PauseEvictions e;
  EXPECT_TRUE(e.target_reached());  // no pressure
  e.target_pages = 200;
  e.evicted_pages = 199;
  EXPECT_FALSE(e.target_reached());
  e.evicted_pages = 200;
  EXPECT_TRUE(e.target_reached());
}

TEST(ToolCallsResultsTest, ArmsSummarizeTheirOwnTurns) {
  const ToolCallsRecord r = record(200);
  const ArmSummary with = summarize_arm(r.turns, r.pool, true);
  const ArmSummary without = summarize_arm(r.turns, r.pool, false);
  EXPECT_EQ(with.ttft.count, 2);
  EXPECT_DOUBLE_EQ(with.resume.p50, 0.2);  // (0.15 + 0.25) / 2
  EXPECT_DOUBLE_EQ(without.resume.p50, 1.5);
  EXPECT_DOUBLE_EQ(with.cached_fraction, 0.99);
  EXPECT_DOUBLE_EQ(with.host_cached_mean, 900);
  EXPECT_DOUBLE_EQ(with.pool_cycles.mean, 2.3);
  EXPECT_DOUBLE_EQ(without.pool_cycles.min, 2.0);
  EXPECT_NEAR(resume_ratio(with, without), 0.2 / 1.5, 1e-12);
  EXPECT_TRUE(std::isnan(resume_ratio(with, summarize_arm({}, r.pool, false))));
}

TEST(ToolCallsResultsTest, CyclesSummarizeEveryPause) {
  const ToolCallsRecord r = record(220);
  const CycleSummary c = summarize_cycles(r.turns, r.pool);
  EXPECT_EQ(c.pauses, 4);
  EXPECT_EQ(c.pauses_cycled, 2);  // 250 and 300 of the 220 needed
  EXPECT_EQ(c.evicted_pages, 960);
  EXPECT_EQ(c.demoted_pages, 480);
  EXPECT_DOUBLE_EQ(c.device_cycles.mean, 2.4);
  EXPECT_DOUBLE_EQ(c.host_cycles.mean, 10.0 / 400);
}

TEST(ToolCallsResultsTest, CycleCheckOnlyUnderPressureAndFailsOnAnyShortPause) {
  ToolCallsOptions o;
  EXPECT_TRUE(cycle_checks(o, record(0)).empty());
  o.pressure_cycles = 2;
  std::vector<Check> ok = cycle_checks(o, record(200));
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_TRUE(ok[0].passed);
  EXPECT_NE(ok[0].detail.find("4 of 4 pauses evicted >= 200 pages (2.00x the 100-page"),
            std::string::npos)
      << ok[0].detail;
  EXPECT_NE(ok[0].detail.find("min 2.00x, mean 2.40x"), std::string::npos) << ok[0].detail;
  o.pressure_cycles = 2.2;
  std::vector<Check> short_pause = cycle_checks(o, record(220));
  ASSERT_EQ(short_pause.size(), 1u);
  EXPECT_FALSE(short_pause[0].passed);
  // No pause at all proves nothing.
  ToolCallsRecord empty = record(220);
  empty.turns.clear();
  EXPECT_FALSE(cycle_checks(o, empty)[0].passed);
}

TEST(ToolCallsResultsTest, TargetsDependOnPressure) {
  ToolCallsOptions o;
  ToolCallsRecord r = record(0);
  // Without pressure: ratio 0.13 <= 1.0, tool_end p50 50 ms <= 100 ms.
  std::vector<Check> plain = target_checks(o, r);
  ASSERT_EQ(plain.size(), 2u);
  EXPECT_TRUE(find(plain, "resumed turn not slower")->passed);
  EXPECT_TRUE(find(plain, "tool_end p50")->passed);
  r.turns[0].tool_end_s = r.turns[1].tool_end_s = 0.5;
  EXPECT_FALSE(find(target_checks(o, r), "tool_end p50")->passed);
  // Under pressure only the pressured ratio counts: 0.65 / 1.5 > 0.3.
  o.pressure_cycles = 1;
  std::vector<Check> pressured = target_checks(o, r);
  ASSERT_EQ(pressured.size(), 1u);
  EXPECT_EQ(pressured[0].name, "resumed turn under pressure");
  EXPECT_FALSE(pressured[0].passed);
  EXPECT_NE(pressured[0].detail.find("= 0.43, target <= 0.30"), std::string::npos)
      << pressured[0].detail;
  // An arm without turns fails rather than passes.
  r.turns.resize(2);
  EXPECT_FALSE(target_checks(o, r)[0].passed);
}

TEST(ToolCallsResultsTest, ResultsAndSummaryCarryTheCyclesAndTheRatio) {
  ToolCallsOptions o;
  o.pressure_cycles = 2;
  const ToolCallsRecord r = record(200);
  std::vector<Check> checks = cycle_checks(o, r);
  const std::vector<Check> targets = target_checks(o, r);
  checks.insert(checks.end(), targets.begin(), targets.end());
  const nlohmann::ordered_json j = tool_calls_results_json(o, r, checks);
  EXPECT_EQ(j["pressure"]["target_pages_per_pause"], 200);
  EXPECT_EQ(j["pressure"]["requests"], 42);
  EXPECT_EQ(j["pool_cycles"]["pauses_cycled"], 4);
  EXPECT_DOUBLE_EQ(j["pool_cycles"]["device_cycles_per_pause"]["mean"].get<double>(), 2.4);
  EXPECT_NEAR(j["resume_p50_ratio_with_over_without"].get<double>(), 0.2 / 1.5, 1e-12);
  EXPECT_EQ(j["resumed_turns"].size(), 4u);
  EXPECT_EQ(j["resumed_turns"][0]["pause_evictions"]["evicted_pages"], 250);
  EXPECT_EQ(j["checks"].size(), 2u);
  EXPECT_TRUE(j["passed"].get<bool>());

  const std::string md = tool_calls_summary_markdown(o, r, checks);
  EXPECT_NE(md.find("| with tool_start/tool_end | 2 |"), std::string::npos) << md;
  EXPECT_NE(md.find("ratio 0.13"), std::string::npos) << md;
  EXPECT_NE(md.find("2.40x the device pool on average, min 2.00x"), std::string::npos) << md;
  EXPECT_NE(md.find("- PASS device pool cycled during every pause"), std::string::npos) << md;
  EXPECT_NE(md.find("- PASS resumed turn under pressure"), std::string::npos) << md;

  // Without pressure, no pressure block.
  ToolCallsOptions plain;
  EXPECT_TRUE(tool_calls_results_json(plain, record(0), {})["pressure"].is_null());
}

}  // namespace
}  // namespace strata::bench
