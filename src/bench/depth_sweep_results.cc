// The results of a depth sweep (depth_sweep.h), apart from running it: the record of each
// (phase, depth) run, the checks on them, the summary table, and the files written from
// them (results.json, the TTFT and cached-share charts, summary.md).
#include "bench/depth_sweep_results.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <utility>

#include "bench/stats.h"
#include "bench/svg_chart.h"

namespace strata::bench {

namespace {

using json = nlohmann::ordered_json;

std::string short_name(SweepPhase p) {
  switch (p) {
    case SweepPhase::kBaseline:
      return "BL";
    case SweepPhase::kPinned:
      return "PIN";
    case SweepPhase::kTierPinned:
      return "TIER";
  }
  return "?";
}

json run_json(const DepthRun& r) {
  json j{{"phase", phase_name(r.phase)}, {"depth", r.depth}, {"skipped", r.skipped}};
  if (r.skipped) {
    j["skip_reason"] = r.skip_reason;
    return j;
  }
  j["server"] = r.server;
  j["warmup"] = {{"prompt_tokens", r.warm_prompt_tokens},
                 {"completion_tokens", r.warm_completion_tokens},
                 {"ttft_s", r.warm_ttft_s},
                 {"e2e_s", r.warm_e2e_s},
                 {"blocks_captured", r.blocks_captured},
                 {"blocks_expected", r.blocks_expected},
                 {"blocks_pinned", r.blocks_pinned}};
  j["flood"] = {
      {"capacity_tokens", r.capacity_tokens},
      {"capacity_pages", r.capacity_pages},
      {"page_size", r.page_size},
      {"target_evicted_pages", r.target_evicted_pages},
      {"evicted_pages", r.evicted_pages},
      {"cycles",
       r.capacity_pages > 0 ? static_cast<double>(r.evicted_pages) / r.capacity_pages : kNaN},
      {"cycled", r.flood_cycled},
      {"requests", r.flood_requests},
      {"request_cap", r.flood_request_cap},
      {"prompt_tokens", r.flood_prompt_tokens},
      {"cached_tokens", r.flood_cached_tokens},
      {"seconds", r.flood_s},
      {"auto_unpinned_blocks", r.auto_unpinned_blocks},
      {"pinned_blocks_after", r.pinned_blocks_after_flood}};
  j["measure"] = {
      {"ttft_s", r.ttft_s},
      {"e2e_s", r.e2e_s},
      {"prompt_tokens", r.prompt_tokens},
      {"new_turn_tokens", r.new_tokens},
      {"reusable_tokens", r.reusable_tokens},
      {"cached_tokens", r.cached_tokens},
      {"cached_tokens_details",
       {{"device", r.cached.device}, {"host", r.cached.host}, {"storage", r.cached.storage}}},
      {"cached_fraction",
       std::isfinite(r.cached_fraction()) ? json(r.cached_fraction()) : json(nullptr)}};
  return j;
}

json shape_json(const ConversationShape& s) {
  return {{"system_tokens", {s.system_min_tokens, s.system_max_tokens}},
          {"user_tokens", {s.user_min_tokens, s.user_max_tokens}},
          {"assistant_tokens", {s.assistant_min_tokens, s.assistant_max_tokens}},
          {"turns", {s.min_turns, s.max_turns}}};
}

}  // namespace

bool pins_vip(SweepPhase p) {
  return p != SweepPhase::kBaseline;
}

std::vector<double> phase_ttfts(const SweepRecord& s, SweepPhase p) {
  std::vector<double> ttfts;
  for (const DepthRun& r : s.runs) {
    if (r.phase == p && !r.skipped) ttfts.push_back(r.ttft_s);
  }
  return ttfts;
}

std::vector<Check> sweep_checks(const DepthSweepOptions& o, const SweepRecord& s) {
  std::vector<Check> out;
  for (const DepthRun& r : s.runs) {
    if (r.skipped) continue;
    const std::string where =
        std::string(phase_name(r.phase)) + " depth " + std::to_string(r.depth);
    char detail[200];
    std::snprintf(detail, sizeof(detail),
                  "evicted %lld pages, %.2fx the %lld-page device pool "
                  "(needed %lld) in %lld flood requests",
                  static_cast<long long>(r.evicted_pages),
                  static_cast<double>(r.evicted_pages) / static_cast<double>(r.capacity_pages),
                  static_cast<long long>(r.capacity_pages),
                  static_cast<long long>(r.target_evicted_pages),
                  static_cast<long long>(r.flood_requests));
    out.push_back(Check{"flood cycled the cache (" + where + ")", r.flood_cycled, detail});
  }
  if (!o.run.check) return out;
  for (const DepthRun& r : s.runs) {
    if (r.skipped) continue;
    const std::string where =
        std::string(phase_name(r.phase)) + " depth " + std::to_string(r.depth);
    const double f = r.cached_fraction();
    const std::string measured = format_count(r.cached_tokens) + " of " +
                                 format_count(r.reusable_tokens) + " reusable tokens cached (" +
                                 format_percent(f) + ")";
    if (r.phase == SweepPhase::kBaseline && r.depth > 0) {
      out.push_back(Check{"baseline evicted (" + where + ")", f <= o.baseline_max_cached,
                          measured + ", target <= " + format_percent(o.baseline_max_cached)});
    }
    if (pins_vip(r.phase)) {
      out.push_back(Check{"pinned prefix kept (" + where + ")", f >= o.pinned_min_cached,
                          measured + ", target >= " + format_percent(o.pinned_min_cached)});
    }
  }
  return out;
}

Table sweep_summary_table(const SweepRecord& s) {
  std::map<std::pair<SweepPhase, int32_t>, const DepthRun*> at;
  std::vector<SweepPhase> shown;
  for (const DepthRun& r : s.runs) {
    if (r.skipped) continue;
    at[{r.phase, r.depth}] = &r;
    if (std::find(shown.begin(), shown.end(), r.phase) == shown.end()) shown.push_back(r.phase);
  }
  Table t;
  t.header = {"Depth", "Prompt tokens", "New-turn tokens"};
  for (SweepPhase p : shown) t.header.push_back(short_name(p) + " TTFT");
  const bool has_bl = std::find(shown.begin(), shown.end(), SweepPhase::kBaseline) != shown.end();
  for (SweepPhase p : shown) {
    if (p != SweepPhase::kBaseline && has_bl) t.header.push_back("Speedup " + short_name(p));
  }
  for (SweepPhase p : shown) t.header.push_back(short_name(p) + " cached");
  for (SweepPhase p : shown) {
    if (p == SweepPhase::kTierPinned) t.header.push_back("TIER host-cached");
  }
  for (SweepPhase p : shown) {
    if (pins_vip(p)) t.header.push_back(short_name(p) + " blocks pinned");
  }
  for (int32_t d : s.depths) {
    const DepthRun* any = nullptr;
    for (SweepPhase p : shown) {
      if (at.count({p, d})) {
        any = at.at({p, d});
        break;
      }
    }
    if (any == nullptr) continue;
    std::vector<std::string> row{std::to_string(d), format_count(any->prompt_tokens),
                                 format_count(any->new_tokens)};
    auto get = [&](SweepPhase p) { return at.count({p, d}) ? at.at({p, d}) : nullptr; };
    for (SweepPhase p : shown) row.push_back(get(p) ? format_ms(get(p)->ttft_s) : "-");
    for (SweepPhase p : shown) {
      if (p == SweepPhase::kBaseline || !has_bl) continue;
      const DepthRun* b = get(SweepPhase::kBaseline);
      const DepthRun* x = get(p);
      row.push_back(b && x ? format_ratio(b->ttft_s / x->ttft_s) : "-");
    }
    for (SweepPhase p : shown)
      row.push_back(get(p) ? format_percent(get(p)->cached_fraction()) : "-");
    for (SweepPhase p : shown) {
      if (p == SweepPhase::kTierPinned) {
        row.push_back(get(p) ? format_count(get(p)->cached.host) : "-");
      }
    }
    for (SweepPhase p : shown) {
      if (pins_vip(p)) row.push_back(get(p) ? format_count(get(p)->blocks_pinned) : "-");
    }
    t.rows.push_back(std::move(row));
  }
  return t;
}

json sweep_results_json(const DepthSweepOptions& o, const SweepRecord& s,
                        const std::vector<Check>& checks) {
  json runs = json::array();
  for (const DepthRun& r : s.runs) runs.push_back(run_json(r));
  json phase_stats = json::object();
  for (SweepPhase p : s.phases) {
    const std::vector<double> ttfts = phase_ttfts(s, p);
    if (ttfts.empty()) continue;
    const double ratio = max_over_min(ttfts);
    phase_stats[std::string(phase_name(p))] = {
        {"ttft_max_over_min", std::isfinite(ratio) ? json(ratio) : json(nullptr)}};
  }
  json speedups = json::array();
  for (const DepthRun& r : s.runs) {
    if (r.skipped || r.phase == SweepPhase::kBaseline) continue;
    for (const DepthRun& b : s.runs) {
      if (b.phase == SweepPhase::kBaseline && !b.skipped && b.depth == r.depth) {
        speedups.push_back({{"phase", phase_name(r.phase)},
                            {"depth", r.depth},
                            {"ttft_speedup_vs_baseline", b.ttft_s / r.ttft_s}});
      }
    }
  }
  json params = {{"depths", s.depths},
                 {"phases", o.phases},
                 {"flood_concurrency", o.flood_concurrency},
                 {"flood_factor", o.flood_factor},
                 {"flood_max_tokens", o.flood_max_tokens},
                 {"flood_request_cap_factor", o.flood_request_cap},
                 {"vip_system_tokens", o.vip_system_tokens},
                 {"measure_max_tokens", o.measure_max_tokens},
                 {"hicache_ratio", o.hicache_ratio},
                 {"vip_shape", shape_json(o.vip_shape)},
                 {"flood_shape", shape_json(o.flood_shape)},
                 {"seed", o.run.seed},
                 {"quick", o.run.quick},
                 {"check", o.run.check},
                 {"baseline_max_cached", o.baseline_max_cached},
                 {"pinned_min_cached", o.pinned_min_cached},
                 {"url", o.target.url},
                 {"spawn", o.target.spawn},
                 {"model_dir", o.target.model_dir},
                 {"server_args", split_args(o.target.server_args)}};
  json vip_turns = json::array();
  if (s.vip) {
    for (const Turn& t : s.vip->turns) {
      vip_turns.push_back(
          {{"user_tokens", t.user_tokens}, {"assistant_tokens", t.assistant_tokens}});
    }
  }
  return json{{"scenario", "depth-sweep"},
              {"finished_at", utc_timestamp()},
              {"parameters", params},
              {"machine", s.machine},
              {"model", s.model},
              {"server_cache_state", s.first_state},
              {"vip", {{"system_tokens", s.vip ? s.vip->system_tokens : 0}, {"turns", vip_turns}}},
              {"runs", runs},
              {"phase_stats", phase_stats},
              {"speedups", speedups},
              {"checks", to_json(checks)},
              {"error", s.error.empty() ? json(nullptr) : json(s.error)},
              {"passed", s.error.empty() && all_passed(checks)}};
}

Status write_sweep_outputs(const DepthSweepOptions& o, const SweepRecord& s,
                           const std::vector<Check>& checks) {
  const std::filesystem::path out(o.run.out_dir);
  if (auto st = write_file(out / "results.json", sweep_results_json(o, s, checks).dump(2) + "\n");
      !st) {
    return st;
  }
  LineChart ttft{.title = "Depth sweep: TTFT of turn D+1 after the flood",
                 .x_label = "conversation depth D (turns warmed)",
                 .y_label = "TTFT (ms)"};
  LineChart cached{.title = "Depth sweep: cached share of the reusable prompt",
                   .x_label = "conversation depth D (turns warmed)",
                   .y_label = "cached tokens / (prompt - new turn) (%)"};
  for (SweepPhase p : s.phases) {
    ChartSeries t{std::string(phase_name(p)), {}, {}};
    ChartSeries c{std::string(phase_name(p)), {}, {}};
    for (const DepthRun& r : s.runs) {
      if (r.phase != p || r.skipped) continue;
      t.x.push_back(r.depth);
      t.y.push_back(r.ttft_s * 1000);
      c.x.push_back(r.depth);
      c.y.push_back(r.cached_fraction() * 100);
    }
    if (t.x.empty()) continue;
    ttft.series.push_back(std::move(t));
    cached.series.push_back(std::move(c));
  }
  if (auto st = write_file(out / "depth_sweep_ttft.svg", render_line_chart(ttft)); !st) return st;
  if (auto st = write_file(out / "depth_sweep_cached.svg", render_line_chart(cached)); !st) {
    return st;
  }
  std::string md = "Model `" + s.model + "`; machine " + machine_line(s.machine) + ".\n\n";
  md += to_markdown(sweep_summary_table(s)) + "\n";
  for (SweepPhase p : s.phases) {
    const std::vector<double> ttfts = phase_ttfts(s, p);
    if (!ttfts.empty()) {
      md += "- " + std::string(phase_name(p)) + ": TTFT max/min across depths " +
            format_ratio(max_over_min(ttfts)) + "\n";
    }
  }
  for (const DepthRun& r : s.runs) {
    if (r.skipped) {
      md += "- " + std::string(phase_name(r.phase)) + " depth " + std::to_string(r.depth) +
            " skipped: " + r.skip_reason + "\n";
    }
  }
  md += "\nChecks:\n\n";
  for (const Check& c : checks) {
    md += std::string("- ") + (c.passed ? "PASS " : "**FAIL** ") + c.name + ": " + c.detail + "\n";
  }
  return write_file(out / "summary.md", md);
}

}  // namespace strata::bench
