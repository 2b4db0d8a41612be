// Charts for the benchmark results, written as standalone SVG text (no library): line
// charts (y against a numeric x, one polyline per series) and grouped bar charts, each with
// axes, ticks at "nice" values, grid lines, axis labels, a title and a legend.
//
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace strata::bench {

struct ChartSeries {
  std::string name;
  std::vector<double> x;
  std::vector<double> y;  // same length as x; NaN marks a missing point (no marker, gap)
};

struct LineChart {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<ChartSeries> series;
  bool x_ticks_at_data = true;  // ticks at the data's x values (depths, concurrencies)
  bool y_from_zero = true;      // the y axis starts at 0
};

struct BarChart {
  std::string title;
  std::string y_label;
  std::vector<std::string> categories;      // groups along x
  std::vector<std::string> series;          // bars within a group, one legend entry each
  std::vector<std::vector<double>> values;  // [series][category]; NaN: no bar
};

std::string render_line_chart(const LineChart& chart);
std::string render_bar_chart(const BarChart& chart);

// Ticks covering [lo, hi] at multiples of 1, 2 or 5 times a power of ten, at most about
// `max_ticks` of them, the first <= lo and the last >= hi. lo <= hi; max_ticks >= 2.
std::vector<double> nice_ticks(double lo, double hi, int max_ticks);
// A tick label: integers without decimals, others with up to three significant decimals.
std::string format_number(double v);
std::string xml_escape(std::string_view text);

}  // namespace strata::bench
