// Latency statistics for the benchmark reports: percentiles by linear interpolation
// between closest ranks (numpy's default "linear" method, so numbers can be recomputed
// from results.json with numpy.percentile), and small summaries.
//
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata::bench {

// What a statistic of no values is, and what the reports print as null.
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The p-th percentile, p in [0, 100], of `values` (any order). NaN for no values.
double percentile(std::span<const double> values, double p);

struct Summary {
  int64_t count = 0;
  double mean = 0;  // NaN when count == 0, as the percentiles
  double min = 0;
  double max = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
};

Summary summarize(std::span<const double> values);

// {"count", "mean", "min", "max", "p50", "p90", "p99"}; NaN becomes null.
nlohmann::ordered_json to_json(const Summary& s);

// max / min of positive values; NaN when there are none.
double max_over_min(std::span<const double> values);

}  // namespace strata::bench
