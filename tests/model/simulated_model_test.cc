#include "model/simulated_model.h"

#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "model/make_model.h"
#include "model/sampler.h"

namespace strata {
namespace {

// Prefill 1 ms + 0.1 ms a new token (+ 0.001 ms a context token); decode 2 ms + 1 ms a
// sequence (+ 0.01 ms a context token). Linear, so interpolation is exact.
TimingProfile linear_profile() {
  TimingProfile p;
  p.model = "tiny";
  p.machine = "test";
  p.source = "written by hand";
  p.prefill.x = {1, 1001};
  p.prefill.y = {0, 1000};
  p.prefill.ms = {{1.1, 2.1}, {101.1, 102.1}};
  p.decode.x = {1, 33};
  p.decode.y = {0, 1000};
  p.decode.ms = {{3, 13}, {35, 45}};
  return p;
}

std::unique_ptr<SimulatedModel> make_sim(SimulatedModelOptions options = {}) {
  auto sim = SimulatedModel::create(preset_config(ModelPreset::kTiny, Architecture::kQwen3),
                                    linear_profile(), std::move(options));
  EXPECT_TRUE(sim) << sim.error().message;
  return std::move(*sim);
}

std::vector<PageId> page_run(int32_t first, int32_t count) {
  std::vector<PageId> t;
  for (int32_t i = 0; i < count; ++i) t.push_back(make_page_id(first + i));
  return t;
}

TEST(SimulatedModel, PredictsTheProfileForEachKindOfBatch) {
  auto sim = make_sim();
  const std::vector<int32_t> ten(10, 5);
  const std::vector<int32_t> one(1, 5);
  const std::vector<PageId> table = page_run(0, 8);
  // A prefill of 10 tokens after 0 cached: 1 + 0.1 x 10.
  ForwardSequence prefill{ten, 0, table, true};
  EXPECT_NEAR(sim->predict_ms(std::span(&prefill, 1)), 2.0, 1e-9);
  // Two decoding sequences, contexts 100 and 300 (mean 200): 2 + 2 + 0.01 x 200.
  ForwardSequence d1{one, 100, table, true};
  ForwardSequence d2{one, 300, table, true};
  const ForwardSequence decodes[] = {d1, d2};
  EXPECT_NEAR(sim->predict_ms(decodes), 6.0, 1e-9);
  // Mixed: the decode step plus the prefill pass of both chunks (20 tokens, token-weighted
  // context (10 x 0 + 10 x 500) / 20 = 250).
  ForwardSequence p2{ten, 500, table, false};
  const ForwardSequence mixed[] = {d1, prefill, d2, p2};
  EXPECT_NEAR(sim->predict_ms(mixed), 6.0 + (1 + 0.1 * 20 + 0.001 * 250), 1e-9);
}

TEST(SimulatedModel, TimeScaleScalesThePrediction) {
  auto sim = make_sim({.time_scale = 0.5});
  const std::vector<int32_t> ten(10, 5);
  const std::vector<PageId> table = page_run(0, 1);
  ForwardSequence s{ten, 0, table, true};
  EXPECT_NEAR(sim->predict_ms(std::span(&s, 1)), 1.0, 1e-9);
}

TEST(SimulatedModel, TokensAreAFunctionOfTheSequenceWhateverTheChunking) {
  auto sim = make_sim();
  auto pool = sim->make_kv_pool(16, 4, KvDtype::kBF16);
  ASSERT_TRUE(pool) << pool.error().message;
  EXPECT_EQ((*pool)->num_layers(), 1);
  EXPECT_EQ((*pool)->head_dim(), 2);
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5};
  // All at once, into pages 0..3.
  ForwardOutput out;
  const std::vector<PageId> first_pages = page_run(0, 4);
  ForwardSequence whole{prompt, 0, first_pages, true};
  ASSERT_TRUE(sim->forward(std::span(&whole, 1), **pool, out));
  ASSERT_EQ(out.tokens.size(), 1u);
  EXPECT_TRUE(out.logits.empty());
  const int32_t first = out.tokens[0];
  EXPECT_EQ(first, sim->next_token(prompt));
  // In chunks of 4, 4 and 3 into pages 4..7: the same token.
  const std::vector<PageId> other = page_run(4, 4);
  for (size_t done = 0; done < prompt.size(); done += 4) {
    const size_t n = std::min<size_t>(4, prompt.size() - done);
    ForwardSequence chunk{std::span(prompt).subspan(done, n), static_cast<int64_t>(done), other,
                          done + n == prompt.size()};
    ASSERT_TRUE(sim->forward(std::span(&chunk, 1), **pool, out));
  }
  ASSERT_EQ(out.tokens.size(), 1u);
  EXPECT_EQ(out.tokens[0], first);
  // Decoding after a shared cached prefix (pages 0..1 hold 8 positions) continues the hash.
  std::vector<int32_t> seq = prompt;
  seq.push_back(first);
  std::vector<PageId> table = page_run(0, 2);
  table.push_back(make_page_id(8));
  table.push_back(make_page_id(9));
  ForwardSequence tail{std::span(seq).subspan(8), 8, table, true};
  ASSERT_TRUE(sim->forward(std::span(&tail, 1), **pool, out));
  EXPECT_EQ(out.tokens[0], sim->next_token(seq));
  // Another sequence gives (almost surely) another token, and never an eos or bos id.
  const ModelConfig& c = sim->config();
  for (int32_t t = 0; t < 50; ++t) {
    const std::vector<int32_t> s = {t, t + 1};
    const int32_t next = sim->next_token(s);
    EXPECT_GE(next, 0);
    EXPECT_LT(next, c.vocab_size);
    for (int32_t eos : c.eos_token_ids) EXPECT_NE(next, eos);
  }
}

TEST(SimulatedModel, EmitsOnlyTheGivenTokens) {
  auto sim = make_sim({.output_token_ids = {7, 11}});
  for (int32_t t = 0; t < 40; ++t) {
    const std::vector<int32_t> s = {t};
    const int32_t next = sim->next_token(s);
    EXPECT_TRUE(next == 7 || next == 11) << next;
  }
}

TEST(SimulatedModel, ForwardTakesThePredictedTime) {
  auto sim = make_sim();
  auto pool = sim->make_kv_pool(4, 16, KvDtype::kF32);
  ASSERT_TRUE(pool);
  const std::vector<int32_t> prompt(40, 9);  // 1 + 4 = 5 ms
  const std::vector<PageId> table = page_run(0, 3);
  ForwardSequence s{prompt, 0, table, true};
  ForwardOutput out;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(sim->forward(std::span(&s, 1), **pool, out));
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // Never early (a loaded machine may make it late: no upper bound on the wall time here).
  EXPECT_GE(ms, 5.0);
  const SimulatedModelStats st = sim->stats();
  EXPECT_EQ(st.passes, 1);
  EXPECT_NEAR(st.predicted_ms, 5.0, 1e-9);
  EXPECT_GE(st.elapsed_ms, 5.0);
}

TEST(SimulatedModel, RefusesBadBatchesAndOptions) {
  auto sim = make_sim();
  auto pool = sim->make_kv_pool(4, 4, KvDtype::kF32);
  ASSERT_TRUE(pool);
  ForwardOutput out;
  const std::vector<int32_t> ok = {1, 2, 3};
  const std::vector<int32_t> bad = {1, sim->config().vocab_size};
  const std::vector<int32_t> none;
  const std::vector<PageId> page0 = page_run(0, 1);
  const std::vector<PageId> page4 = page_run(4, 1);
  const std::vector<ForwardSequence> cases = {
      {bad, 0, page0, true},   // a token outside the vocabulary
      {none, 0, page0, true},  // no tokens
      {ok, 2, page0, true},    // a page table too short (5 positions, 4 slots)
      {ok, 0, page4, true},    // a page outside the pool
  };
  for (const ForwardSequence& c : cases) {
    auto st = sim->forward(std::span(&c, 1), **pool, out);
    ASSERT_FALSE(st);
    EXPECT_EQ(st.error().code, ErrorCode::kInvalidArgument);
  }
  // A pool of another shape (a real model's).
  KvPool wrong(2, 1, 2, 4, 4, KvDtype::kF32);
  ForwardSequence s{ok, 0, page0, true};
  EXPECT_FALSE(sim->forward(std::span(&s, 1), wrong, out));

  const ModelConfig c = preset_config(ModelPreset::kTiny, Architecture::kQwen3);
  EXPECT_FALSE(SimulatedModel::create(c, linear_profile(), {.time_scale = 0}));
  EXPECT_FALSE(SimulatedModel::create(c, linear_profile(), {.spin_tail_us = -1}));
  EXPECT_FALSE(SimulatedModel::create(c, linear_profile(), {.output_token_ids = {-1}}));
  EXPECT_FALSE(SimulatedModel::create(c, linear_profile(), {.output_token_ids = {c.vocab_size}}));
}

}  // namespace
}  // namespace strata

namespace strata {
namespace {

TEST(SampleChosen, ReportsTheTokenAsAOneHotRowWould) {
  SamplingParams params;
  params.top_logprobs = 3;
  params.stop_token_ids = {9};
  const SampledToken t = sample_chosen(params, 1);
  EXPECT_EQ(t.token, 1);
  EXPECT_FALSE(t.is_stop);
  EXPECT_EQ(t.logprob, 0.0f);
  ASSERT_EQ(t.top_logprobs.size(), 3u);
  EXPECT_EQ(t.top_logprobs[0].token, 1);
  EXPECT_EQ(t.top_logprobs[1].token, 0);
  EXPECT_EQ(t.top_logprobs[2].token, 2);
  EXPECT_EQ(t.top_logprobs[2].logprob, -9999.0f);
  EXPECT_TRUE(sample_chosen(params, 9).is_stop);
}

}  // namespace
}  // namespace strata
