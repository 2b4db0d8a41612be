#include "bench/stats.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace strata::bench {
namespace {

// Reference values from numpy.percentile (method "linear", numpy's default).
TEST(PercentileTest, MatchesNumpyLinear) {
  const std::vector<double> one_to_ten = {7, 1, 10, 3, 2, 9, 4, 8, 6, 5};  // any order
  EXPECT_DOUBLE_EQ(percentile(one_to_ten, 50), 5.5);
  EXPECT_DOUBLE_EQ(percentile(one_to_ten, 90), 9.1);
  EXPECT_DOUBLE_EQ(percentile(one_to_ten, 99), 9.91);
  EXPECT_DOUBLE_EQ(percentile(one_to_ten, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(one_to_ten, 100), 10);
  const std::vector<double> v = {15, 20, 35, 40, 50};
  EXPECT_DOUBLE_EQ(percentile(v, 40), 29);  // rank 1.6: 20 + 0.6 * 15
  EXPECT_DOUBLE_EQ(percentile(v, 25), 20);
  EXPECT_DOUBLE_EQ(percentile(v, 75), 40);
}

TEST(PercentileTest, EdgeCases) {
  EXPECT_TRUE(std::isnan(percentile(std::vector<double>{}, 50)));
  EXPECT_DOUBLE_EQ(percentile(std::vector<double>{3.5}, 99), 3.5);
  EXPECT_DOUBLE_EQ(percentile(std::vector<double>{1, 2}, 150), 2);  // clamped
  EXPECT_DOUBLE_EQ(percentile(std::vector<double>{1, 2}, -5), 1);
}

TEST(SummarizeTest, MeanMinMaxAndPercentiles) {
  const std::vector<double> v = {4, 1, 3, 2};
  const Summary s = summarize(v);
  EXPECT_EQ(s.count, 4);
  EXPECT_DOUBLE_EQ(s.mean, 2.5);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 4);
  EXPECT_DOUBLE_EQ(s.p50, 2.5);
  EXPECT_DOUBLE_EQ(s.p90, 3.7);
  EXPECT_DOUBLE_EQ(s.p99, 3.97);
  const Summary e = summarize(std::vector<double>{});
  EXPECT_EQ(e.count, 0);
  EXPECT_TRUE(std::isnan(e.mean));
  const auto j = to_json(e);
  EXPECT_TRUE(j["p50"].is_null());
  EXPECT_EQ(to_json(s)["p90"].get<double>(), 3.7);
}

TEST(MaxOverMinTest, IgnoresNonPositiveValues) {
  EXPECT_DOUBLE_EQ(max_over_min(std::vector<double>{0.2, 0.5, 0.25}), 2.5);
  EXPECT_DOUBLE_EQ(max_over_min(std::vector<double>{0, 2, 4, std::nan("")}), 2);
  EXPECT_TRUE(std::isnan(max_over_min(std::vector<double>{})));
}

}  // namespace
}  // namespace strata::bench
