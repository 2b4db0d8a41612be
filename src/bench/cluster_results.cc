#include "bench/cluster_results.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>

#include "bench/cluster_trace.h"
#include "bench/svg_chart.h"

namespace strata::bench {

namespace {

using ojson = nlohmann::ordered_json;

ojson finite_or_null(double v) {
  return std::isfinite(v) ? ojson(v) : ojson(nullptr);
}

std::string format_fixed(double v, const char* format) {
  if (!std::isfinite(v)) return "-";
  char buf[48];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

// "12/10/11"
std::string format_counts(const std::vector<int64_t>& counts) {
  std::string out;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (i > 0) out += "/";
    out += std::to_string(counts[i]);
  }
  return out.empty() ? "-" : out;
}

double fraction(double part, double whole) {
  return whole > 0 ? part / whole : 0;
}

struct MinMeanMax {
  double min = kNaN;
  double mean = kNaN;
  double max = kNaN;
};

MinMeanMax min_mean_max(const std::vector<int64_t>& v) {
  MinMeanMax m;
  if (v.empty()) return m;
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  m.min = static_cast<double>(*lo);
  m.max = static_cast<double>(*hi);
  m.mean = static_cast<double>(std::accumulate(v.begin(), v.end(), int64_t{0})) /
           static_cast<double>(v.size());
  return m;
}

int32_t worker_index(const PhaseRecord& p, const std::string& url) {
  for (size_t i = 0; i < p.workers.size(); ++i) {
    if (p.workers[i] == url) return static_cast<int32_t>(i);
  }
  return -1;
}

const PhaseRecord* find_phase(const ClusterRecord& r, const std::string& workload,
                              const std::string& policy, double rate_per_s) {
  for (const PhaseRecord& p : r.phases) {
    if (p.workload == workload && p.policy == policy && p.rate_per_s == rate_per_s) return &p;
  }
  return nullptr;
}

// The policies of a workload, in run order, once each.
std::vector<std::string> policies_of(const ClusterRecord& r, const std::string& workload) {
  std::vector<std::string> out;
  for (const PhaseRecord& p : r.phases) {
    if (p.workload == workload && std::find(out.begin(), out.end(), p.policy) == out.end()) {
      out.push_back(p.policy);
    }
  }
  return out;
}

std::vector<double> rates_of(const ClusterRecord& r) {
  std::vector<double> out;
  for (const PhaseRecord& p : r.phases) {
    if (p.workload == kSharedPrefix &&
        std::find(out.begin(), out.end(), p.rate_per_s) == out.end()) {
      out.push_back(p.rate_per_s);
    }
  }
  return out;
}

ojson figures_json(const PhaseRecord& p, const PolicyFigures& f) {
  ojson j{{"name", f.name},
          {"router_args", p.router_args},
          {"requests", f.requests},
          {"failed_requests", f.failed_requests},
          {"ttft_s", to_json(f.ttft)},
          {"itl_s", to_json(f.itl)},
          {"wall_s", f.wall_s},
          {"output_tokens_per_s", f.output_tokens_per_s},
          {"prompt_tokens", f.prompt_tokens},
          {"cached_tokens", f.cached_tokens},
          {"cache_hit_fraction", f.cache_hit_fraction},
          {"predicted_hit_fraction", f.predicted_hit_fraction},
          {"router_reported_hit_fraction",
           fraction(p.router.reported_cached_tokens, p.router.prompt_tokens)},
          {"requests_per_worker", f.requests_per_worker},
          {"requests_per_worker_max_over_min", finite_or_null(spread(f.requests_per_worker))},
          {"sessions_per_worker", f.sessions_per_worker},
          {"sessions_per_worker_max_over_min", finite_or_null(spread(f.sessions_per_worker))},
          {"router_queue", {{"queued", f.queued}, {"mean_s", f.queue_mean_s}}},
          {"router_retries", f.retries},
          {"router_rejected", f.rejected},
          {"router_replicas", p.routers},
          {"router_failovers", f.router_failovers},
          {"router_killed_at_s", p.killed_router_at_s >= 0 ? ojson(p.killed_router_at_s) : ojson()},
          {"refused_retries", f.refused_retries},
          {"evicted_pages_per_worker", p.evicted_pages_per_worker},
          {"router_cpu_s", p.router_cpu_s >= 0 ? ojson(p.router_cpu_s) : ojson()},
          {"worker_cpu_s", p.worker_cpu_s >= 0 ? ojson(p.worker_cpu_s) : ojson()},
          {"streams_broken", static_cast<int64_t>(p.router.streams_broken)},
          {"computed_tokens_per_worker", f.computed_tokens_per_worker},
          {"router_decision",
           {{"count", f.decisions},
            {"mean_s", finite_or_null(f.decision_mean_s)},
            {"p50_at_most_s", finite_or_null(f.decision_p50_s)},
            {"p99_at_most_s", finite_or_null(f.decision_p99_s)},
            {"last_bound_s", f.decision_top_bound_s}}}};
  if (p.workload == kSharedPrefix) {
    j["rate_per_s"] = p.rate_per_s;
    j["reusable_fraction"] = f.reusable_fraction;
  }
  if (p.workload != kSharedPrefix) j["sessions"] = p.sessions_planned;
  if (p.workload == kTrace) {
    // Sessions are the trace's prefix families (requests sharing their first block).
    j["ideal_hit_fraction"] = f.reusable_fraction;
    j["hit_of_ideal"] =
        finite_or_null(f.reusable_fraction > 0 ? f.cache_hit_fraction / f.reusable_fraction : kNaN);
    j["arrival_span_s"] = p.arrival_span_s;
  }
  if (p.workload == kFailure) {
    j["killed_worker"] =
        p.killed_worker >= 0 ? ojson(p.workers[static_cast<size_t>(p.killed_worker)]) : ojson();
    j["killed_at_s"] = finite_or_null(p.killed_at_s >= 0 ? p.killed_at_s : kNaN);
    j["restarted_at_s"] = finite_or_null(p.restarted_at_s >= 0 ? p.restarted_at_s : kNaN);
    j["failed_streaming_on_killed"] = f.failed_streaming_on_killed;
    j["failed_other"] = f.failed_other;
    j["back_after_s"] = finite_or_null(f.back_after_s >= 0 ? f.back_after_s : kNaN);
  }
  if (!p.error.empty()) j["error"] = p.error;
  return j;
}

ojson requests_json(const PhaseRecord& p) {
  ojson out = ojson::array();
  for (const RoutedRequest& q : p.requests) {
    ojson j{{"start_s", q.start_s},
            {"end_s", q.end_s},
            {"ok", q.ok},
            {"status", q.status},
            {"worker", worker_index(p, q.worker)},
            {"ttft_s", q.ttft_s},
            {"prompt_tokens", q.prompt_tokens},
            {"cached_tokens", q.cached_tokens},
            {"completion_tokens", q.completion_tokens}};
    if (q.group >= 0) j["group"] = q.group;
    if (q.trace_line >= 0) {
      j["line"] = q.trace_line;
      j["ideal_hit_tokens"] = q.reusable_tokens;
    }
    if (q.session >= 0) {
      j["session"] = q.session;
      j["turn"] = q.turn;
    }
    if (q.broken_stream) j["broken_stream"] = true;
    if (q.router_failovers > 0) j["router_failovers"] = q.router_failovers;
    if (q.refused_retries > 0) j["refused_retries"] = q.refused_retries;
    if (!q.error.empty()) j["error"] = q.error;
    out.push_back(std::move(j));
  }
  return out;
}

std::string check_line(const Check& c) {
  return std::string("- ") + (c.passed ? "PASS " : "**FAIL** ") + c.name + ": " + c.detail + "\n";
}

}  // namespace

RouterCounters parse_router_metrics(const std::string& text) {
  RouterCounters c;
  const std::vector<std::pair<const char*, double RouterCounters::*>> names = {
      {"strata_router_prompt_tokens_total", &RouterCounters::prompt_tokens},
      {"strata_router_predicted_cached_tokens_total", &RouterCounters::predicted_cached_tokens},
      {"strata_router_reported_cached_tokens_total", &RouterCounters::reported_cached_tokens},
      {"strata_router_queued_total", &RouterCounters::queued},
      {"strata_router_queue_seconds_sum", &RouterCounters::queue_seconds_sum},
      {"strata_router_queue_seconds_count", &RouterCounters::queue_seconds_count},
      {"strata_router_retries_total", &RouterCounters::retries},
      {"strata_router_rejected_total", &RouterCounters::rejected},
      {"strata_router_streams_broken_total", &RouterCounters::streams_broken},
      {"strata_router_decision_seconds_sum", &RouterCounters::decision_seconds_sum},
      {"strata_router_decision_seconds_count", &RouterCounters::decision_seconds_count}};
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string::npos) continue;
    const std::string_view name(line.data(), name_end);
    const size_t value_at = line.rfind(' ');
    if (value_at == std::string::npos || value_at + 1 >= line.size()) continue;
    if (name == "strata_router_decision_seconds_bucket") {
      const size_t le_at = line.find("le=\"");
      if (le_at == std::string::npos) continue;
      const size_t le_end = line.find('"', le_at + 4);
      const std::string le = line.substr(le_at + 4, le_end - le_at - 4);
      try {
        const double bound = le == "+Inf" ? std::numeric_limits<double>::infinity() : std::stod(le);
        c.decision_buckets[bound] += std::stod(line.substr(value_at + 1));
      } catch (const std::exception&) {
      }
      continue;
    }
    for (const auto& [metric, field] : names) {
      if (name != metric) continue;
      try {
        c.*field += std::stod(line.substr(value_at + 1));
      } catch (const std::exception&) {
      }
    }
  }
  return c;
}

