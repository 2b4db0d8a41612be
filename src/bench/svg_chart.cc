#include "bench/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

namespace strata::bench {

namespace {

constexpr double kWidth = 760;
constexpr double kHeight = 440;
constexpr double kLeft = 80;    // room for y tick labels and the y label
constexpr double kRight = 190;  // room for the legend
constexpr double kTop = 50;     // room for the title
constexpr double kBottom = 64;  // room for x tick labels and the x label
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                   "#9467bd", "#8c564b", "#e377c2", "#17becf"};

const char* color(size_t i) {
  return kColors[i % (sizeof(kColors) / sizeof(kColors[0]))];
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

// Maps data values linearly onto pixels.
struct Scale {
  double d0, d1, p0, p1;
  double operator()(double v) const { return p0 + (v - d0) / (d1 - d0) * (p1 - p0); }
};

struct Frame {
  double x0 = kLeft, x1 = kWidth - kRight, y0 = kHeight - kBottom, y1 = kTop;
};

std::string header(const std::string& title) {
  std::string s = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(kWidth) + "\" height=\"" +
       num(kHeight) + "\" viewBox=\"0 0 " + num(kWidth) + " " + num(kHeight) +
       "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect x=\"0\" y=\"0\" width=\"" + num(kWidth) + "\" height=\"" + num(kHeight) +
       "\" fill=\"white\"/>\n";
  s += "<text x=\"" + num(kWidth / 2) + "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">" +
       xml_escape(title) + "</text>\n";
  return s;
}

// Horizontal grid lines, y ticks and labels, the axes and the y label.
std::string y_axis(const Frame& f, const Scale& y, const std::vector<double>& ticks,
                   const std::string& label) {
  std::string s;
  for (double t : ticks) {
    const double py = y(t);
    s += "<line x1=\"" + num(f.x0) + "\" y1=\"" + num(py) + "\" x2=\"" + num(f.x1) + "\" y2=\"" +
         num(py) + "\" stroke=\"#e0e0e0\"/>\n";
    s += "<line x1=\"" + num(f.x0 - 5) + "\" y1=\"" + num(py) + "\" x2=\"" + num(f.x0) +
         "\" y2=\"" + num(py) + "\" stroke=\"black\"/>\n";
    s += "<text x=\"" + num(f.x0 - 8) + "\" y=\"" + num(py + 4) + "\" text-anchor=\"end\">" +
         xml_escape(format_number(t)) + "</text>\n";
  }
  s += "<line x1=\"" + num(f.x0) + "\" y1=\"" + num(f.y0) + "\" x2=\"" + num(f.x0) + "\" y2=\"" +
       num(f.y1) + "\" stroke=\"black\"/>\n";
  s += "<line x1=\"" + num(f.x0) + "\" y1=\"" + num(f.y0) + "\" x2=\"" + num(f.x1) + "\" y2=\"" +
       num(f.y0) + "\" stroke=\"black\"/>\n";
  const double cy = (f.y0 + f.y1) / 2;
  s += "<text x=\"20\" y=\"" + num(cy) + "\" text-anchor=\"middle\" transform=\"rotate(-90 20 " +
       num(cy) + ")\">" + xml_escape(label) + "</text>\n";
  return s;
}

std::string x_tick(const Frame& f, double px, const std::string& label) {
  return "<line x1=\"" + num(px) + "\" y1=\"" + num(f.y0) + "\" x2=\"" + num(px) + "\" y2=\"" +
         num(f.y0 + 5) + "\" stroke=\"black\"/>\n<text x=\"" + num(px) + "\" y=\"" +
         num(f.y0 + 20) + "\" text-anchor=\"middle\">" + xml_escape(label) + "</text>\n";
}

std::string x_label(const Frame& f, const std::string& label) {
  return "<text x=\"" + num((f.x0 + f.x1) / 2) + "\" y=\"" + num(kHeight - 18) +
         "\" text-anchor=\"middle\">" + xml_escape(label) + "</text>\n";
}

std::string legend(const std::vector<std::string>& names, bool lines) {
  std::string s = "<g class=\"legend\">\n";
  const double x = kWidth - kRight + 16;
  for (size_t i = 0; i < names.size(); ++i) {
    const double y = kTop + 10 + 22 * static_cast<double>(i);
    if (lines) {
      s += "<line x1=\"" + num(x) + "\" y1=\"" + num(y) + "\" x2=\"" + num(x + 24) + "\" y2=\"" +
           num(y) + "\" stroke=\"" + color(i) + "\" stroke-width=\"2\"/>\n";
    } else {
      s += "<rect x=\"" + num(x + 4) + "\" y=\"" + num(y - 7) +
           "\" width=\"14\" height=\"14\" fill=\"" + color(i) + "\"/>\n";
    }
    s += "<text x=\"" + num(x + 32) + "\" y=\"" + num(y + 4) + "\">" + xml_escape(names[i]) +
         "</text>\n";
  }
  return s + "</g>\n";
}

// [lo, hi] of the finite values, or nullopt-like {+inf, -inf} when there are none.
std::pair<double, double> finite_range(const std::vector<double>& v) {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  for (double d : v) {
    if (!std::isfinite(d)) continue;
    lo = std::min(lo, d);
    hi = std::max(hi, d);
  }
  return {lo, hi};
}

// Y ticks for data in [lo, hi] (possibly empty or flat).
std::vector<double> y_ticks(double lo, double hi, bool from_zero) {
  if (!(lo <= hi)) {
    lo = 0;
    hi = 1;
  }
  if (from_zero) lo = std::min(lo, 0.0);
  if (hi == lo) hi = lo + (lo == 0 ? 1 : std::abs(lo) * 0.1);
  return nice_ticks(lo, hi, 6);
}

}  // namespace

std::string xml_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string format_number(double v) {
  if (!std::isfinite(v)) return "-";
  if (std::abs(v - std::round(v)) < 1e-9 * std::max(1.0, std::abs(v))) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.0f", std::round(v));
    return std::string(buf) == "-0" ? "0" : buf;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", v);
  return buf;
}

std::vector<double> nice_ticks(double lo, double hi, int max_ticks) {
  if (!(hi > lo)) return {lo};
  max_ticks = std::max(max_ticks, 2);
  const double raw = (hi - lo) / (max_ticks - 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * mag;
  for (double m : {1.0, 2.0, 5.0}) {
    if (m * mag >= raw * (1 - 1e-12)) {
      step = m * mag;
      break;
    }
  }
  const double first = std::floor(lo / step + 1e-9) * step;
  const double last = std::ceil(hi / step - 1e-9) * step;
  std::vector<double> ticks;
  for (double t = first; t <= last + step * 1e-6; t += step) {
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

std::string render_line_chart(const LineChart& chart) {
  const Frame f;
  std::vector<double> xs, ys;
  for (const ChartSeries& s : chart.series) {
    xs.insert(xs.end(), s.x.begin(), s.x.end());
    ys.insert(ys.end(), s.y.begin(), s.y.end());
  }
  auto [xlo, xhi] = finite_range(xs);
  if (!(xlo <= xhi)) xlo = 0, xhi = 1;
  if (xhi == xlo) xlo -= 1, xhi += 1;
  const std::vector<double> yt = [&] {
    auto [lo, hi] = finite_range(ys);
    return y_ticks(lo, hi, chart.y_from_zero);
  }();
  const Scale y{yt.front(), yt.back() == yt.front() ? yt.front() + 1 : yt.back(), f.y0, f.y1};
  const double pad = (xhi - xlo) * 0.04;
  const Scale x{xlo - pad, xhi + pad, f.x0, f.x1};

  std::string s = header(chart.title);
  s += y_axis(f, y, yt, chart.y_label);
  if (chart.x_ticks_at_data) {
    std::set<double> at;
    for (double v : xs) {
      if (std::isfinite(v)) at.insert(v);
    }
    for (double v : at) s += x_tick(f, x(v), format_number(v));
  } else {
    for (double v : nice_ticks(xlo, xhi, 8)) {
      if (v >= xlo - pad && v <= xhi + pad) s += x_tick(f, x(v), format_number(v));
    }
  }
  s += x_label(f, chart.x_label);
  for (size_t i = 0; i < chart.series.size(); ++i) {
    const ChartSeries& cs = chart.series[i];
    std::string points;
    std::string markers;
    auto flush_line = [&] {
      if (!points.empty()) {
        s += "<polyline fill=\"none\" stroke=\"" + std::string(color(i)) +
             "\" stroke-width=\"2\" points=\"" + points + "\"/>\n";
      }
      points.clear();
    };
    for (size_t k = 0; k < cs.x.size() && k < cs.y.size(); ++k) {
      if (!std::isfinite(cs.x[k]) || !std::isfinite(cs.y[k])) {
        flush_line();
        continue;
      }
      const double px = x(cs.x[k]), py = y(cs.y[k]);
      if (!points.empty()) points += " ";
      points += num(px) + "," + num(py);
      markers +=
          "<circle cx=\"" + num(px) + "\" cy=\"" + num(py) + "\" r=\"3.5\" fill=\"" + color(i) +
          "\"><title>" +
          xml_escape(cs.name + ": " + format_number(cs.x[k]) + ", " + format_number(cs.y[k])) +
          "</title></circle>\n";
    }
    flush_line();
    s += markers;
  }
  std::vector<std::string> names;
  for (const ChartSeries& cs : chart.series) names.push_back(cs.name);
  s += legend(names, true);
  return s + "</svg>\n";
}

std::string render_bar_chart(const BarChart& chart) {
  const Frame f;
  std::vector<double> all;
  for (const auto& row : chart.values) all.insert(all.end(), row.begin(), row.end());
  auto [lo, hi] = finite_range(all);
  const std::vector<double> yt = y_ticks(lo, hi, true);
  const Scale y{yt.front(), yt.back() == yt.front() ? yt.front() + 1 : yt.back(), f.y0, f.y1};

  std::string s = header(chart.title);
  s += y_axis(f, y, yt, chart.y_label);
  const size_t groups = std::max<size_t>(chart.categories.size(), 1);
  const size_t bars = std::max<size_t>(chart.series.size(), 1);
  const double group_w = (f.x1 - f.x0) / static_cast<double>(groups);
  const double bar_w = group_w * 0.8 / static_cast<double>(bars);
  for (size_t g = 0; g < chart.categories.size(); ++g) {
    const double gx = f.x0 + group_w * static_cast<double>(g);
    s += x_tick(f, gx + group_w / 2, chart.categories[g]);
    for (size_t b = 0; b < chart.series.size(); ++b) {
      if (b >= chart.values.size() || g >= chart.values[b].size()) continue;
      const double v = chart.values[b][g];
      if (!std::isfinite(v)) continue;
      const double top = y(std::max(v, yt.front()));
      const double base = y(std::max(0.0, yt.front()));
      const double bx = gx + group_w * 0.1 + bar_w * static_cast<double>(b);
      s += "<rect x=\"" + num(bx) + "\" y=\"" + num(std::min(top, base)) + "\" width=\"" +
           num(bar_w * 0.92) + "\" height=\"" + num(std::abs(base - top)) + "\" fill=\"" +
           color(b) + "\"><title>" +
           xml_escape(chart.series[b] + ", " + chart.categories[g] + ": " + format_number(v)) +
           "</title></rect>\n";
    }
  }
  s += legend(chart.series, false);
  return s + "</svg>\n";
}

}  // namespace strata::bench
