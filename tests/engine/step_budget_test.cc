// Step budgeting against a fake model cost (no clock, no model): a step of P prefill
// tokens and D decoding requests costs fixed + per_decode x D + per_token x P.
#include "engine/step_budget.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>

namespace strata {
namespace {

struct FakeCost {
  double fixed_ms = 20.0;      // weights read once per step
  double per_decode_ms = 1.5;  // attention and sampling per decoding request
  double per_token_ms = 0.25;  // a prefill token
  double noise = 0.0;          // relative, uniform in [-noise, +noise]
  std::mt19937 rng{7};
  double step(int64_t prefill, int64_t decoding) {
    const double base = fixed_ms + per_decode_ms * static_cast<double>(decoding) +
                        per_token_ms * static_cast<double>(prefill);
    std::uniform_real_distribution<double> u(-noise, noise);
    return base * (1.0 + u(rng));
  }
};

// Simulates `steps` steps with `decoding` requests decoding and an endless prefill queue
// (prefill-only steps first while nobody decodes, as when a server starts). Returns the
// step times once decoding started, and the prefill tokens each of those steps carried.
struct SimRun {
  std::vector<double> step_ms;
  std::vector<int64_t> prefill;
};
SimRun simulate(StepBudget& b, FakeCost& cost, int64_t decoding, int steps) {
  for (int i = 0; i < 3; ++i) {
    const int64_t p = b.prefill_tokens(0);
    b.observe(p, 0, cost.step(p, 0));
  }
  SimRun r;
  for (int i = 0; i < steps; ++i) {
    const int64_t p = b.prefill_tokens(decoding);
    const double ms = cost.step(p, decoding);
    b.observe(p, decoding, ms);
    r.step_ms.push_back(ms);
    r.prefill.push_back(p);
  }
  return r;
}

TEST(StepBudgetTest, WithoutDecodingRequestsPrefillGetsTheWholeChunk) {
  StepBudget b(StepBudgetOptions{.max_prefill_tokens = 2048});
  EXPECT_EQ(b.prefill_tokens(0), 2048);
  b.observe(2048, 0, 512.0);
  EXPECT_EQ(b.prefill_tokens(0), 2048);
  EXPECT_DOUBLE_EQ(b.prefill_ms_per_token(), 0.25);
}

TEST(StepBudgetTest, BeforeAnyMeasurementADecodingStepCarriesOnlyTheMinimum) {
  StepBudget b(StepBudgetOptions{.min_prefill_tokens = 64, .max_prefill_tokens = 2048});
  EXPECT_EQ(b.prefill_tokens(8), 64);
}

TEST(StepBudgetTest, AnExplicitTargetBoundsEveryMixedStep) {
  StepBudget b(StepBudgetOptions{.itl_target_ms = 60.0, .max_prefill_tokens = 2048});
  FakeCost cost;
  cost.noise = 0.05;
  const SimRun r = simulate(b, cost, 8, 200);
  // After a few steps of learning, every step stays near the target (within the noise
  // and the lag of the moving averages), where a 2,048-token chunk would take 544 ms.
  for (size_t i = 20; i < r.step_ms.size(); ++i) EXPECT_LE(r.step_ms[i], 60.0 * 1.2) << i;
  const double mean = std::accumulate(r.step_ms.begin() + 20, r.step_ms.end(), 0.0) /
                      static_cast<double>(r.step_ms.size() - 20);
  EXPECT_GT(mean, 60.0 * 0.8) << "the budget should use the room the target leaves";
}

TEST(StepBudgetTest, AutoTargetIsAMultipleOfTheDecodeStep) {
  StepBudget b(StepBudgetOptions{.auto_factor = 2.0, .max_prefill_tokens = 2048});
  FakeCost cost;
  // Decode-only steps teach the decode cost: 20 + 1.5 x 8 = 32 ms.
  for (int i = 0; i < 10; ++i) b.observe(0, 8, cost.step(0, 8));
  EXPECT_NEAR(b.decode_ms(), 32.0, 1e-9);
  EXPECT_NEAR(b.target_ms(), 64.0, 1e-9);
  const SimRun r = simulate(b, cost, 8, 100);
  for (size_t i = 10; i < r.step_ms.size(); ++i) EXPECT_LE(r.step_ms[i], 64.0 * 1.1) << i;
  // Prefill gets about half of each step: (64 - 32) / 0.25 = 128 tokens.
  EXPECT_NEAR(static_cast<double>(r.prefill.back()), 128.0, 16.0);
}

TEST(StepBudgetTest, PrefillAlwaysProgressesAtTheGuaranteedMinimum) {
  // Decoding alone exceeds the target: prefill still gets its minimum every step.
  StepBudget b(StepBudgetOptions{
      .itl_target_ms = 10.0, .min_prefill_tokens = 32, .max_prefill_tokens = 2048});
  FakeCost cost;
  const SimRun r = simulate(b, cost, 32, 50);
  for (int64_t p : r.prefill) EXPECT_GE(p, 32);
}

TEST(StepBudgetTest, DecodeIsNeverStarvedByAWaitingPrefill) {
  // However long the prefill queue, a decoding step's time stays bounded: the budget
  // never hands a decoding step the whole chunk once the costs are known.
  StepBudget b(StepBudgetOptions{.itl_target_ms = 50.0, .max_prefill_tokens = 8192});
  FakeCost cost;
  const SimRun r = simulate(b, cost, 4, 100);
  for (size_t i = 5; i < r.prefill.size(); ++i) EXPECT_LT(r.prefill[i], 8192) << i;
}

TEST(StepBudgetTest, TheBudgetFollowsACostThatChanges) {
  StepBudget b(StepBudgetOptions{.itl_target_ms = 80.0, .max_prefill_tokens = 4096});
  FakeCost cost;
  simulate(b, cost, 8, 100);
  const int64_t before = b.prefill_tokens(8);
  cost.per_token_ms *= 2.0;  // e.g. longer contexts make attention dearer
  const SimRun r = simulate(b, cost, 8, 100);
  EXPECT_NEAR(static_cast<double>(b.prefill_tokens(8)), static_cast<double>(before) / 2.0,
              static_cast<double>(before) * 0.15);
  for (size_t i = 30; i < r.step_ms.size(); ++i) EXPECT_LE(r.step_ms[i], 80.0 * 1.1) << i;
}

TEST(StepBudgetTest, NonsenseMeasurementsAreIgnored) {
  StepBudget b(StepBudgetOptions{.itl_target_ms = 50.0, .max_prefill_tokens = 1024});
  b.observe(512, 0, 128.0);
  const double per_token = b.prefill_ms_per_token();
  b.observe(512, 0, -1.0);
  b.observe(512, 0, std::numeric_limits<double>::quiet_NaN());
  b.observe(0, 0, 10.0);
  b.observe(4, 0, 50.0);  // too few tokens to say anything about a token's cost
  EXPECT_DOUBLE_EQ(b.prefill_ms_per_token(), per_token);
}

}  // namespace
}  // namespace strata
