#include "model/timing_profile.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace strata {
namespace {

using nlohmann::json;

constexpr std::string_view kTimingFormatName = "strata-timing-profile";

// Where v falls on `axis`: the segment [i, i+1] and the fraction t within it. Below the
// first point t is clamped to 0; beyond the last point t > 1 extends the last segment.
struct AxisPosition {
  size_t i = 0;
  double t = 0;
};

AxisPosition locate_on_axis(const std::vector<double>& axis, double v) {
  if (axis.size() == 1 || v <= axis.front()) return {0, 0.0};
  size_t hi = static_cast<size_t>(std::upper_bound(axis.begin(), axis.end(), v) - axis.begin());
  if (hi >= axis.size()) hi = axis.size() - 1;  // beyond the last point: the last segment
  const size_t lo = hi - 1;
  return {lo, (v - axis[lo]) / (axis[hi] - axis[lo])};
}

// The value between a (at t = 0) and b (at t = 1); beyond b (t > 1) it grows at the
// segment's slope, or stays at b if the segment falls.
double lerp_or_extend(double a, double b, double t) {
  if (t > 1.0 && b < a) return b;
  return a + (b - a) * t;
}

Status read_timing_axis(const json& table, const char* table_name, const char* name,
                        double min_value, std::vector<double>& out) {
  const std::string where = std::string(table_name) + "." + name;
  auto it = table.find(name);
  if (it == table.end() || !it->is_array() || it->empty()) {
    return bad_argument(where + " must be a non-empty array of numbers");
  }
  for (const json& v : *it) {
    if (!v.is_number()) return bad_argument(where + " must hold numbers only");
    const double d = v.get<double>();
    if (!std::isfinite(d) || d < min_value) {
      return bad_argument(where + " values must be finite and >= " +
                          std::to_string(static_cast<int64_t>(min_value)));
    }
    if (!out.empty() && d <= out.back()) return bad_argument(where + " must increase strictly");
    out.push_back(d);
  }
  return {};
}

Result<TimingTable> read_timing_table(const json& root, const char* name, const char* x_name,
                                      double x_min) {
  auto it = root.find(name);
  if (it == root.end() || !it->is_object()) return bad_argument(std::string(name) + " is missing");
  TimingTable t;
  if (auto st = read_timing_axis(*it, name, x_name, x_min, t.x); !st)
    return std::unexpected(st.error());
  if (auto st = read_timing_axis(*it, name, "context_tokens", 0, t.y); !st) {
    return std::unexpected(st.error());
  }
  const std::string where = std::string(name) + ".ms";
  auto ms = it->find("ms");
  if (ms == it->end() || !ms->is_array() || ms->size() != t.x.size()) {
    return bad_argument(where + " must be an array of " + std::to_string(t.x.size()) +
                        " rows (one per " + x_name + ")");
  }
  for (size_t i = 0; i < t.x.size(); ++i) {
    const json& row = (*ms)[i];
    if (!row.is_array() || row.size() != t.y.size()) {
      return bad_argument(where + "[" + std::to_string(i) + "] must hold " +
                          std::to_string(t.y.size()) + " numbers (one per context_tokens)");
    }
    std::vector<double>& r = t.ms.emplace_back();
    for (const json& v : row) {
      const double d = v.is_number() ? v.get<double>() : -1.0;
      if (!std::isfinite(d) || d <= 0) {
        return bad_argument(where + "[" + std::to_string(i) +
                            "] must hold finite numbers of milliseconds > 0");
      }
      r.push_back(d);
    }
  }
  return t;
}

nlohmann::ordered_json timing_table_json(const TimingTable& t, const char* x_name) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j[x_name] = t.x;
  j["context_tokens"] = t.y;
  j["ms"] = t.ms;
  return j;
}

}  // namespace

double TimingTable::at(double xv, double yv) const {
  const AxisPosition px = locate_on_axis(x, xv);
  const AxisPosition py = locate_on_axis(y, yv);
  const size_t i1 = std::min(px.i + 1, x.size() - 1);
  const size_t j1 = std::min(py.i + 1, y.size() - 1);
  const double low = lerp_or_extend(ms[px.i][py.i], ms[px.i][j1], py.t);
  const double high = lerp_or_extend(ms[i1][py.i], ms[i1][j1], py.t);
  return lerp_or_extend(low, high, px.t);
}

Result<TimingProfile> TimingProfile::parse(std::string_view json_text) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return bad_argument("not valid JSON");
  if (!root.is_object()) return bad_argument("the profile must be a JSON object");
  if (root.value("format", std::string()) != kTimingFormatName) {
    return bad_argument("format must be \"" + std::string(kTimingFormatName) + "\"");
  }
  auto version = root.find("version");
  if (version == root.end() || !version->is_number_integer() ||
      version->get<int64_t>() != kFormatVersion) {
    return bad_argument("version must be " + std::to_string(kFormatVersion));
  }
  TimingProfile p;
  for (auto [field, out] : {std::pair{"model", &p.model}, std::pair{"machine", &p.machine},
                            std::pair{"source", &p.source}, std::pair{"notes", &p.notes}}) {
    auto it = root.find(field);
    if (it == root.end()) {
      if (std::string_view(field) == "notes") continue;
      return bad_argument(std::string(field) + " is missing");
    }
    if (!it->is_string()) return bad_argument(std::string(field) + " must be a string");
    *out = it->get<std::string>();
  }
  if (p.model.empty()) return bad_argument("model must name the model the profile was made on");
  auto prefill = read_timing_table(root, "prefill", "new_tokens", 1);
  if (!prefill) return std::unexpected(prefill.error());
  p.prefill = std::move(*prefill);
  auto decode = read_timing_table(root, "decode", "batch_size", 1);
  if (!decode) return std::unexpected(decode.error());
  p.decode = std::move(*decode);
  return p;
}

Result<TimingProfile> TimingProfile::load(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return make_error(ErrorCode::kNotFound, "timing profile " + path.string() + ": no such file");
  }
  std::ifstream f(path, std::ios::binary);
  std::stringstream text;
  text << f.rdbuf();
  if (!f)
    return make_error(ErrorCode::kIoError, "timing profile " + path.string() + ": unreadable");
  auto p = parse(text.str());
  if (!p) {
    return make_error(p.error().code, "timing profile " + path.string() + ": " + p.error().message);
  }
  return p;
}

std::string TimingProfile::to_json() const {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  j["format"] = kTimingFormatName;
  j["version"] = kFormatVersion;
  j["model"] = model;
  j["machine"] = machine;
  j["source"] = source;
  j["notes"] = notes;
  j["prefill"] = timing_table_json(prefill, "new_tokens");
  j["decode"] = timing_table_json(decode, "batch_size");
  return j.dump(2) + "\n";
}

}  // namespace strata
