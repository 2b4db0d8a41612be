// The cluster scenario's traffic (cluster_workload.h): the same seed gives the same
// requests at the same moments, other seeds and streams other ones, arrivals are a Poisson
// process of the asked rate, and the prefixes are sized from the cluster's KV.
#include "bench/cluster_workload.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

namespace strata::bench {
namespace {

// One token per four bytes (at least one): deterministic and fast, not a real tokenizer.
TokenCounter byte_counter() {
  return [](std::string_view s) -> Result<int64_t> {
    return std::max<int64_t>(1, static_cast<int64_t>(s.size()) / 4);
  };
}

SharedPrefixShape small_shape() {
  SharedPrefixShape s;
  s.groups = 3;
  s.users_per_group = 2;
  s.prefix_tokens = 200;
  s.question_min_tokens = 5;
  s.question_max_tokens = 10;
  s.rates_per_s = {1, 4};
  s.requests_per_rate = 10;
  return s;
}

TEST(ClusterWorkloadTest, PoissonArrivalsIncreaseAtTheAskedRate) {
  BenchRng rng(7);
  const std::vector<double> a = poisson_arrivals(rng, 4.0, 20'000);
  ASSERT_EQ(a.size(), 20'000u);
  EXPECT_GT(a.front(), 0);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  const double mean_gap = a.back() / static_cast<double>(a.size());
  EXPECT_NEAR(mean_gap, 0.25, 0.25 * 0.03);
  BenchRng again(7);
  EXPECT_EQ(poisson_arrivals(again, 4.0, 20'000), a);
}

TEST(ClusterWorkloadTest, PrefixesTakeTheAskedShareOfTheClusterKv) {
  EXPECT_EQ(shared_prefix_tokens(0.7, 3, 4096, 6), 1433);  // 0.7 * 12288 / 6
  EXPECT_EQ(shared_prefix_tokens(0.7, 2, 2048, 4), 716);
  EXPECT_EQ(shared_prefix_tokens(0.01, 1, 256, 8), 64);  // the floor
}

TEST(ClusterWorkloadTest, SharedPrefixIsDeterministic) {
  const SharedPrefixShape shape = small_shape();
  auto a = make_shared_prefix_workload(5, shape, byte_counter());
  auto b = make_shared_prefix_workload(5, shape, byte_counter());
  auto c = make_shared_prefix_workload(6, shape, byte_counter());
  ASSERT_TRUE(a && b && c);
  ASSERT_EQ(a->prefixes.size(), 3u);
  ASSERT_EQ(a->levels.size(), 2u);
  for (size_t g = 0; g < a->prefixes.size(); ++g) {
    EXPECT_EQ(a->prefixes[g].text, b->prefixes[g].text);
    EXPECT_NE(a->prefixes[g].text, c->prefixes[g].text);
    EXPECT_NEAR(static_cast<double>(a->prefixes[g].tokens), 200, 10);
  }
  for (size_t g = 1; g < a->prefixes.size(); ++g) {
    EXPECT_NE(a->prefixes[g].text, a->prefixes[0].text);
  }
  for (size_t l = 0; l < a->levels.size(); ++l) {
    ASSERT_EQ(a->levels[l].size(), 10u);
    for (size_t i = 0; i < a->levels[l].size(); ++i) {
      const SharedPrefixRequest& x = a->levels[l][i];
      const SharedPrefixRequest& y = b->levels[l][i];
      EXPECT_EQ(x.question, y.question);
      EXPECT_EQ(x.arrival_s, y.arrival_s);
      EXPECT_EQ(x.group, y.group);
      EXPECT_EQ(x.user, y.user);
      EXPECT_EQ(x.level, static_cast<int32_t>(l));
      EXPECT_GE(x.group, 0);
      EXPECT_LT(x.group, 3);
      EXPECT_GE(x.user, 0);
      EXPECT_LT(x.user, 2);
      if (i > 0) {
        EXPECT_GT(x.arrival_s, a->levels[l][i - 1].arrival_s);
      }
    }
  }
  // The faster level's arrivals are denser (same count, shorter span), on average.
  EXPECT_LT(a->levels[1].back().arrival_s, a->levels[0].back().arrival_s);
  const auto messages = shared_prefix_messages(*a, a->levels[0][0]);
  ASSERT_EQ(messages.size(), 2u);
  EXPECT_EQ(messages[0]["role"], "system");
  EXPECT_EQ(messages[0]["content"], a->prefixes[static_cast<size_t>(a->levels[0][0].group)].text);
  EXPECT_EQ(messages[1]["content"], a->levels[0][0].question);
}

TEST(ClusterWorkloadTest, SharedPrefixRefusesBadShapes) {
  SharedPrefixShape s = small_shape();
  s.rates_per_s = {};
  EXPECT_FALSE(make_shared_prefix_workload(1, s, byte_counter()));
  s = small_shape();
  s.rates_per_s = {0};
  EXPECT_FALSE(validate(s));
  s = small_shape();
  s.groups = 0;
  EXPECT_FALSE(validate(s));
  s = small_shape();
  s.question_min_tokens = 20;
  EXPECT_FALSE(validate(s));
}

TEST(ClusterWorkloadTest, AgenticSessionsAreDeterministicAndShareTheBoilerplate) {
  AgenticShape shape;
  shape.sessions = 5;
  shape.boilerplate_tokens = 100;
  shape.task_min_tokens = 10;
  shape.task_max_tokens = 20;
  shape.tool_calls = 2;
  shape.pause_min_s = 0.5;
  shape.pause_max_s = 1.5;
  shape.tool_result_min_tokens = 5;
  shape.tool_result_max_tokens = 10;
  auto a = make_agentic_workload(3, "agentic", shape, byte_counter());
  auto b = make_agentic_workload(3, "agentic", shape, byte_counter());
  auto f = make_agentic_workload(3, "failure", shape, byte_counter());
  ASSERT_TRUE(a && b && f);
  EXPECT_EQ(a->boilerplate.text, b->boilerplate.text);
  EXPECT_EQ(a->boilerplate.text, f->boilerplate.text);  // one boilerplate per seed
  ASSERT_EQ(a->sessions.size(), 5u);
  for (size_t i = 0; i < a->sessions.size(); ++i) {
    const AgentSession& s = a->sessions[i];
    EXPECT_EQ(s.index, static_cast<int32_t>(i));
    EXPECT_EQ(s.task, b->sessions[i].task);
    EXPECT_NE(s.task, f->sessions[i].task);
    EXPECT_EQ(s.arrival_s, b->sessions[i].arrival_s);
    EXPECT_EQ(s.pauses_s, b->sessions[i].pauses_s);
    EXPECT_EQ(s.tool_results, b->sessions[i].tool_results);
    ASSERT_EQ(s.tool_results.size(), 2u);
    ASSERT_EQ(s.pauses_s.size(), 2u);
    for (double p : s.pauses_s) {
      EXPECT_GE(p, 0.5);
      EXPECT_LT(p, 1.5);
    }
    if (i > 0) {
      EXPECT_GT(s.arrival_s, a->sessions[i - 1].arrival_s);
    }
  }
  shape.pause_max_s = 0.1;
  EXPECT_FALSE(make_agentic_workload(3, "agentic", shape, byte_counter()));
}

}  // namespace
}  // namespace strata::bench
