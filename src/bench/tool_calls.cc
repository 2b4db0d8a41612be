#include "bench/tool_calls.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <iostream>
#include <mutex>
#include <thread>

#include "bench/progress.h"
#include "bench/report.h"
#include "bench/stats.h"
#include "bench/svg_chart.h"
#include "bench/traffic.h"

namespace strata::bench {

namespace {

using json = nlohmann::ordered_json;
using ojson = nlohmann::ordered_json;

// One resumed turn.
struct Resumed {
  int32_t agent = 0;
  int32_t call = 0;
  bool with_api = false;
  double pause_s = 0;
  double tool_start_s = 0;  // latency of POST /session/tool_start
  double tool_end_s = 0;    // latency of POST /session/tool_end
  json tool_start;          // the answers
  json tool_end;
  bool restore_failed = false;  // tool_end answered 503
  double ttft_s = 0;
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;
  CachedTiers cached;
};

// 404 on the session API: the server lacks it (the session exists: we just made it).
std::string missing_api_message(const std::string& path, const HttpResponse& r) {
  return "the server does not implement POST " + path + " (HTTP " + std::to_string(r.status) +
         ": " + error_message(r.body) +
         "); the tool-calls scenario needs the session API: /session/tool_start and "
         "/session/tool_end";
}

// The answer of a session call: JSON for 2xx; 404 means the server lacks the API (the
// session exists: the caller made it).
Result<json> session_answer(const std::string& path, const HttpResponse& r) {
  if (r.status == 404) return make_error(ErrorCode::kUnsupported, missing_api_message(path, r));
  if (r.status < 200 || r.status >= 300) {
    return make_error(ErrorCode::kFailedPrecondition, "POST " + path + " answered HTTP " +
                                                          std::to_string(r.status) + ": " +
                                                          error_message(r.body));
  }
  try {
    return json::parse(r.body);
  } catch (const json::exception& e) {
    return make_error(ErrorCode::kCorrupt, "POST " + path + ": invalid JSON: " + e.what());
  }
}

Result<json> session_call(const ServerClient& client, const std::string& path, const json& body) {
  auto r = client.post(path, body);
  if (!r) return std::unexpected(r.error());
  return session_answer(path, *r);
}

class ToolCalls {
 public:
  ToolCalls(const ToolCallsOptions& o, const ServerClient& client, std::string model)
      : o_(o), client_(client), model_(std::move(model)) {}

  Status preflight();
  // Runs agent `index` to its end; records into results_.
  void agent(int32_t index, const Conversation& c);
  std::vector<Resumed> results() const {
    std::lock_guard lock(mutex_);
    return results_;
  }
  std::string error() const {
    std::lock_guard lock(mutex_);
    return error_;
  }
  int64_t done() const { return done_.load(); }

 private:
  void fail(const std::string& message) {
    std::lock_guard lock(mutex_);
    if (error_.empty()) error_ = message;
  }
  bool sleep_for(double seconds) const;