RouterCounters operator-(const RouterCounters& a, const RouterCounters& b) {
  RouterCounters d;
  d.prompt_tokens = a.prompt_tokens - b.prompt_tokens;
  d.predicted_cached_tokens = a.predicted_cached_tokens - b.predicted_cached_tokens;
  d.reported_cached_tokens = a.reported_cached_tokens - b.reported_cached_tokens;
  d.queued = a.queued - b.queued;
  d.queue_seconds_sum = a.queue_seconds_sum - b.queue_seconds_sum;
  d.queue_seconds_count = a.queue_seconds_count - b.queue_seconds_count;
  d.retries = a.retries - b.retries;
  d.rejected = a.rejected - b.rejected;
  d.decision_seconds_sum = a.decision_seconds_sum - b.decision_seconds_sum;
  d.decision_seconds_count = a.decision_seconds_count - b.decision_seconds_count;
  for (const auto& [bound, count] : a.decision_buckets) {
    const auto it = b.decision_buckets.find(bound);
    d.decision_buckets[bound] = count - (it == b.decision_buckets.end() ? 0 : it->second);
  }
  d.streams_broken = a.streams_broken - b.streams_broken;
  return d;
}

double bucket_quantile(const std::map<double, double>& buckets, double q) {
  if (buckets.empty()) return kNaN;
  const double total = buckets.rbegin()->second;
  if (!(total > 0)) return kNaN;
  for (const auto& [bound, count] : buckets) {
    if (count >= q * total) return bound;
  }
  return buckets.rbegin()->first;
}

