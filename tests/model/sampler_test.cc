#include "model/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace strata {
namespace {

// Logits whose softmax is exactly `probs`.
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

std::map<int32_t, int> histogram(Sampler& sampler, std::span<const float> logits, int draws) {
  std::map<int32_t, int> counts;
  for (int i = 0; i < draws; ++i) ++counts[sampler.sample(logits).token];
  return counts;
}

TEST(SamplerTest, GreedyIsArgmaxWithLowestIdOnTies) {
  Sampler greedy(SamplingParams{.temperature = 0.0f}, 1);
  const std::vector<float> logits = {0.1f, 2.0f, -1.0f, 2.0f, 1.9f};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(greedy.sample(logits).token, 1);
  // top_k = 1 is greedy at any temperature.
  Sampler top1(SamplingParams{.temperature = 5.0f, .top_k = 1}, 2);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(top1.sample(logits).token, 1);
}

TEST(SamplerTest, TopKRestrictsTheSupport) {
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i % 7) * 0.1f;
  // The three largest are ids 6, 13, 20 (value 0.6, ties broken by smaller id).
  Sampler sampler(SamplingParams{.temperature = 1.0f, .top_k = 3}, 3);
  const auto counts = histogram(sampler, logits, 3000);
  EXPECT_EQ(counts.size(), 3u);
  for (int32_t id : {6, 13, 20}) EXPECT_GT(counts.count(id), 0u) << id;
}

TEST(SamplerTest, TopPRestrictsTheSupport) {
  const std::vector<float> logits = logits_of({0.05, 0.5, 0.15, 0.3});
  {
    Sampler sampler(SamplingParams{.temperature = 1.0f, .top_p = 0.7f}, 4);
    const auto counts = histogram(sampler, logits, 2000);
    EXPECT_EQ(counts.size(), 2u);  // 0.5 + 0.3 reaches 0.7
    EXPECT_GT(counts.at(1), counts.at(3));
  }
  {
    Sampler sampler(SamplingParams{.temperature = 1.0f, .top_p = 0.85f}, 5);
    const auto counts = histogram(sampler, logits, 2000);
    EXPECT_EQ(counts.size(), 3u);  // needs the 0.15 too
    EXPECT_EQ(counts.count(0), 0u);
  }
  {
    // A wide distribution: the nucleus needs more than the first ranked block.
    std::vector<float> flat(5000, 0.0f);
    Sampler sampler(SamplingParams{.temperature = 1.0f, .top_p = 0.5f}, 6);
    const char* sanitizer = std::getenv("STRATA_SANITIZER_BUILD");
    const int draws = sanitizer != nullptr && std::string(sanitizer) == "1" ? 300 : 1500;
    std::set<int32_t> seen;
    for (int i = 0; i < draws; ++i) seen.insert(sampler.sample(flat).token);
    for (int32_t t : seen) EXPECT_LT(t, 2500);  // ties rank by id: the lower half
    EXPECT_GT(seen.size(), static_cast<size_t>(draws / 3));
  }
}

TEST(SamplerTest, FrequenciesFollowTemperature) {
  const std::vector<float> logits = logits_of({0.6, 0.3, 0.1});
  // T = 0.5 squares the probabilities: 0.36 : 0.09 : 0.01 normalised.
  Sampler sampler(SamplingParams{.temperature = 0.5f}, 7);
  const int draws = 20000;
  const auto counts = histogram(sampler, logits, draws);
  const double z = 0.36 + 0.09 + 0.01;
  EXPECT_NEAR(counts.at(0) / static_cast<double>(draws), 0.36 / z, 0.02);
  EXPECT_NEAR(counts.at(1) / static_cast<double>(draws), 0.09 / z, 0.02);
}

TEST(SamplerTest, SeedMakesDrawsReproducible) {
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(std::sin(i * 0.37));
  auto draw = [&](SamplingParams p, uint64_t fallback) {
    Sampler s(p, fallback);
    std::vector<int32_t> out;
    for (int i = 0; i < 100; ++i) out.push_back(s.sample(logits).token);
    return out;
  };
  const SamplingParams seeded{.temperature = 0.9f, .top_k = 200, .top_p = 0.95f, .seed = 1234};
  EXPECT_EQ(draw(seeded, 1), draw(seeded, 2));  // the request's seed wins over the fallback
  SamplingParams other = seeded;
  other.seed = 1235;
  EXPECT_NE(draw(seeded, 1), draw(other, 1));
  const SamplingParams unseeded{.temperature = 0.9f};
  EXPECT_EQ(draw(unseeded, 77), draw(unseeded, 77));
  EXPECT_NE(draw(unseeded, 77), draw(unseeded, 78));
}

TEST(SamplerTest, LogprobsAreLogSoftmaxOfRawLogits) {
  std::vector<float> logits(300);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(std::cos(i * 0.11) * 4);
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  // All top logprobs of the whole vocabulary sum (as probabilities) to one.
  const std::vector<TokenLogprob> all = top_logprobs(logits, 300);
  double total = 0;
  for (const TokenLogprob& t : all) total += std::exp(static_cast<double>(t.logprob));
  EXPECT_NEAR(total, 1.0, 1e-5);
  for (size_t i = 1; i < all.size(); ++i) EXPECT_GE(all[i - 1].logprob, all[i].logprob);

  // Temperature and top-k do not change the reported logprobs.
  Sampler sampler(
      SamplingParams{.temperature = 0.3f, .top_k = 5, .logprobs = true, .top_logprobs = 4}, 8);
  for (int i = 0; i < 20; ++i) {
    const SampledToken t = sampler.sample(logits);
    const double expected = logits[static_cast<size_t>(t.token)] - std::log(z);
    EXPECT_NEAR(t.logprob, expected, 1e-5);
    ASSERT_EQ(t.top_logprobs.size(), 4u);
    EXPECT_EQ(t.top_logprobs[0].token, all[0].token);
    EXPECT_NEAR(t.top_logprobs[0].logprob, all[0].logprob, 1e-6);
    EXPECT_NEAR(token_logprob(logits, t.token), expected, 1e-5);
  }
}

TEST(SamplerTest, FlagsStopTokens) {
  const std::vector<float> logits = {0.0f, 5.0f, 1.0f};
  Sampler stop(SamplingParams{.temperature = 0.0f, .stop_token_ids = {1, 7}}, 9);
  EXPECT_TRUE(stop.sample(logits).is_stop);
  Sampler go(SamplingParams{.temperature = 0.0f, .stop_token_ids = {2}}, 9);
  EXPECT_FALSE(go.sample(logits).is_stop);
}

TEST(SamplerTest, ValidatesParams) {
  EXPECT_TRUE(validate_sampling_params(SamplingParams{}).has_value());
  EXPECT_FALSE(validate_sampling_params(SamplingParams{.temperature = -1.0f}).has_value());
  EXPECT_FALSE(validate_sampling_params(SamplingParams{.temperature = NAN}).has_value());
  EXPECT_FALSE(validate_sampling_params(SamplingParams{.top_p = 0.0f}).has_value());
  EXPECT_FALSE(validate_sampling_params(SamplingParams{.top_p = 1.5f}).has_value());
  EXPECT_FALSE(validate_sampling_params(SamplingParams{.top_logprobs = 21}).has_value());
  EXPECT_FALSE(validate_sampling_params(SamplingParams{.stop_token_ids = {-3}}).has_value());
}

}  // namespace
}  // namespace strata
