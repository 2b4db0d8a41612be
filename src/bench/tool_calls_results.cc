#include "bench/tool_calls_results.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "bench/svg_chart.h"
#include "bench/target.h"

namespace strata::bench {

namespace {

using json = nlohmann::ordered_json;
using ojson = nlohmann::ordered_json;

// "0.23": ratios near the 0.3 and 1.0 targets need two decimals.
std::string format_fraction(double v) {
  if (!std::isfinite(v)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", v);
  return buf;
}

// "2.05x"
std::string format_cycles(double v) {
  if (!std::isfinite(v)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2fx", v);
  return buf;
}

ojson resumed_json(const ResumedTurn& r) {
  const PauseEvictions& e = r.evictions;
  return {{"agent", r.agent},
          {"call", r.call},
          {"with_tool_api", r.with_api},
          {"drawn_pause_s", r.drawn_pause_s},
          {"pause_s", r.pause_s},
          {"tool_start_s", r.tool_start_s},
          {"tool_end_s", r.tool_end_s},
          {"tool_start", r.tool_start},
          {"tool_end", r.tool_end},
          {"restore_failed", r.restore_failed},
          {"ttft_s", r.ttft_s},
          {"resume_s", r.ttft_s + r.tool_end_s},
          {"prompt_tokens", r.prompt_tokens},
          {"cached_tokens", r.cached_tokens},
          {"cached_tokens_details",
           {{"device", r.cached.device}, {"host", r.cached.host}, {"storage", r.cached.storage}}},
          {"pause_evictions",
           {{"evicted_pages", e.evicted_pages},
            {"demoted_pages", e.demoted_pages},
            {"host_evicted_pages", e.host_evicted_pages},
            {"target_pages", e.target_pages},
            {"cycled_after_s", e.cycled_after_s < 0 ? json(nullptr) : json(e.cycled_after_s)},
            {"target_reached", e.target_reached()}}}};
}

ojson arm_json(const ArmSummary& a) {
  return {{"arm", a.name},
          {"ttft_s", to_json(a.ttft)},
          {"resume_s", to_json(a.resume)},
          {"tool_end_s", to_json(a.tool_end)},
          {"cached_fraction", a.cached_fraction},
          {"host_cached_tokens_mean", a.host_cached_mean},
          {"failed_restores", a.failed_restores},
          {"device_pool_cycles_per_pause", to_json(a.pool_cycles)}};
}

json nan_as_null(double v) {
  return std::isfinite(v) ? json(v) : json(nullptr);
}

}  // namespace

int64_t pressure_target_pages(double cycles, int64_t device_pages) {
  if (!(cycles > 0) || device_pages <= 0) return 0;
  return static_cast<int64_t>(std::ceil(cycles * static_cast<double>(device_pages)));
}

double pool_cycles(int64_t pages, int64_t pool_pages) {
  return pool_pages > 0 ? static_cast<double>(pages) / static_cast<double>(pool_pages) : 0;
}

int64_t pressure_prompt_tokens(int64_t option_tokens, int64_t device_tokens) {
  return std::max<int64_t>(16, std::min(option_tokens, device_tokens / 4));
}

int64_t pressure_request_cap(double cycles, int64_t device_tokens, int64_t prompt_tokens,
                             int64_t pauses) {
  if (!(cycles > 0) || pauses <= 0) return 0;
  const double per_pause = std::ceil((cycles + 1) * static_cast<double>(device_tokens) /
                                     static_cast<double>(std::max<int64_t>(1, prompt_tokens)));
  return std::max<int64_t>(16, static_cast<int64_t>(4 * per_pause) * pauses);
}

ArmSummary summarize_arm(const std::vector<ResumedTurn>& turns, const PoolSize& pool,
                         bool with_api) {
  ArmSummary a;
  a.name = with_api ? "with tool_start/tool_end" : "without";
  std::vector<double> ttft, resume, tool_end, cycles;
  int64_t prompt = 0, cached = 0, host = 0, n = 0;
  for (const ResumedTurn& r : turns) {
    if (r.with_api != with_api) continue;
    ttft.push_back(r.ttft_s);
    resume.push_back(r.ttft_s + r.tool_end_s);
    tool_end.push_back(r.tool_end_s);
    cycles.push_back(pool_cycles(r.evictions.evicted_pages, pool.device_pages));
    prompt += r.prompt_tokens;
    cached += r.cached_tokens;
    host += r.cached.host;
    a.failed_restores += r.restore_failed ? 1 : 0;
    ++n;
  }
  a.ttft = summarize(ttft);
  a.resume = summarize(resume);
  a.tool_end = summarize(tool_end);
  a.pool_cycles = summarize(cycles);
  a.cached_fraction = prompt > 0 ? static_cast<double>(cached) / static_cast<double>(prompt) : 0;
  a.host_cached_mean = n > 0 ? static_cast<double>(host) / static_cast<double>(n) : 0;
  return a;
}

CycleSummary summarize_cycles(const std::vector<ResumedTurn>& turns, const PoolSize& pool) {
  CycleSummary c;
  std::vector<double> device, host;
  for (const ResumedTurn& r : turns) {
    const PauseEvictions& e = r.evictions;
    ++c.pauses;
    c.pauses_cycled += e.target_reached() ? 1 : 0;
    c.evicted_pages += e.evicted_pages;
    c.demoted_pages += e.demoted_pages;
    device.push_back(pool_cycles(e.evicted_pages, pool.device_pages));
    host.push_back(pool_cycles(e.host_evicted_pages, pool.host_pages));
  }
  c.device_cycles = summarize(device);
  c.host_cycles = summarize(host);
  return c;
}

double resume_ratio(const ArmSummary& with, const ArmSummary& without) {
  if (with.resume.count == 0 || without.resume.count == 0 || !(without.resume.p50 > 0)) {
    return kNaN;
  }
  return with.resume.p50 / without.resume.p50;
}

std::vector<Check> cycle_checks(const ToolCallsOptions& o, const ToolCallsRecord& r) {
  std::vector<Check> out;
  if (!(o.pressure_cycles > 0)) return out;
  const CycleSummary c = summarize_cycles(r.turns, r.pool);
  const int64_t target = pressure_target_pages(o.pressure_cycles, r.pool.device_pages);
  std::string detail = std::to_string(c.pauses_cycled);
  detail += " of ";
  detail += std::to_string(c.pauses);
  detail += " pauses evicted >= ";
  detail += format_count(target);
  detail += " pages (";
  detail += format_cycles(o.pressure_cycles);
  detail += " the ";
  detail += format_count(r.pool.device_pages);
  detail += "-page device pool); per pause min ";
  detail += format_cycles(c.device_cycles.min);
  detail += ", mean ";
  detail += format_cycles(c.device_cycles.mean);
  detail += "; ";
  detail += format_count(r.pressure.requests);
  detail += " pressure requests";
  out.push_back(Check{"device pool cycled during every pause",
                      c.pauses > 0 && c.pauses_cycled == c.pauses, detail});
  return out;
}

std::vector<Check> target_checks(const ToolCallsOptions& o, const ToolCallsRecord& r) {
  std::vector<Check> out;
  const ArmSummary without = summarize_arm(r.turns, r.pool, false);
  const ArmSummary with = summarize_arm(r.turns, r.pool, true);
  const double ratio = resume_ratio(with, without);
  const bool pressured = o.pressure_cycles > 0;
  const double max_ratio = pressured ? o.max_pressured_resume_ratio : o.max_resume_ratio;
  std::string detail = "tool_end + TTFT p50 ";
  detail += format_ms(with.resume.p50);
  detail += " with offloading / ";
  detail += format_ms(without.resume.p50);
  detail += " without = ";
  detail += format_fraction(ratio);
  detail += ", target <= ";
  detail += format_fraction(max_ratio);
  out.push_back(Check{pressured ? "resumed turn under pressure" : "resumed turn not slower",
                      std::isfinite(ratio) && ratio <= max_ratio, detail});
  if (!pressured) {
    std::string d = "with offloading ";
    d += format_ms(with.tool_end.p50);
    d += ", target <= ";
    d += format_ms(o.max_tool_end_p50_s);
    out.push_back(Check{"tool_end p50",
                        with.tool_end.count > 0 && with.tool_end.p50 <= o.max_tool_end_p50_s, d});
  }
  return out;
}

Table arms_table(const std::vector<ArmSummary>& arms) {
  Table t;
  t.header = {"Arm",
              "Resumed turns",
              "TTFT p50",
              "TTFT p90",
              "TTFT mean",
              "tool_end p50",
              "Resume p50",
              "Cached",
              "Host-cached (mean)",
              "Failed restores",
              "Pool cycles/pause (mean)"};
  for (const ArmSummary& a : arms) {
    t.rows.push_back({a.name, std::to_string(a.ttft.count), format_ms(a.ttft.p50),
                      format_ms(a.ttft.p90), format_ms(a.ttft.mean), format_ms(a.tool_end.p50),
                      format_ms(a.resume.p50), format_percent(a.cached_fraction),
                      format_count(static_cast<int64_t>(a.host_cached_mean)),
                      std::to_string(a.failed_restores), format_cycles(a.pool_cycles.mean)});
  }
  return t;
}

ojson tool_calls_results_json(const ToolCallsOptions& o, const ToolCallsRecord& r,
                              const std::vector<Check>& checks) {
  const ArmSummary without = summarize_arm(r.turns, r.pool, false);
  const ArmSummary with = summarize_arm(r.turns, r.pool, true);
  const CycleSummary c = summarize_cycles(r.turns, r.pool);
  ojson turns = ojson::array();
  for (const ResumedTurn& t : r.turns) turns.push_back(resumed_json(t));
  const PressureTotals& p = r.pressure;
  ojson pressure = nullptr;
  if (o.pressure_cycles > 0) {
    pressure = {
        {"cycles_per_pause_target", o.pressure_cycles},
        {"target_pages_per_pause", pressure_target_pages(o.pressure_cycles, r.pool.device_pages)},
        {"prompt_tokens_per_request", p.prompt_tokens_target},
        {"request_cap", p.request_cap},
        {"requests", p.requests},
        {"failed_requests", p.failed},
        {"prompt_tokens", p.prompt_tokens},
        {"cached_tokens", p.cached_tokens},
        {"first_error", p.first_error.empty() ? json(nullptr) : json(p.first_error)}};
  }
  return {{"scenario", "tool-calls"},
          {"finished_at", utc_timestamp()},
          {"parameters",
           {{"agents", o.agents},
            {"tool_calls", o.tool_calls},
            {"tool_pause_s", {o.pause_min_s, o.pause_max_s}},
            {"tool_pause_distribution", "uniform"},
            {"agent_max_tokens", o.agent_max_tokens},
            {"agent_system_tokens", o.agent_system_tokens},
            {"tool_result_tokens", {o.tool_result_min_tokens, o.tool_result_max_tokens}},
            {"background_concurrency", o.background_concurrency},
            {"background_max_tokens", o.background_max_tokens},
            {"pressure_cycles", o.pressure_cycles},
            {"pressure_concurrency", o.pressure_concurrency},
            {"pressure_prompt_tokens", o.pressure_prompt_tokens},
            {"pressure_timeout_s", o.pressure_timeout_s},
            {"seed", o.run.seed},
            {"quick", o.run.quick},
            {"check", o.run.check},
            {"url", o.target.url},
            {"spawn", o.target.spawn},
            {"model_dir", o.target.model_dir},
            {"server_args", split_args(o.target.server_args)}}},
          {"machine", r.machine},
          {"model", r.model},
          {"server", r.server},
          {"server_cache_state", r.first_state},
          {"pool",
           {{"page_size", r.pool.page_size},
            {"device_pages", r.pool.device_pages},
            {"host_pages", r.pool.host_pages}}},
          {"evicted_pages_during_run", r.evicted_pages_during_run},
          {"background_requests", r.background_requests},
          {"pressure", pressure},
          {"pool_cycles",
           {{"pauses", c.pauses},
            {"pauses_cycled", c.pauses_cycled},
            {"evicted_pages", c.evicted_pages},
            {"demoted_pages", c.demoted_pages},
            {"device_cycles_per_pause", to_json(c.device_cycles)},
            {"host_cycles_per_pause", to_json(c.host_cycles)}}},
          {"arms", {arm_json(without), arm_json(with)}},
          {"resume_p50_ratio_with_over_without", nan_as_null(resume_ratio(with, without))},
          {"resumed_turns", turns},
          {"checks", to_json(checks)},
          {"error", r.error.empty() ? json(nullptr) : json(r.error)},
          {"passed", r.error.empty() && all_passed(checks)}};
}

std::string tool_calls_summary_markdown(const ToolCallsOptions& o, const ToolCallsRecord& r,
                                        const std::vector<Check>& checks) {
  const ArmSummary without = summarize_arm(r.turns, r.pool, false);
  const ArmSummary with = summarize_arm(r.turns, r.pool, true);
  const CycleSummary c = summarize_cycles(r.turns, r.pool);
  std::string md = "Model `" + r.model + "`; machine " + machine_line(r.machine) + ".\n\n";
  md += to_markdown(arms_table({without, with})) + "\n";
  md += "- Resumed turn (tool_end + TTFT) p50: " + format_ms(with.resume.p50) +
        " with offloading, " + format_ms(without.resume.p50) + " without: ratio " +
        format_fraction(resume_ratio(with, without)) + "\n";
  md += "- Device pool " + format_count(r.pool.device_pages) + " pages of " +
        std::to_string(r.pool.page_size) + " tokens";
  if (r.pool.host_pages > 0) md += ", host pool " + format_count(r.pool.host_pages) + " pages";
  md += "; evicted per pause (" + format_count(c.evicted_pages) + " pages in all, " +
        format_count(c.demoted_pages) + " of them demoted to the host, over " +
        std::to_string(c.pauses) + " pauses): " + format_cycles(c.device_cycles.mean) +
        " the device pool on average, min " + format_cycles(c.device_cycles.min) + ", max " +
        format_cycles(c.device_cycles.max);
  if (r.pool.host_pages > 0) {
    md += "; host pool cycled " + format_cycles(c.host_cycles.mean) + " per pause on average";
  }
  md += "\n";
  if (o.pressure_cycles > 0) {
    const PressureTotals& p = r.pressure;
    md += "- Pressure: each pause lasted until " + format_cycles(o.pressure_cycles) +
          " the device pool had been evicted; " + format_count(p.requests) +
          " pressure requests of " + format_count(p.prompt_tokens_target) +
          " fresh prompt tokens (" +
          format_percent(p.prompt_tokens > 0 ? static_cast<double>(p.cached_tokens) /
                                                   static_cast<double>(p.prompt_tokens)
                                             : 0) +
          " of them cached), 1 generated token each\n";
  }
  md += "\nChecks:\n\n";
  for (const Check& ch : checks) {
    md +=
        std::string("- ") + (ch.passed ? "PASS " : "**FAIL** ") + ch.name + ": " + ch.detail + "\n";
  }
  return md;
}

Status write_tool_calls_outputs(const ToolCallsOptions& o, const ToolCallsRecord& r,
                                const std::vector<Check>& checks) {
  const std::filesystem::path out = o.run.out_dir;
  const ArmSummary without = summarize_arm(r.turns, r.pool, false);
  const ArmSummary with = summarize_arm(r.turns, r.pool, true);
  BarChart chart{.title = o.pressure_cycles > 0
                              ? "Tool calls under pressure: latency of the resumed turn"
                              : "Tool calls: latency of the resumed turn",
                 .y_label = "milliseconds",
                 .categories = {"TTFT p50", "TTFT p90", "TTFT mean", "tool_end + TTFT p50"},
                 .series = {without.name, with.name},
                 .values = {{without.ttft.p50 * 1000, without.ttft.p90 * 1000,
                             without.ttft.mean * 1000, without.resume.p50 * 1000},
                            {with.ttft.p50 * 1000, with.ttft.p90 * 1000, with.ttft.mean * 1000,
                             with.resume.p50 * 1000}}};
  if (auto st =
          write_file(out / "results.json", tool_calls_results_json(o, r, checks).dump(2) + "\n");
      !st) {
    return st;
  }
  if (auto st = write_file(out / "tool_calls_ttft.svg", render_bar_chart(chart)); !st) return st;
  return write_file(out / "summary.md", tool_calls_summary_markdown(o, r, checks));
}

}  // namespace strata::bench