PolicyFigures summarize_phase(const PhaseRecord& p) {
  PolicyFigures f;
  f.name = p.policy;
  f.requests = static_cast<int64_t>(p.requests.size());
  f.wall_s = p.wall_s;
  f.requests_per_worker.assign(p.workers.size(), 0);
  f.sessions_per_worker.assign(p.workers.size(), 0);
  f.computed_tokens_per_worker.assign(p.workers.size(), 0);
  const std::string killed =
      p.killed_worker >= 0 && static_cast<size_t>(p.killed_worker) < p.workers.size()
          ? p.workers[static_cast<size_t>(p.killed_worker)]
          : std::string();
  std::vector<double> ttft, itl;
  int64_t completion = 0, reusable = 0;
  double first_back_s = std::numeric_limits<double>::infinity();
  for (const RoutedRequest& q : p.requests) {
    const int32_t w = worker_index(p, q.worker);
    if (q.session >= 0 && q.turn == 0 && w >= 0) ++f.sessions_per_worker[static_cast<size_t>(w)];
    if (!killed.empty() && q.worker == killed && p.restarted_at_s >= 0 &&
        q.start_s >= p.restarted_at_s) {
      first_back_s = std::min(first_back_s, q.start_s);
    }
    f.router_failovers += q.router_failovers;
    f.refused_retries += q.refused_retries;
    if (!q.ok) {
      ++f.failed_requests;
      const bool excused = !killed.empty() && q.worker == killed && q.broken_stream &&
                           p.killed_at_s >= 0 && q.start_s <= p.killed_at_s;
      ++(excused ? f.failed_streaming_on_killed : f.failed_other);
      continue;
    }
    if (w >= 0) {
      ++f.requests_per_worker[static_cast<size_t>(w)];
      f.computed_tokens_per_worker[static_cast<size_t>(w)] +=
          std::max<int64_t>(0, q.prompt_tokens - q.cached_tokens);
    }
    ttft.push_back(q.ttft_s);
    itl.insert(itl.end(), q.itl_s.begin(), q.itl_s.end());
    f.prompt_tokens += q.prompt_tokens;
    f.cached_tokens += q.cached_tokens;
    completion += q.completion_tokens;
    reusable += q.reusable_tokens;
  }
  if (killed.empty()) f.failed_other = f.failed_requests;
  f.ttft = summarize(ttft);
  f.itl = summarize(itl);
  f.output_tokens_per_s = p.wall_s > 0 ? static_cast<double>(completion) / p.wall_s : 0;
  f.cache_hit_fraction =
      fraction(static_cast<double>(f.cached_tokens), static_cast<double>(f.prompt_tokens));
  f.reusable_fraction =
      fraction(static_cast<double>(reusable), static_cast<double>(f.prompt_tokens));
  f.predicted_hit_fraction = fraction(p.router.predicted_cached_tokens, p.router.prompt_tokens);
  f.queued = static_cast<int64_t>(p.router.queued);
  f.queue_mean_s = fraction(p.router.queue_seconds_sum, p.router.queue_seconds_count);
  f.retries = static_cast<int64_t>(p.router.retries);
  f.rejected = static_cast<int64_t>(p.router.rejected);
  f.replicas = p.routers;
  f.evicted_pages_per_worker = p.evicted_pages_per_worker;
  f.router_cpu_s = p.router_cpu_s;
  f.worker_cpu_s = p.worker_cpu_s;
  f.decisions = static_cast<int64_t>(p.router.decision_seconds_count);
  f.decision_mean_s =
      f.decisions > 0 ? p.router.decision_seconds_sum / p.router.decision_seconds_count : kNaN;
  f.decision_p50_s = bucket_quantile(p.router.decision_buckets, 0.5);
  f.decision_p99_s = bucket_quantile(p.router.decision_buckets, 0.99);
  for (const auto& [bound, count] : p.router.decision_buckets) {
    if (std::isfinite(bound)) f.decision_top_bound_s = std::max(f.decision_top_bound_s, bound);
  }
  if (std::isfinite(first_back_s)) f.back_after_s = first_back_s - p.restarted_at_s;
  return f;
}

