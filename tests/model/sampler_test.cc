#include "model/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "model/rng.h"

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

// The rules of sampler.h written the plain way: rank every token (larger logit first, then
// the smaller id), keep top_k, weigh by exp((logit - max) / T) in double, keep the shortest
// ranked prefix reaching top_p, then walk the kept tokens in id order. Returns the token and
// how far u x total lies from the nearest running-sum boundary (relative to the total).
std::pair<int32_t, double> reference_draw(const std::vector<float>& logits, const RowSampling& r) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  std::vector<int32_t> ranked(logits.size());
  std::iota(ranked.begin(), ranked.end(), 0);
  std::stable_sort(ranked.begin(), ranked.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
  });
  if (r.temperature == 0.0f) return {ranked[0], 1.0};
  size_t kept = r.top_k > 0 && r.top_k < vocab ? static_cast<size_t>(r.top_k) : ranked.size();
  const double max_logit = logits[static_cast<size_t>(ranked[0])];
  std::vector<double> w(kept);
  double total = 0;
  for (size_t i = 0; i < kept; ++i) {
    w[i] = std::exp((logits[static_cast<size_t>(ranked[i])] - max_logit) / r.temperature);
    total += w[i];
  }
  if (r.top_p < 1.0f) {
    double cum = 0;
    size_t cut = 0;
    while (cut < kept) {
      cum += w[cut++];
      if (cum >= r.top_p * total) break;
    }
    kept = cut;
  }
  std::vector<std::pair<int32_t, double>> by_id;
  for (size_t i = 0; i < kept; ++i) by_id.push_back({ranked[i], w[i]});
  std::sort(by_id.begin(), by_id.end());
  double sum = 0;
  for (const auto& [id, weight] : by_id) sum += weight;
  const double u = r.uniform * sum;
  double cum = 0;
  double margin = 1.0;
  int32_t token = by_id.back().first;
  bool found = false;
  for (const auto& [id, weight] : by_id) {
    margin = std::min(margin, std::abs(u - cum) / sum);
    cum += weight;
    margin = std::min(margin, std::abs(u - cum) / sum);
    if (!found && u < cum) {
      token = id;
      found = true;
    }
  }
  return {token, margin};
}

// sample_row against the plain reference over random rows and rules: the same token wherever
// u is not within rounding of a boundary (float weights against double), and the rare
// boundary cases counted, not hidden.
TEST(SamplerTest, SampleRowFollowsTheCanonicalRulesOnRandomRows) {
  Rng rng(20261202);
  int checked = 0;
  int near_boundary = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int32_t vocab = 1 + static_cast<int32_t>(rng.next() % 300);
    std::vector<float> logits(static_cast<size_t>(vocab));
    const double spread = 0.5 + 4.0 * rng.uniform();
    for (float& l : logits) {
      // Quantised values: ties happen, as in BF16 logits.
      l = static_cast<float>(std::round(rng.normal() * spread * 8.0) / 8.0);
    }
    RowSampling r;
    const int kind = static_cast<int>(rng.next() % 5);
    r.temperature = kind == 0 ? 0.0f : static_cast<float>(0.2 + 1.5 * rng.uniform());
    r.top_k = rng.next() % 2 ? 0 : 1 + static_cast<int32_t>(rng.next() % (vocab + 5));
    r.top_p = rng.next() % 2 ? 1.0f : static_cast<float>(0.05 + 0.95 * rng.uniform());
    r.uniform = rng.uniform();
    const auto [want, margin] = reference_draw(logits, r);
    const SampledToken got = sample_row(logits, r);
    if (margin < 1e-5) {
      ++near_boundary;
      continue;
    }
    ASSERT_EQ(got.token, want) << "trial " << trial << " vocab " << vocab << " T " << r.temperature
                               << " top_k " << r.top_k << " top_p " << r.top_p << " u "
                               << r.uniform;
    ++checked;
  }
  EXPECT_GT(checked, 2900);
  EXPECT_LT(near_boundary, 100);
}

// The walk is in token-id order: with weights 0.2, 0.5, 0.3 over ids 0, 1, 2, u = 0.1 lands
// on id 0 (not on the most likely id 1, first in rank order), u = 0.69 on id 1, 0.71 on id 2;
// top_k = 2 keeps ids 1 and 2 and walks them in that order.
TEST(SamplerTest, TheDrawWalksKeptTokensInIdOrder) {
  const std::vector<float> logits = logits_of({0.2, 0.5, 0.3});
  RowSampling r{.temperature = 1.0f};
  for (const auto& [u, want] : std::vector<std::pair<double, int32_t>>{
           {0.1, 0}, {0.19, 0}, {0.21, 1}, {0.69, 1}, {0.71, 2}, {0.99, 2}}) {
    r.uniform = u;
    EXPECT_EQ(sample_row(logits, r).token, want) << u;
  }
  r.top_k = 2;  // ids 1, 2 with weights 0.5 : 0.3
  r.uniform = 0.6;
  EXPECT_EQ(sample_row(logits, r).token, 1);
  r.uniform = 0.65;
  EXPECT_EQ(sample_row(logits, r).token, 2);
}

// One uniform number a step at a temperature, none when greedy; sample() is
// sample(logits, next_row()), so a row drawn elsewhere with next_row() gives the same tokens.
TEST(SamplerTest, NextRowTakesOneUniformAStepAndSampleUsesIt) {
  std::vector<float> logits(500);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(std::cos(i * 0.71));
  const SamplingParams p{.temperature = 0.8f,
                         .top_k = 40,
                         .top_p = 0.9f,
                         .seed = 5,
                         .logprobs = true,
                         .top_logprobs = 3,
                         .stop_token_ids = {7}};
  Sampler direct(p, 0);
  Sampler split(p, 0);
  Rng same(5);
  for (int step = 0; step < 50; ++step) {
    const RowSampling row = split.next_row();
    EXPECT_EQ(row.uniform, same.uniform());
    EXPECT_EQ(row.top_k, 40);
    EXPECT_EQ(row.top_logprobs, 3);
    const SampledToken a = direct.sample(logits);
    const SampledToken b = split.accept(sample_row(logits, row));
    EXPECT_EQ(a.token, b.token);
    EXPECT_EQ(a.is_stop, b.is_stop);
    EXPECT_EQ(a.is_stop, a.token == 7);
    EXPECT_FLOAT_EQ(a.logprob, b.logprob);
    ASSERT_EQ(a.top_logprobs.size(), 3u);
    EXPECT_EQ(a.top_logprobs[0].token, b.top_logprobs[0].token);
  }
  Sampler greedy(SamplingParams{.temperature = 0.0f}, 3);
  EXPECT_EQ(greedy.next_row().uniform, 0.0);
  EXPECT_EQ(greedy.next_row().temperature, 0.0f);
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
