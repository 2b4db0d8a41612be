#include "bench/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace strata::bench {

namespace {

nlohmann::ordered_json number_or_null(double v) {
  return std::isnan(v) ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(v);
}

// Percentile of already sorted values.
double sorted_percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return kNaN;
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(sorted.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(rank));
  const size_t above = std::min(below + 1, sorted.size() - 1);
  const double frac = rank - static_cast<double>(below);
  return sorted[below] + (sorted[above] - sorted[below]) * frac;
}

}  // namespace

double percentile(std::span<const double> values, double p) {
  std::vector<double> sorted(values.begin(), values.end());
  std::sort(sorted.begin(), sorted.end());
  return sorted_percentile(sorted, p);
}

Summary summarize(std::span<const double> values) {
  Summary s;
  s.count = static_cast<int64_t>(values.size());
  if (values.empty()) {
    s.mean = s.min = s.max = s.p50 = s.p90 = s.p99 = kNaN;
    return s;
  }
  std::vector<double> sorted(values.begin(), values.end());
  std::sort(sorted.begin(), sorted.end());
  s.mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / static_cast<double>(s.count);
  s.min = sorted.front();
  s.max = sorted.back();
  s.p50 = sorted_percentile(sorted, 50);
  s.p90 = sorted_percentile(sorted, 90);
  s.p99 = sorted_percentile(sorted, 99);
  return s;
}

nlohmann::ordered_json to_json(const Summary& s) {
  return nlohmann::ordered_json{{"count", s.count},
                                {"mean", number_or_null(s.mean)},
                                {"min", number_or_null(s.min)},
                                {"max", number_or_null(s.max)},
                                {"p50", number_or_null(s.p50)},
                                {"p90", number_or_null(s.p90)},
                                {"p99", number_or_null(s.p99)}};
}

double max_over_min(std::span<const double> values) {
  double lo = std::numeric_limits<double>::infinity();
  double hi = 0;
  for (double v : values) {
    if (!(v > 0)) continue;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  return hi > 0 ? hi / lo : kNaN;
}

}  // namespace strata::bench