  const ToolCallsOptions& o_;
  const ServerClient client_;
  const std::string model_;
  std::atomic<int64_t> done_{0};
  mutable std::mutex mutex_;
  std::vector<Resumed> results_;  // GUARDED_BY(mutex_)
  std::string error_;             // GUARDED_BY(mutex_)
};

Status ToolCalls::preflight() {
  const std::string session = "strata-bench-probe-" + std::to_string(o_.run.seed);
  ojson body = chat_request(
      model_, ojson::array({ojson{{"role", "user"}, {"content", "Say something short."}}}), 2,
      false);
  body["session_id"] = session;
  if (auto r = client_.chat(body); !r) return std::unexpected(r.error());
  auto started = session_call(client_, "/session/tool_start", json{{"session_id", session}});
  if (!started) return std::unexpected(started.error());
  auto ended = session_call(client_, "/session/tool_end",
                            json{{"session_id", session}, {"epoch", started->value("epoch", 0)}});
  if (!ended) return std::unexpected(ended.error());
  return {};
}

bool ToolCalls::sleep_for(double seconds) const {
  const double end = monotonic_s() + seconds;
  while (monotonic_s() < end) {
    if (interrupted() || !error().empty()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(
        static_cast<int64_t>(std::min(50.0, (end - monotonic_s()) * 1000) + 1)));
  }
  return true;
}

void ToolCalls::agent(int32_t index, const Conversation& c) {
  const bool with_api = index % 2 == 0;
  const std::string session =
      "strata-bench-agent-" + std::to_string(o_.run.seed) + "-" + std::to_string(index);
  BenchRng pauses(derive_seed(o_.run.seed, "tool-pause", static_cast<uint64_t>(index)));
  ojson messages = ojson::array();
  messages.push_back(ojson{{"role", "system"}, {"content", c.system}});
  messages.push_back(ojson{{"role", "user"}, {"content", c.turns[0].user}});
  auto send = [&]() -> Result<StreamedChat> {
    ojson body = chat_request(model_, messages, o_.agent_max_tokens, true);
    body["session_id"] = session;
    return client_.stream_chat(body);
  };
  auto reply = send();
  if (!reply) return fail(reply.error().message);
  for (int32_t call = 0; call < o_.tool_calls; ++call) {
    Resumed r;
    r.agent = index;
    r.call = call;
    r.with_api = with_api;
    r.pause_s = pauses.uniform(o_.pause_min_s, o_.pause_max_s);
    int64_t epoch = 0;
    if (with_api) {
      const double t0 = monotonic_s();
      auto s = session_call(client_, "/session/tool_start", json{{"session_id", session}});
      if (!s) return fail(s.error().message);
      r.tool_start_s = monotonic_s() - t0;
      r.tool_start = *s;
      epoch = s->value("epoch", int64_t{0});
    }
    if (!sleep_for(r.pause_s)) return;
    if (with_api) {
      const double t0 = monotonic_s();
      auto e = client_.post("/session/tool_end", json{{"session_id", session}, {"epoch", epoch}});
      if (!e) return fail(e.error().message);
      r.tool_end_s = monotonic_s() - t0;
      if (e->status == 503) {
        // The server could not bring the KV back now (no room on the device) and says so;
        // an agent then goes on with its next turn, as the answer advises.
        r.restore_failed = true;
        r.tool_end = json{{"status", e->status}, {"error", error_message(e->body)}};
      } else {
        auto answer = session_answer("/session/tool_end", *e);
        if (!answer) return fail(answer.error().message);
        r.tool_end = *answer;
      }
    }
    messages.push_back(ojson{{"role", "assistant"}, {"content", reply->text}});
    messages.push_back(
        ojson{{"role", "tool"}, {"content", c.turns[static_cast<size_t>(call) + 1].user}});
    reply = send();
    if (!reply) return fail(reply.error().message);
    r.ttft_s = reply->ttft_s;
    r.prompt_tokens = reply->usage.prompt_tokens;
    r.cached_tokens = reply->usage.cached_tokens;
    r.cached = reply->usage.cached;
    {
      std::lock_guard lock(mutex_);
      results_.push_back(std::move(r));
    }
    done_.fetch_add(1);
  }
}

json resumed_json(const Resumed& r) {
  return {{"agent", r.agent},
          {"call", r.call},
          {"with_tool_api", r.with_api},
          {"pause_s", r.pause_s},
          {"tool_start_s", r.tool_start_s},
          {"tool_end_s", r.tool_end_s},
          {"tool_start", r.tool_start},
          {"tool_end", r.tool_end},
          {"restore_failed", r.restore_failed},
          {"ttft_s", r.ttft_s},
          {"prompt_tokens", r.prompt_tokens},
          {"cached_tokens", r.cached_tokens},
          {"cached_tokens_details",
           {{"device", r.cached.device}, {"host", r.cached.host}, {"storage", r.cached.storage}}}};
}

struct Arm {
  std::string name;
  Summary ttft;
  Summary resume;  // tool_end + TTFT
  Summary tool_end;
  double cached_fraction = 0;
  double host_cached_mean = 0;
  int64_t failed_restores = 0;
};

Arm summarize_arm(const std::vector<Resumed>& all, bool with_api) {
  Arm a;
  a.name = with_api ? "with tool_start/tool_end" : "without";
  std::vector<double> ttft, resume, tool_end;
  int64_t prompt = 0, cached = 0, host = 0, n = 0;
  for (const Resumed& r : all) {
    if (r.with_api != with_api) continue;
    ttft.push_back(r.ttft_s);
    resume.push_back(r.ttft_s + r.tool_end_s);
    tool_end.push_back(r.tool_end_s);
    prompt += r.prompt_tokens;
    cached += r.cached_tokens;
    host += r.cached.host;
    a.failed_restores += r.restore_failed ? 1 : 0;
    ++n;
  }
  a.ttft = summarize(ttft);
  a.resume = summarize(resume);
  a.tool_end = summarize(tool_end);
  a.cached_fraction = prompt > 0 ? static_cast<double>(cached) / prompt : 0;
  a.host_cached_mean = n > 0 ? static_cast<double>(host) / n : 0;
  return a;
}

json arm_json(const Arm& a) {
  return {{"arm", a.name},
          {"ttft_s", to_json(a.ttft)},
          {"resume_s", to_json(a.resume)},
          {"tool_end_s", to_json(a.tool_end)},
          {"cached_fraction", a.cached_fraction},
          {"host_cached_tokens_mean", a.host_cached_mean},
          {"failed_restores", a.failed_restores}};
}

}  // namespace

void apply_quick(ToolCallsOptions& o) {
  o.agents = 2;
  o.tool_calls = 2;
  o.pause_min_s = 0.2;
  o.pause_max_s = 0.5;
  o.agent_max_tokens = 8;
  o.agent_system_tokens = 500;
  o.tool_result_min_tokens = 30;
  o.tool_result_max_tokens = 80;
  o.background_concurrency = 1;
  o.background_max_tokens = 4;
  o.background_shape = ConversationShape{.system_min_tokens = 100,
                                         .system_max_tokens = 200,
                                         .user_min_tokens = 30,
                                         .user_max_tokens = 80,
                                         .assistant_min_tokens = 30,
                                         .assistant_max_tokens = 80,
                                         .min_turns = 3,
                                         .max_turns = 6};
}

Status validate(const ToolCallsOptions& o) {
  if (auto st = validate(o.target); !st) return st;
  if (o.run.out_dir.empty()) return make_error(ErrorCode::kInvalidArgument, "--out is required");
  if (o.agents < 2) {
    return make_error(ErrorCode::kInvalidArgument,
                      "--agents must be >= 2 (one arm with the session API, one without)");
  }
  if (o.tool_calls < 1) return make_error(ErrorCode::kInvalidArgument, "--tool-calls must be >= 1");
  if (o.pause_min_s < 0 || o.pause_max_s < o.pause_min_s) {
    return make_error(ErrorCode::kInvalidArgument, "--tool-pause-s needs 0 <= MIN <= MAX");
  }
  if (o.agent_max_tokens < 1 || o.background_max_tokens < 1) {
    return make_error(ErrorCode::kInvalidArgument, "max tokens must be >= 1");
  }
  if (o.agent_system_tokens < 16) {
    return make_error(ErrorCode::kInvalidArgument, "--agent-system-tokens must be >= 16");
  }
  if (o.tool_result_min_tokens < 1 || o.tool_result_max_tokens < o.tool_result_min_tokens) {
    return make_error(ErrorCode::kInvalidArgument, "tool result tokens need 1 <= MIN <= MAX");
  }
  if (o.background_concurrency < 0) {
    return make_error(ErrorCode::kInvalidArgument, "--background-concurrency must be >= 0");
  }
  return validate(o.background_shape);
}

int run_tool_calls(const ToolCallsOptions& o) {
  auto fail = [](const std::string& message) {
    std::cerr << "strata bench tool-calls: " << message << "\n";
    return 2;
  };
  if (auto st = validate(o); !st) return fail(st.error().message);
  install_interrupt_handler();
  const std::filesystem::path out = o.run.out_dir;
  auto counter = make_token_counter(o.target);
  if (!counter) return fail(counter.error().message);
  auto server = open_server(o.target, {}, out / "logs" / "tool-calls.log", false);
  if (!server) return fail(server.error().message);
  const ServerClient client = server->client();
  auto model = served_model_id(client);
  if (!model) return fail(model.error().message);
  auto state0 = read_cache_state(client);
  if (!state0) return fail(state0.error().message);

  ToolCalls scenario(o, client, *model);
  if (auto st = scenario.preflight(); !st) return fail(st.error().message);

  // The agents' conversations: a system prompt, the task, then one tool answer per call.
  const ConversationShape agent_shape{.system_min_tokens = o.agent_system_tokens,
                                      .system_max_tokens = o.agent_system_tokens,
                                      .user_min_tokens = o.tool_result_min_tokens,
                                      .user_max_tokens = o.tool_result_max_tokens,
                                      .assistant_min_tokens = 1,
                                      .assistant_max_tokens = 1,
                                      .min_turns = o.tool_calls + 1,
                                      .max_turns = o.tool_calls + 1};
  std::vector<Conversation> convs;
  for (int32_t i = 0; i < o.agents; ++i) {
    auto c =
        make_conversation(o.run.seed, "agent", static_cast<uint64_t>(i), agent_shape, *counter);
    if (!c) return fail(c.error().message);
    convs.push_back(std::move(*c));
  }
  ConversationSource background_source(o.run.seed, "background", o.background_shape, *counter);
  TrafficOptions to;
  to.concurrency = o.background_concurrency;
  to.max_tokens = o.background_max_tokens;
  to.model = *model;
  std::unique_ptr<TrafficRun> background;
  if (o.background_concurrency > 0) {
    background = std::make_unique<TrafficRun>(client, background_source, to);
    background->start();
  }
  ProgressDisplay progress(stderr, stderr_is_terminal());
  std::vector<std::thread> agents;
  for (int32_t i = 0; i < o.agents; ++i) {
    agents.emplace_back(
        [&scenario, &convs, i] { scenario.agent(i, convs[static_cast<size_t>(i)]); });
  }
  const double total = static_cast<double>(o.agents) * o.tool_calls;
  while (scenario.done() < static_cast<int64_t>(total) && scenario.error().empty() &&
         !interrupted()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    progress.update(
        static_cast<double>(scenario.done()) / total,
        "tool-calls: " + std::to_string(scenario.done()) + "/" +
            std::to_string(static_cast<int64_t>(total)) + " resumed turns" +
            (background ? ", background " + std::to_string(background->completed()) + " requests"
                        : ""));
  }
  for (std::thread& t : agents) t.join();
  if (background) {
    background->request_stop();
    background->join();
  }
  progress.finish();
  std::string error = scenario.error();
  if (error.empty() && background && background->failed() > 0) {
    error = "background traffic failed: " + background->first_error();
  }
  if (interrupted() && error.empty()) error = "interrupted";
  auto state1 = read_cache_state(client);

  const std::vector<Resumed> all = scenario.results();
  const Arm without = summarize_arm(all, false);
  const Arm with = summarize_arm(all, true);
  json turns = json::array();
  for (const Resumed& r : all) turns.push_back(resumed_json(r));
  const json results{
      {"scenario", "tool-calls"},
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
        {"seed", o.run.seed},
        {"quick", o.run.quick},
        {"url", o.target.url},
        {"spawn", o.target.spawn},
        {"model_dir", o.target.model_dir},
        {"server_args", split_args(o.target.server_args)}}},
      {"machine", machine_info()},
      {"model", *model},
      {"server", {{"url", server->url}, {"argv", server->argv()}, {"log", server->log_path}}},
      {"server_cache_state", state0->raw},
      {"evicted_pages_during_run",
       state1 ? state1->evicted_pages_total - state0->evicted_pages_total : -1},
      {"background_requests", background ? background->completed() : 0},
      {"arms", {arm_json(without), arm_json(with)}},
      {"resumed_turns", turns},
      {"error", error.empty() ? json(nullptr) : json(error)},
      {"passed", error.empty()}};
  Table t;
  t.header = {"Arm",          "Resumed turns", "TTFT p50", "TTFT p90",           "TTFT mean",
              "tool_end p50", "Resume p50",    "Cached",   "Host-cached (mean)", "Failed restores"};
  for (const Arm& a : {without, with}) {
    t.rows.push_back({a.name, std::to_string(a.ttft.count), format_ms(a.ttft.p50),
                      format_ms(a.ttft.p90), format_ms(a.ttft.mean), format_ms(a.tool_end.p50),
                      format_ms(a.resume.p50), format_percent(a.cached_fraction),
                      format_count(static_cast<int64_t>(a.host_cached_mean)),
                      std::to_string(a.failed_restores)});
  }
  BarChart chart{.title = "Tool calls: latency of the resumed turn",
                 .y_label = "milliseconds",
                 .categories = {"TTFT p50", "TTFT p90", "TTFT mean", "tool_end + TTFT p50"},
                 .series = {without.name, with.name},
                 .values = {{without.ttft.p50 * 1000, without.ttft.p90 * 1000,
                             without.ttft.mean * 1000, without.resume.p50 * 1000},
                            {with.ttft.p50 * 1000, with.ttft.p90 * 1000, with.ttft.mean * 1000,
                             with.resume.p50 * 1000}}};
  Status written = write_file(out / "results.json", results.dump(2) + "\n");
  if (written) written = write_file(out / "tool_calls_ttft.svg", render_bar_chart(chart));
  if (written) {
    written =
        write_file(out / "summary.md", "Model `" + *model + "`; machine " +
                                           machine_line(machine_info()) + ".\n\n" + to_markdown(t));
  }
  if (!written) return fail(written.error().message);
  std::cout << "\ntool-calls on " << *model << "\n"
            << to_text(t) << "results: " << (out / "results.json").string() << "\n";
  if (server->process) (void)server->process->stop();
  if (!error.empty()) return fail(error);
  return 0;
}

}  // namespace strata::bench