double spread(const std::vector<int64_t>& counts) {
  if (counts.empty()) return kNaN;
  const auto [lo, hi] = std::minmax_element(counts.begin(), counts.end());
  if (*lo <= 0) return kNaN;
  return static_cast<double>(*hi) / static_cast<double>(*lo);
}

int32_t saturation_level(const std::vector<PhaseRecord>& levels) {
  if (levels.empty()) return -1;
  const double base_p90 = summarize_phase(levels.front()).ttft.p90;
  for (size_t i = 0; i < levels.size(); ++i) {
    const double p90 = summarize_phase(levels[i]).ttft.p90;
    const bool slow = i > 0 && std::isfinite(base_p90) && p90 >= 2 * base_p90;
    const bool behind =
        levels[i].arrival_span_s > 0 && levels[i].wall_s >= 1.5 * levels[i].arrival_span_s;
    if (slow || behind) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(levels.size() - 1);
}

std::vector<const PhaseRecord*> phases_of(const ClusterRecord& r, const std::string& workload,
                                          const std::string& policy) {
  std::vector<const PhaseRecord*> out;
  for (const PhaseRecord& p : r.phases) {
    if (p.workload == workload && (policy.empty() || p.policy == policy)) out.push_back(&p);
  }
  return out;
}

std::string no_floor_reference(const ClusterRecord& r) {
  return phases_of(r, kAgentic, "default-no-floor").empty() ? "precise" : "default-no-floor";
}

std::vector<Check> cluster_checks(const ClusterRecord& r, const ClusterTargets& t) {
  std::vector<Check> out;
  // Workload 1, at the rate where round-robin saturates.
  std::vector<PhaseRecord> rr;
  for (const PhaseRecord* p : phases_of(r, kSharedPrefix, "round-robin")) rr.push_back(*p);
  const int32_t sat = saturation_level(rr);
  if (sat >= 0) {
    const PhaseRecord& rr_phase = rr[static_cast<size_t>(sat)];
    if (const PhaseRecord* d = find_phase(r, kSharedPrefix, "default", rr_phase.rate_per_s)) {
      const PolicyFigures rf = summarize_phase(rr_phase);
      const PolicyFigures df = summarize_phase(*d);
      const double ratio = df.ttft.p90 / rf.ttft.p90;
      std::string detail = "at " + format_fixed(rr_phase.rate_per_s, "%g") + " req/s: default ";
      detail += format_ms(df.ttft.p90);
      detail += " / round-robin ";
      detail += format_ms(rf.ttft.p90);
      detail += " = " + format_fixed(ratio, "%.2f") + ", target <= ";
      detail += format_fixed(t.max_ttft_p90_ratio, "%.2f");
      out.push_back(Check{"shared-prefix TTFT p90",
                          std::isfinite(ratio) && ratio <= t.max_ttft_p90_ratio, detail});
      const double share =
          df.reusable_fraction > 0 ? df.cache_hit_fraction / df.reusable_fraction : kNaN;
      std::string d2 = "default hit " + format_percent(df.cache_hit_fraction);
      d2 += " of a reusable " + format_percent(df.reusable_fraction);
      d2 += " = " + format_fixed(share, "%.2f") + ", target >= ";
      d2 += format_fixed(t.min_hit_of_reusable, "%.2f");
      out.push_back(Check{"shared-prefix hit fraction",
                          std::isfinite(share) && share >= t.min_hit_of_reusable, d2});
    }
  }
  // Workload 2.
  const auto def2 = phases_of(r, kAgentic, "default");
  if (!def2.empty()) {
    const PolicyFigures df = summarize_phase(*def2.front());
    const int64_t total =
        std::accumulate(df.sessions_per_worker.begin(), df.sessions_per_worker.end(), int64_t{0});
    const double mean =
        df.sessions_per_worker.empty()
            ? 0
            : static_cast<double>(total) / static_cast<double>(df.sessions_per_worker.size());
    const int64_t least =
        df.sessions_per_worker.empty()
            ? 0
            : *std::min_element(df.sessions_per_worker.begin(), df.sessions_per_worker.end());
    std::string detail =
        "default: new sessions per worker " + format_counts(df.sessions_per_worker);
    detail += ", least " + std::to_string(least) + " vs mean " + format_fixed(mean, "%.1f");
    detail += ", target >= " + format_fixed(t.min_session_share, "%.2f") + " of the mean";
    out.push_back(Check{"agentic sessions spread",
                        mean > 0 && static_cast<double>(least) >= t.min_session_share * mean,
                        detail});
    const std::string ref = no_floor_reference(r);
    const auto ref2 = phases_of(r, kAgentic, ref);
    if (!ref2.empty()) {
      const PolicyFigures pf = summarize_phase(*ref2.front());
      const double drop = pf.cache_hit_fraction - df.cache_hit_fraction;
      std::string d2 = "default " + format_percent(df.cache_hit_fraction);
      d2 += " vs " + ref + " " + format_percent(pf.cache_hit_fraction);
      d2 += ": " + format_fixed(drop * 100, "%.1f") + " points lower, target <= ";
      d2 += format_fixed(t.max_hit_drop * 100, "%.1f");
      out.push_back(Check{"agentic hit fraction vs " + ref, drop <= t.max_hit_drop, d2});
    }
  }
  // Workload 3.
  const auto def3 = phases_of(r, kFailure, "default");
  if (!def3.empty() && def3.front()->killed_worker >= 0) {
    const PolicyFigures df = summarize_phase(*def3.front());
    std::string detail = "default: " + std::to_string(df.failed_other);
    detail += " failed besides the " + std::to_string(df.failed_streaming_on_killed);
    detail += " streaming on the killed worker (of " + std::to_string(df.requests) + ")";
    out.push_back(Check{"failure: no other failed request", df.failed_other == 0, detail});
    std::string d2 = "default: first request to the restarted worker ";
    d2 += df.back_after_s >= 0 ? format_fixed(df.back_after_s, "%.1f s") : std::string("never");
    d2 += " after it answered /health, target <= " + format_fixed(t.max_back_after_s, "%.0f s");
    out.push_back(Check{"failure: restarted worker back",
                        df.back_after_s >= 0 && df.back_after_s <= t.max_back_after_s, d2});
  }
  // Workload 4.
  const auto def4 = phases_of(r, kTrace, "default");
  if (!def4.empty()) {
    const PolicyFigures df = summarize_phase(*def4.front());
    const double share =
        df.reusable_fraction > 0 ? df.cache_hit_fraction / df.reusable_fraction : kNaN;
    std::string detail = "default hit " + format_percent(df.cache_hit_fraction);
    detail += " of an ideal " + format_percent(df.reusable_fraction);
    detail += " = " + format_fixed(share, "%.2f") + ", target >= ";
    detail += format_fixed(t.min_hit_of_ideal, "%.2f");
    out.push_back(Check{"trace hit fraction of the ideal",
                        std::isfinite(share) && share >= t.min_hit_of_ideal, detail});
    const MinMeanMax s = min_mean_max(df.sessions_per_worker);
    std::string d2 = "default: prefix families per worker " + format_fixed(s.min, "%.0f");
    d2 += " to " + format_fixed(s.max, "%.0f") + ", least vs mean " + format_fixed(s.mean, "%.1f");
    d2 += ", target >= " + format_fixed(t.min_trace_session_share, "%.2f") + " of the mean";
    out.push_back(Check{"trace sessions spread",
                        s.mean > 0 && s.min >= t.min_trace_session_share * s.mean, d2});
    const auto rr4 = phases_of(r, kTrace, "round-robin");
    if (!rr4.empty()) {
      const PolicyFigures rf = summarize_phase(*rr4.front());
      const double ratio = df.ttft.p99 / rf.ttft.p99;
      std::string d3 = "default " + format_ms(df.ttft.p99) + " / round-robin ";
      d3 += format_ms(rf.ttft.p99) + " = " + format_fixed(ratio, "%.2f") + ", target <= ";
      d3 += format_fixed(t.max_trace_ttft_p99_ratio, "%.2f");
      d3 += " (round-robin's last answer at " + format_fixed(rr4.front()->wall_s, "%.1f s");
      d3 += " for arrivals over " + format_fixed(rr4.front()->arrival_span_s, "%.1f s");
      d3 += ", " + std::to_string(rf.queued) + " queued)";
      out.push_back(Check{"trace TTFT p99 vs round-robin",
                          std::isfinite(ratio) && ratio <= t.max_trace_ttft_p99_ratio, d3});
    }
  }
  return out;
}

std::vector<Check> validity_checks(const ClusterRecord& r) {
  std::vector<Check> out;
  int64_t phases = 0, bad = 0;
  std::string first;
  for (const PhaseRecord& p : r.phases) {
    ++phases;
    const PolicyFigures f = summarize_phase(p);
    if (p.error.empty() && f.requests > 0 && f.requests > f.failed_requests) continue;
    ++bad;
    if (first.empty()) {
      first = p.workload + "/" + p.policy + ": " +
              (p.error.empty() ? std::to_string(f.requests - f.failed_requests) +
                                     " requests completed of " + std::to_string(f.requests)
                               : p.error);
    }
  }
  std::string detail = std::to_string(phases - bad) + " of " + std::to_string(phases);
  detail += " phases completed requests without an error";
  if (!first.empty()) detail += "; first: " + first;
  out.push_back(Check{"every phase ran", phases > 0 && bad == 0, detail});
  return out;
}

Table policies_table(const std::vector<PolicyFigures>& figures, bool failure_columns) {
  Table t;
  t.header = {"Policy",        "Requests",        "Failed",          "TTFT p50",     "TTFT p90",
              "TTFT p99",      "ITL p50",         "ITL p99",         "Output tok/s", "Cache hit",
              "Predicted hit", "Requests/worker", "Sessions/worker", "Queued (mean)"};
  if (failure_columns) {
    t.header.push_back("Failed on killed / other");
    t.header.push_back("Back after");
  }
  for (const PolicyFigures& f : figures) {
    std::vector<std::string> row = {
        f.name,
        std::to_string(f.requests),
        std::to_string(f.failed_requests),
        format_ms(f.ttft.p50),
        format_ms(f.ttft.p90),
        format_ms(f.ttft.p99),
        format_ms(f.itl.p50),
        format_ms(f.itl.p99),
        format_fixed(f.output_tokens_per_s, "%.1f"),
        format_percent(f.cache_hit_fraction),
        format_percent(f.predicted_hit_fraction),
        format_counts(f.requests_per_worker),
        format_counts(f.sessions_per_worker),
        std::to_string(f.queued) + " (" + format_ms(f.queue_mean_s) + ")"};
    if (failure_columns) {
      row.push_back(std::to_string(f.failed_streaming_on_killed) + " / " +
                    std::to_string(f.failed_other));
      row.push_back(f.back_after_s >= 0 ? format_fixed(f.back_after_s, "%.1f s")
                                        : std::string("-"));
    }
    t.rows.push_back(std::move(row));
  }
  return t;
}

Table trace_table(const std::vector<PolicyFigures>& figures) {
  Table t;
  t.header = {"Policy",
              "Requests",
              "Failed",
              "TTFT p50",
              "TTFT p90",
              "TTFT p99",
              "ITL p50",
              "ITL p90",
              "ITL p99",
              "Cache hit",
              "Of ideal",
              "Requests/worker",
              "Families/worker",
              "Prefill tok/worker",
              "Queued / 429 / moved",
              "Decision p50 / p99",
              "Replicas (failovers)",
              "Evicted pages/worker",
              "CPU s: routers / workers"};
  const auto range = [](const std::vector<int64_t>& v, const char* format) {
    const MinMeanMax m = min_mean_max(v);
    return format_fixed(m.min, format) + "–" + format_fixed(m.max, format) + " (" +
           format_fixed(m.mean, "%.1f") + ")";
  };
  for (const PolicyFigures& f : figures) {
    const auto bound_us = [&f](double s) {
      if (std::isinf(s)) return "> " + format_fixed(f.decision_top_bound_s * 1e6, "%.0f") + " µs";
      return std::isfinite(s) ? "≤ " + format_fixed(s * 1e6, "%.0f") + " µs" : std::string("-");
    };
    t.rows.push_back(
        {f.name, std::to_string(f.requests), std::to_string(f.failed_requests),
         format_ms(f.ttft.p50), format_ms(f.ttft.p90), format_ms(f.ttft.p99), format_ms(f.itl.p50),
         format_ms(f.itl.p90), format_ms(f.itl.p99), format_percent(f.cache_hit_fraction),
         format_fixed(f.reusable_fraction > 0 ? f.cache_hit_fraction / f.reusable_fraction : kNaN,
                      "%.2f"),
         range(f.requests_per_worker, "%.0f"), range(f.sessions_per_worker, "%.0f"),
         range(f.computed_tokens_per_worker, "%.0f"),
         std::to_string(f.queued) + " / " + std::to_string(f.rejected) + " / " +
             std::to_string(f.retries),
         bound_us(f.decision_p50_s) + " / " + bound_us(f.decision_p99_s),
         std::to_string(f.replicas) + " (" + std::to_string(f.router_failovers) + ")",
         f.evicted_pages_per_worker.empty() ? std::string("-")
                                            : range(f.evicted_pages_per_worker, "%.0f"),
         f.router_cpu_s < 0 ? std::string("-")
                            : format_fixed(f.router_cpu_s, "%.1f") + " / " +
                                  format_fixed(f.worker_cpu_s, "%.1f")});
  }
  return t;
}

ojson cluster_results_json(const ClusterRecord& r, const std::vector<Check>& checks) {
  ojson workloads = ojson::array();
  // Workload 1: by level, and the saturation level's figures as the workload's policies.
  if (!phases_of(r, kSharedPrefix).empty()) {
    std::vector<PhaseRecord> rr;
    for (const PhaseRecord* p : phases_of(r, kSharedPrefix, "round-robin")) rr.push_back(*p);
    const int32_t sat = saturation_level(rr);
    const std::vector<double> rates = rates_of(r);
    const double sat_rate =
        sat >= 0 ? rr[static_cast<size_t>(sat)].rate_per_s : (rates.empty() ? 0.0 : rates.back());
    ojson levels = ojson::array();
    ojson at_sat = ojson::array();
    for (double rate : rates) {
      ojson policies = ojson::array();
      for (const std::string& name : policies_of(r, kSharedPrefix)) {
        if (const PhaseRecord* p = find_phase(r, kSharedPrefix, name, rate)) {
          ojson fj = figures_json(*p, summarize_phase(*p));
          policies.push_back(fj);
          if (rate == sat_rate) at_sat.push_back(fj);
        }
      }
      levels.push_back(ojson{{"rate_per_s", rate}, {"policies", policies}});
    }
    workloads.push_back(
        ojson{{"name", kSharedPrefix},
              {"saturation",
               {{"rate_per_s", sat_rate}, {"by", sat >= 0 ? "round-robin" : "highest rate"}}},
              {"policies", at_sat},
              {"levels", levels}});
  }
  for (const char* name : {kAgentic, kFailure, kTrace}) {
    const auto phases = phases_of(r, name);
    if (phases.empty()) continue;
    ojson policies = ojson::array();
    for (const PhaseRecord* p : phases) policies.push_back(figures_json(*p, summarize_phase(*p)));
    workloads.push_back(ojson{{"name", name}, {"policies", policies}});
  }
  ojson raw = ojson::array();
  for (const PhaseRecord& p : r.phases) {
    raw.push_back(ojson{{"workload", p.workload},
                        {"policy", p.policy},
                        {"rate_per_s", p.rate_per_s},
                        {"workers", p.workers},
                        {"requests", requests_json(p)}});
  }
  return ojson{{"scenario", "cluster"},
               {"finished_at", utc_timestamp()},
               {"parameters", r.parameters},
               {"machine", r.machine},
               {"model", r.model},
               {"cluster", r.cluster},
               {"workloads", workloads},
               {"checks", to_json(checks)},
               {"error", r.error.empty() ? ojson(nullptr) : ojson(r.error)},
               {"passed", r.error.empty() && all_passed(checks)},
               {"phases", raw}};
}

std::string cluster_summary_markdown(const ClusterRecord& r, const std::vector<Check>& checks) {
  std::string md = "Model `" + r.model + "`; machine " + machine_line(r.machine) + ".\n\n";
  if (!phases_of(r, kSharedPrefix).empty()) {
    std::vector<PhaseRecord> rr;
    for (const PhaseRecord* p : phases_of(r, kSharedPrefix, "round-robin")) rr.push_back(*p);
    const int32_t sat = saturation_level(rr);
    const std::vector<double> rates = rates_of(r);
    const double sat_rate = sat >= 0 ? rr[static_cast<size_t>(sat)].rate_per_s : rates.back();
    md += "**Workload 1: shared-prefix groups**, at " + format_fixed(sat_rate, "%g") + " req/s (" +
          (sat >= 0 ? "where round-robin saturates" : "the highest rate") + "):\n\n";
    std::vector<PolicyFigures> figs;
    for (const std::string& name : policies_of(r, kSharedPrefix)) {
      if (const PhaseRecord* p = find_phase(r, kSharedPrefix, name, sat_rate)) {
        figs.push_back(summarize_phase(*p));
      }
    }
    md += to_markdown(policies_table(figs, false)) + "\n";
    Table sweep;
    sweep.header = {"TTFT p90 / cache hit"};
    for (double rate : rates) sweep.header.push_back(format_fixed(rate, "%g") + " req/s");
    for (const std::string& name : policies_of(r, kSharedPrefix)) {
      std::vector<std::string> row = {name};
      for (double rate : rates) {
        const PhaseRecord* p = find_phase(r, kSharedPrefix, name, rate);
        if (p == nullptr) {
          row.push_back("-");
          continue;
        }
        const PolicyFigures f = summarize_phase(*p);
        row.push_back(format_ms(f.ttft.p90) + " / " + format_percent(f.cache_hit_fraction));
      }
      sweep.rows.push_back(std::move(row));
    }
    md += "The sweep (the reusable share of the prompt tokens: ";
    const auto first = phases_of(r, kSharedPrefix);
    md += format_percent(summarize_phase(*first.front()).reusable_fraction) +
          " at the first rate):\n\n";
    md += to_markdown(sweep) + "\n";
  }
  for (const char* name : {kAgentic, kFailure}) {
    const auto phases = phases_of(r, name);
    if (phases.empty()) continue;
    std::vector<PolicyFigures> figs;
    for (const PhaseRecord* p : phases) figs.push_back(summarize_phase(*p));
    md += std::string(name == std::string(kAgentic) ? "**Workload 2: agentic sessions**"
                                                    : "**Workload 3: a worker killed and "
                                                      "restarted**");
    if (name == std::string(kFailure) && phases.front()->killed_at_s >= 0) {
      md += " (killed at " + format_fixed(phases.front()->killed_at_s, "%.0f s") +
            ", restarted at " + format_fixed(phases.front()->restarted_at_s, "%.0f s") + ")";
    }
    md += ":\n\n" + to_markdown(policies_table(figs, name == std::string(kFailure))) + "\n";
  }
  if (const auto phases = phases_of(r, kTrace); !phases.empty()) {
    md += "**Workload 4: trace replay**";
    if (r.cluster.contains("trace")) {
      const ojson& t = r.cluster["trace"];
      md += " (`" + t.value("file", std::string()) + "`: ";
      md += std::to_string(t.value("requests", int64_t{0})) + " requests";
      if (t.value("skipped_beyond_context", int64_t{0}) > 0) {
        md += " (" + std::to_string(t.value("skipped_beyond_context", int64_t{0})) +
              " more skipped: beyond the model's context)";
      }
      md += ", arrivals over " + format_fixed(t.value("arrival_span_s", 0.0), "%.1f s");
      md += " at time scale " + format_fixed(t.value("time_scale", 0.0), "%g");
      const ojson ideal = t.value("ideal", ojson::object());
      md += "; ideal hit " + format_percent(ideal.value("token_fraction", 0.0)) +
            " of prompt tokens, " + format_percent(ideal.value("block_fraction", 0.0)) +
            " of blocks)";
    }
    std::vector<PolicyFigures> figs;
    for (const PhaseRecord* p : phases) figs.push_back(summarize_phase(*p));
    md += ":\n\n" + to_markdown(trace_table(figs)) + "\n";
  }
  md += "Checks:\n\n";
  for (const Check& c : checks) md += check_line(c);
  return md;
}

Status write_cluster_outputs(const std::string& out_dir, const ClusterRecord& r,
                             const std::vector<Check>& checks) {
  const std::filesystem::path out = out_dir;
  if (auto st = write_file(out / "results.json", cluster_results_json(r, checks).dump(2) + "\n");
      !st) {
    return st;
  }
  if (auto st = write_file(out / "summary.md", cluster_summary_markdown(r, checks)); !st) return st;
  // TTFT p90 against the rate, one line per policy.
  if (!phases_of(r, kSharedPrefix).empty()) {
    LineChart c{.title = "Shared-prefix groups: TTFT p90 by arrival rate",
                .x_label = "requests per second",
                .y_label = "TTFT p90 (ms)"};
    for (const std::string& name : policies_of(r, kSharedPrefix)) {
      ChartSeries s{name, {}, {}};
      for (const PhaseRecord* p : phases_of(r, kSharedPrefix, name)) {
        s.x.push_back(p->rate_per_s);
        s.y.push_back(summarize_phase(*p).ttft.p90 * 1000);
      }
      c.series.push_back(std::move(s));
    }
    if (auto st = write_file(out / "cluster_shared_prefix_ttft.svg", render_line_chart(c)); !st) {
      return st;
    }
  }
  // Per workload and policy: TTFT p90 and hit fraction (shared-prefix at its last rate).
  std::vector<std::string> workloads, policies;
  for (const PhaseRecord& p : r.phases) {
    if (std::find(workloads.begin(), workloads.end(), p.workload) == workloads.end()) {
      workloads.push_back(p.workload);
    }
    if (std::find(policies.begin(), policies.end(), p.policy) == policies.end()) {
      policies.push_back(p.policy);
    }
  }
  auto last_phase = [&](const std::string& w, const std::string& pol) -> const PhaseRecord* {
    const auto ps = phases_of(r, w, pol);
    return ps.empty() ? nullptr : ps.back();
  };
  BarChart ttft{.title = "TTFT p90 by workload and policy (shared-prefix: highest rate)",
                .y_label = "milliseconds",
                .categories = workloads,
                .series = policies,
                .values = {}};
  BarChart hit{.title = "Cache hit fraction by workload and policy (from usage)",
               .y_label = "percent of prompt tokens",
               .categories = workloads,
               .series = policies,
               .values = {}};
  for (const std::string& pol : policies) {
    std::vector<double> t, h;
    for (const std::string& w : workloads) {
      const PhaseRecord* p = last_phase(w, pol);
      if (p == nullptr) {
        t.push_back(kNaN);
        h.push_back(kNaN);
        continue;
      }
      const PolicyFigures f = summarize_phase(*p);
      t.push_back(f.ttft.p90 * 1000);
      h.push_back(f.cache_hit_fraction * 100);
    }
    ttft.values.push_back(std::move(t));
    hit.values.push_back(std::move(h));
  }
  if (auto st = write_file(out / "cluster_ttft_p90.svg", render_bar_chart(ttft)); !st) return st;
  if (auto st = write_file(out / "cluster_hit_fraction.svg", render_bar_chart(hit)); !st) {
    return st;
  }
  // The trace's TTFT percentiles by policy.
  if (const auto trace = phases_of(r, kTrace); !trace.empty()) {
    BarChart c{.title = "Trace replay: TTFT by policy",
               .y_label = "milliseconds",
               .categories = {"p50", "p90", "p99"},
               .series = {},
               .values = {}};
    for (const PhaseRecord* p : trace) {
      const PolicyFigures f = summarize_phase(*p);
      c.series.push_back(p->policy);
      c.values.push_back({f.ttft.p50 * 1000, f.ttft.p90 * 1000, f.ttft.p99 * 1000});
    }
    if (auto st = write_file(out / "cluster_trace_ttft.svg", render_bar_chart(c)); !st) return st;
  }
  // New agentic sessions per worker.
  const auto agentic = phases_of(r, kAgentic);
  if (!agentic.empty()) {
    BarChart s{.title = "Agentic sessions: new sessions per worker",
               .y_label = "sessions",
               .categories = {},
               .series = {},
               .values = {}};
    for (size_t w = 0; w < agentic.front()->workers.size(); ++w) {
      s.categories.push_back("worker " + std::to_string(w + 1));
    }
    for (const PhaseRecord* p : agentic) {
      s.series.push_back(p->policy);
      std::vector<double> v;
      for (int64_t n : summarize_phase(*p).sessions_per_worker) v.push_back(static_cast<double>(n));
      v.resize(s.categories.size(), kNaN);
      s.values.push_back(std::move(v));
    }
    if (auto st = write_file(out / "cluster_sessions_per_worker.svg", render_bar_chart(s)); !st) {
      return st;
    }
  }
  return {};
}

}  // namespace strata::bench
