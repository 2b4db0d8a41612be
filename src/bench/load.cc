#include "bench/load.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <thread>

#include "bench/progress.h"
#include "bench/report.h"
#include "bench/stats.h"
#include "bench/svg_chart.h"
#include "bench/traffic.h"

namespace strata::bench {

namespace {

using json = nlohmann::ordered_json;

struct Level {
  int32_t concurrency = 0;
  int64_t requests = 0;
  double wall_s = 0;
  Summary ttft;
  Summary itl;
  Summary e2e;
  double tpot_mean_s = 0;  // mean over requests of (e2e - ttft) / (completion - 1)
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t completion_tokens = 0;
  double output_tokens_per_s() const { return wall_s > 0 ? completion_tokens / wall_s : 0; }
  double requests_per_s() const { return wall_s > 0 ? requests / wall_s : 0; }
  double hit_rate() const {
    return prompt_tokens > 0 ? static_cast<double>(cached_tokens) / prompt_tokens : 0;
  }
};

Level summarize_level(int32_t concurrency, double wall_s, const std::vector<RequestRecord>& recs) {
  Level l;
  l.concurrency = concurrency;
  l.wall_s = wall_s;
  l.requests = static_cast<int64_t>(recs.size());
  std::vector<double> ttft, itl, e2e, tpot;
  for (const RequestRecord& r : recs) {
    ttft.push_back(r.ttft_s);
    e2e.push_back(r.e2e_s);
    itl.insert(itl.end(), r.inter_chunk_s.begin(), r.inter_chunk_s.end());
    if (r.usage.completion_tokens > 1) {
      tpot.push_back((r.e2e_s - r.ttft_s) / static_cast<double>(r.usage.completion_tokens - 1));
    }
    l.prompt_tokens += r.usage.prompt_tokens;
    l.cached_tokens += r.usage.cached_tokens;
    l.completion_tokens += r.usage.completion_tokens;
  }
  l.ttft = summarize(ttft);
  l.itl = summarize(itl);
  l.e2e = summarize(e2e);
  l.tpot_mean_s = summarize(tpot).mean;
  return l;
}

json level_json(const Level& l) {
  return {{"concurrency", l.concurrency},
          {"requests", l.requests},
          {"wall_s", l.wall_s},
          {"ttft_s", to_json(l.ttft)},
          {"inter_token_latency_s", to_json(l.itl)},
          {"e2e_s", to_json(l.e2e)},
          {"tpot_mean_s", std::isfinite(l.tpot_mean_s) ? json(l.tpot_mean_s) : json(nullptr)},
          {"output_tokens_per_s", l.output_tokens_per_s()},
          {"requests_per_s", l.requests_per_s()},
          {"prompt_tokens", l.prompt_tokens},
          {"cached_tokens", l.cached_tokens},
          {"completion_tokens", l.completion_tokens},
          {"cache_hit_rate", l.hit_rate()}};
}

Table level_table(const std::vector<Level>& levels) {
  Table t;
  t.header = {"Concurrency", "Requests", "TTFT p50",     "TTFT p90", "TTFT p99", "ITL p50",
              "ITL p90",     "ITL p99",  "Output tok/s", "Req/s",    "Cache hit"};
  for (const Level& l : levels) {
    char tps[32], rps[32];
    std::snprintf(tps, sizeof(tps), "%.1f", l.output_tokens_per_s());
    std::snprintf(rps, sizeof(rps), "%.2f", l.requests_per_s());
    t.rows.push_back({std::to_string(l.concurrency), std::to_string(l.requests),
                      format_ms(l.ttft.p50), format_ms(l.ttft.p90), format_ms(l.ttft.p99),
                      format_ms(l.itl.p50), format_ms(l.itl.p90), format_ms(l.itl.p99), tps, rps,
                      format_percent(l.hit_rate())});
  }
  return t;
}

LineChart percentile_chart(const std::vector<Level>& levels, const std::string& title,
                           const Summary Level::*field) {
  LineChart c{.title = title, .x_label = "concurrent users", .y_label = "latency (ms)"};
  for (auto [name, pick] : {std::pair<const char*, double Summary::*>{"p50", &Summary::p50},
                            {"p90", &Summary::p90},
                            {"p99", &Summary::p99}}) {
    ChartSeries s{name, {}, {}};
    for (const Level& l : levels) {
      s.x.push_back(l.concurrency);
      s.y.push_back((l.*field).*pick * 1000);
    }
    c.series.push_back(std::move(s));
  }
  return c;
}

}  // namespace

void apply_quick(LoadOptions& o) {
  o.concurrency = {1, 2};
  o.requests_per_level = 8;
  o.max_tokens = 8;
  o.shape = ConversationShape{.system_min_tokens = 100,
                              .system_max_tokens = 200,
                              .user_min_tokens = 30,
                              .user_max_tokens = 80,
                              .assistant_min_tokens = 30,
                              .assistant_max_tokens = 80,
                              .min_turns = 3,
                              .max_turns = 6};
}

Status validate(const LoadOptions& o) {
  if (auto st = validate(o.target); !st) return st;
  if (o.run.out_dir.empty()) return make_error(ErrorCode::kInvalidArgument, "--out is required");
  if (o.concurrency.empty())
    return make_error(ErrorCode::kInvalidArgument, "--concurrency is empty");
  for (int32_t c : o.concurrency) {
    if (c < 1 || c > 1024) {
      return make_error(ErrorCode::kInvalidArgument,
                        "--concurrency values must be in [1, 1024], got " + std::to_string(c));
    }
  }
  if (o.requests_per_level < 1) {
    return make_error(ErrorCode::kInvalidArgument, "--requests-per-level must be >= 1");
  }
  if (o.max_tokens < 2) {
    return make_error(ErrorCode::kInvalidArgument,
                      "--max-tokens must be >= 2 (inter-token latency needs two tokens)");
  }
  return validate(o.shape);
}

int run_load(const LoadOptions& o) {
  auto fail = [](const std::string& message) {
    std::cerr << "strata bench load: " << message << "\n";
    return 2;
  };
  if (auto st = validate(o); !st) return fail(st.error().message);
  install_interrupt_handler();
  const std::filesystem::path out = o.run.out_dir;
  auto counter = make_token_counter(o.target);
  if (!counter) return fail(counter.error().message);
  auto server = open_server(o.target, {}, out / "logs" / "load.log", false);
  if (!server) return fail(server.error().message);
  const ServerClient client = server->client();
  auto model = served_model_id(client);
  if (!model) return fail(model.error().message);
  auto state = read_cache_state(client);
  if (!state) return fail(state.error().message);
  const json machine = machine_info();

  ProgressDisplay progress(stderr, stderr_is_terminal());
  std::vector<int32_t> levels_c = o.concurrency;
  std::vector<Level> levels;
  std::string error;
  const double total = static_cast<double>(levels_c.size() * o.requests_per_level);
  for (size_t i = 0; i < levels_c.size() && error.empty() && !interrupted(); ++i) {
    if (o.flush_between_levels) {
      if (auto r = client.post_json("/cache/flush", json::object()); !r) {
        error = r.error().message;
        break;
      }
    }
    // Fresh conversations per level: a level never reuses another's cache.
    ConversationSource source(o.run.seed, "load-" + std::to_string(levels_c[i]), o.shape, *counter);
    TrafficOptions to;
    to.concurrency = levels_c[i];
    to.max_tokens = o.max_tokens;
    to.stream = true;
    to.max_requests = o.requests_per_level;
    to.model = *model;
    TrafficRun traffic(client, source, to);
    const double start = monotonic_s();
    traffic.start();
    while (!traffic.stopping() || traffic.completed() + traffic.failed() < traffic.started()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const double done = static_cast<double>(i * o.requests_per_level + traffic.completed());
      progress.update(done / total, "load: concurrency " + std::to_string(levels_c[i]) + ", " +
                                        std::to_string(traffic.completed()) + "/" +
                                        std::to_string(o.requests_per_level) + " requests");
      if (interrupted()) traffic.request_stop();
    }
    traffic.join();
    const double wall = monotonic_s() - start;
    if (traffic.failed() > 0) {
      error = std::to_string(traffic.failed()) +
              " requests failed; the first: " + traffic.first_error();
      break;
    }
    levels.push_back(summarize_level(levels_c[i], wall, traffic.records()));
    progress.message(
        "concurrency " + std::to_string(levels_c[i]) + ": TTFT p50 " +
        format_ms(levels.back().ttft.p50) + ", ITL p50 " + format_ms(levels.back().itl.p50) + ", " +
        format_count(static_cast<int64_t>(levels.back().output_tokens_per_s())) + " output tok/s");
  }
  progress.finish();
  if (interrupted() && error.empty()) error = "interrupted";

  json jl = json::array();
  for (const Level& l : levels) jl.push_back(level_json(l));
  const json results{
      {"scenario", "load"},
      {"finished_at", utc_timestamp()},
      {"parameters",
       {{"concurrency", o.concurrency},
        {"requests_per_level", o.requests_per_level},
        {"max_tokens", o.max_tokens},
        {"flush_between_levels", o.flush_between_levels},
        {"shape",
         {{"system_tokens", {o.shape.system_min_tokens, o.shape.system_max_tokens}},
          {"user_tokens", {o.shape.user_min_tokens, o.shape.user_max_tokens}},
          {"assistant_tokens", {o.shape.assistant_min_tokens, o.shape.assistant_max_tokens}},
          {"turns", {o.shape.min_turns, o.shape.max_turns}}}},
        {"seed", o.run.seed},
        {"quick", o.run.quick},
        {"url", o.target.url},
        {"spawn", o.target.spawn},
        {"model_dir", o.target.model_dir},
        {"server_args", split_args(o.target.server_args)}}},
      {"machine", machine},
      {"model", *model},
      {"server", {{"url", server->url}, {"argv", server->argv()}, {"log", server->log_path}}},
      {"server_cache_state", state->raw},
      {"levels", jl},
      {"error", error.empty() ? json(nullptr) : json(error)},
      {"passed", error.empty()}};
  Status written = write_file(out / "results.json", results.dump(2) + "\n");
  if (written) {
    written = write_file(out / "load_ttft.svg",
                         render_line_chart(percentile_chart(
                             levels, "Load: time to first token vs concurrency", &Level::ttft)));
  }
  if (written) {
    written = write_file(out / "load_itl.svg",
                         render_line_chart(percentile_chart(
                             levels, "Load: inter-token latency vs concurrency", &Level::itl)));
  }
  if (written) {
    written = write_file(out / "summary.md",
                         "Model `" + *model + "`; machine " + machine_line(machine) + "; " +
                             std::to_string(o.max_tokens) + " output tokens per request.\n\n" +
                             to_markdown(level_table(levels)));
  }
  if (!written) return fail(written.error().message);
  std::cout << "\nload on " << *model << " (" << machine_line(machine) << ")\n"
            << to_text(level_table(levels)) << "results: " << (out / "results.json").string()
            << "\n";
  if (server->process) (void)server->process->stop();
  if (!error.empty()) return fail(error);
  return 0;
}

}  // namespace strata::bench
