#include "model/prompt_logits_cache.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace strata {
namespace {

std::vector<float> logits_of(float v, size_t n = 8) {
  return std::vector<float>(n, v);
}

size_t entry_bytes(size_t tokens, size_t vocab, size_t salt = 0) {
  return tokens * sizeof(int32_t) + vocab * sizeof(float) + salt;
}

TEST(PromptLogitsCacheTest, FindsExactlyThePromptItWasGiven) {
  PromptLogitsCache cache(1 << 20);
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  cache.put(prompt, "", logits_of(0.5f));
  auto hit = cache.find(prompt, "");
  ASSERT_EQ(hit.size(), 8u);
  EXPECT_EQ(hit[0], 0.5f);
  // A prefix, an extension, one token changed: all misses.
  EXPECT_TRUE(cache.find(std::vector<int32_t>{1, 2, 3}, "").empty());
  EXPECT_TRUE(cache.find(std::vector<int32_t>{1, 2, 3, 4, 5}, "").empty());
  EXPECT_TRUE(cache.find(std::vector<int32_t>{1, 2, 3, 5}, "").empty());
  EXPECT_EQ(cache.hits(), 1u);
  EXPECT_EQ(cache.misses(), 3u);
}

TEST(PromptLogitsCacheTest, SaltSeparatesTenants) {
  PromptLogitsCache cache(1 << 20);
  const std::vector<int32_t> prompt = {7, 8, 9};
  cache.put(prompt, "a", logits_of(1.0f));
  EXPECT_TRUE(cache.find(prompt, "").empty());
  EXPECT_TRUE(cache.find(prompt, "b").empty());
  cache.put(prompt, "b", logits_of(2.0f));
  EXPECT_EQ(cache.find(prompt, "a")[0], 1.0f);
  EXPECT_EQ(cache.find(prompt, "b")[0], 2.0f);
  EXPECT_EQ(cache.size(), 2u);
}

TEST(PromptLogitsCacheTest, PutReplacesTheSameKey) {
  PromptLogitsCache cache(1 << 20);
  const std::vector<int32_t> prompt = {1, 2};
  cache.put(prompt, "", logits_of(1.0f));
  cache.put(prompt, "", logits_of(3.0f));
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.bytes(), entry_bytes(2, 8));
  EXPECT_EQ(cache.find(prompt, "")[0], 3.0f);
}

TEST(PromptLogitsCacheTest, EvictsLeastRecentlyUsedWithinTheBudget) {
  // Room for exactly three entries of 2 tokens and 8 logits.
  PromptLogitsCache cache(3 * entry_bytes(2, 8));
  cache.put(std::vector<int32_t>{1, 1}, "", logits_of(1));
  cache.put(std::vector<int32_t>{2, 2}, "", logits_of(2));
  cache.put(std::vector<int32_t>{3, 3}, "", logits_of(3));
  ASSERT_FALSE(cache.find(std::vector<int32_t>{1, 1}, "").empty());  // 1 is now the newest
  cache.put(std::vector<int32_t>{4, 4}, "", logits_of(4));           // 2 goes
  EXPECT_TRUE(cache.find(std::vector<int32_t>{2, 2}, "").empty());
  EXPECT_FALSE(cache.find(std::vector<int32_t>{1, 1}, "").empty());
  EXPECT_FALSE(cache.find(std::vector<int32_t>{3, 3}, "").empty());
  EXPECT_FALSE(cache.find(std::vector<int32_t>{4, 4}, "").empty());
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_LE(cache.bytes(), cache.capacity_bytes());
}

TEST(PromptLogitsCacheTest, KeepsNothingLargerThanItsBudget) {
  PromptLogitsCache cache(entry_bytes(2, 8));
  cache.put(std::vector<int32_t>{1, 1}, "", logits_of(1));
  cache.put(std::vector<int32_t>{1, 2, 3}, "", logits_of(2));  // too big: dropped, 1 stays
  EXPECT_TRUE(cache.find(std::vector<int32_t>{1, 2, 3}, "").empty());
  EXPECT_FALSE(cache.find(std::vector<int32_t>{1, 1}, "").empty());
  PromptLogitsCache none(0);
  none.put(std::vector<int32_t>{1}, "", logits_of(1));
  EXPECT_EQ(none.size(), 0u);
  EXPECT_EQ(none.bytes(), 0u);
}

TEST(PromptLogitsCacheTest, ClearForgetsEverything) {
  PromptLogitsCache cache(1 << 20);
  cache.put(std::vector<int32_t>{1}, "", logits_of(1));
  cache.clear();
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.bytes(), 0u);
  EXPECT_TRUE(cache.find(std::vector<int32_t>{1}, "").empty());
}

// Random puts and finds against a reference model (a map and a recency list).
TEST(PromptLogitsCacheTest, MatchesAReferenceModel) {
  std::mt19937 rng(7);
  const size_t vocab = 4;
  const size_t budget = 5 * entry_bytes(3, vocab);
  PromptLogitsCache cache(budget);
  std::map<std::vector<int32_t>, float> ref;
  std::vector<std::vector<int32_t>> recency;  // most recent last
  auto touch = [&](const std::vector<int32_t>& k) {
    std::erase(recency, k);
    recency.push_back(k);
  };
  for (int step = 0; step < 20000; ++step) {
    std::vector<int32_t> key(1 + rng() % 3);
    for (auto& t : key) t = static_cast<int32_t>(rng() % 3);
    if (rng() % 2 == 0) {
      const float v = static_cast<float>(step);
      cache.put(key, "", std::vector<float>(vocab, v));
      ref[key] = v;
      touch(key);
      size_t bytes = 0;
      for (const auto& k : recency) bytes += entry_bytes(k.size(), vocab);
      while (bytes > budget) {
        bytes -= entry_bytes(recency.front().size(), vocab);
        ref.erase(recency.front());
        recency.erase(recency.begin());
      }
    } else {
      auto got = cache.find(key, "");
      auto it = ref.find(key);
      ASSERT_EQ(got.empty(), it == ref.end()) << "step " << step;
      if (it != ref.end()) {
        ASSERT_EQ(got[0], it->second);
        touch(key);
      }
    }
    ASSERT_EQ(cache.size(), ref.size());
    ASSERT_LE(cache.bytes(), budget);
  }
}

}  // namespace
}  // namespace strata
