// Full prefix hits sample their first token from the remembered prompt logits
// (docs/full-hit.md): no forward pass for max_tokens 1, the same greedy output as a cold
// run for longer answers (the unmatched tail runs with the next token), tenants kept apart.
#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "model/make_model.h"
#include "test_device.h"

namespace strata {
namespace {

class FullHitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    STRATA_TEST_MODEL(model_, ModelPreset::kTiny, Architecture::kLlama, 7,
                      ModelOptions{.num_threads = 1});
    auto e =
        create_test_engine(model_, EngineOptions{.page_size = 4, .kv_cache_tokens = 1024}, nullptr);
    ASSERT_TRUE(e.has_value()) << e.error().message;
    engine_ = std::move(*e);
  }
  // The counters as of the last finished request: they are published after each
  // scheduler iteration, and a command runs only after the previous one published.
  EngineCounters counters() {
    engine_call(*engine_, [](EngineState&) { return 0; }).get();
    return engine_->counters();
  }

  TestModel model_;  // before the engines that run on it
  std::unique_ptr<Engine> engine_;
};

TEST_F(FullHitTest, RepeatedPromptNeedsNoForwardPassForOneToken) {
  const auto p = test_prompt(37, 1);
  const Outcome cold = run_greedy(*engine_, p, 1);
  const uint64_t steps = counters().forward_steps;
  const Outcome hit = run_greedy(*engine_, p, 1);
  EXPECT_EQ(hit.tokens, cold.tokens);
  EXPECT_EQ(hit.usage.cached_tokens, 36);
  EXPECT_EQ(counters().forward_steps, steps);
  EXPECT_EQ(counters().prompt_logits_hits, 1u);
  expect_engine_consistent(*engine_);
}

TEST_F(FullHitTest, LongerAnswersMatchTheColdRunForEveryTailLength) {
  // Tails of 1 to 4 tokens past the last full page (page size 4).
  for (int n : {33, 34, 35, 36}) {
    const auto p = test_prompt(n, n);
    const Outcome cold = run_greedy(*engine_, p, 8);
    const Outcome hit = run_greedy(*engine_, p, 8);
    EXPECT_EQ(hit.tokens, cold.tokens) << n;
    EXPECT_EQ(hit.reason, FinishReason::kLength);
    // The tail computed with the first decode step went into the tree: a third run hits too.
    EXPECT_EQ(run_greedy(*engine_, p, 8).tokens, cold.tokens) << n;
  }
  expect_engine_consistent(*engine_);
}

TEST_F(FullHitTest, AnotherSaltOrAnotherLastTokenRunsTheModel) {
  const auto p = test_prompt(37, 2);
  run_greedy(*engine_, p, 1);
  const uint64_t hits = counters().prompt_logits_hits;
  const uint64_t steps = counters().forward_steps;
  RequestSpec salted;
  salted.prompt = p;
  salted.sampling.temperature = 0;
  salted.max_tokens = 1;
  salted.cache_salt = "tenant-b";
  drain(**engine_->submit(std::move(salted)));
  auto q = p;
  q.back() = q.back() == 5 ? 6 : 5;  // same full pages, another last token
  run_greedy(*engine_, q, 1);
  EXPECT_EQ(counters().prompt_logits_hits, hits);
  EXPECT_EQ(counters().forward_steps, steps + 2);
}

}  // namespace
}  // namespace strata
