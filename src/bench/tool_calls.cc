#include "bench/tool_calls.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <iostream>
#include <mutex>
#include <thread>
#include <utility>

#include "bench/progress.h"
#include "bench/report.h"
#include "bench/stats.h"
#include "bench/tool_calls_results.h"
#include "bench/traffic.h"

namespace strata::bench {

namespace {

using json = nlohmann::ordered_json;
using ojson = nlohmann::ordered_json;

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

// The eviction counters of GET /cache/state.
struct EvictionCounters {
  int64_t evicted_pages = 0;  // device pages freed or demoted
  int64_t demoted_pages = 0;  // device pages demoted to the host
  int64_t host_evicted_pages = 0;
};

Result<EvictionCounters> read_evictions(const ServerClient& client) {
  auto s = read_cache_state(client);
  if (!s) return std::unexpected(s.error());
  EvictionCounters c;
  c.evicted_pages = s->evicted_pages_total;
  if (auto e = s->raw.find("evictions"); e != s->raw.end() && e->is_object()) {
    c.demoted_pages = e->value("demoted_pages_total", int64_t{0});
    c.host_evicted_pages = e->value("host_evicted_pages_total", int64_t{0});
  }
  return c;
}

// The pressured variant's traffic: requests with fresh prompts (conversation i of the
// "pressure" stream is a one-turn conversation whose system prompt starts the prompt, so no
// two share a page) and one generated token, sent only while at least one pause asks for
// them (demand > 0), at most `request_cap` in all.
//
// Threads: start() runs `concurrency` workers; add_demand() and totals() from any thread;
// stop() from the owner (requests in flight run to their end).
class PoolPressure {
 public:
  static constexpr int64_t kMaxErrors = 5;  // failed requests before the pressure gives up

  PoolPressure(ServerClient client, ConversationSource& source, std::string model,
               int32_t concurrency, int64_t request_cap)
      : client_(std::move(client)),
        source_(source),
        model_(std::move(model)),
        concurrency_(concurrency),
        request_cap_(request_cap) {}
  ~PoolPressure() { stop(); }
  PoolPressure(const PoolPressure&) = delete;
  PoolPressure& operator=(const PoolPressure&) = delete;

  void start() {
    for (int32_t i = 0; i < concurrency_; ++i) workers_.emplace_back([this] { worker(); });
  }
  void stop() {
    stop_.store(true);
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }
  void add_demand(int32_t delta) { demand_.fetch_add(delta); }
  // True once kMaxErrors requests failed (the workers have stopped sending).
  bool broken() const { return failed_.load() >= kMaxErrors; }
  int64_t completed() const { return completed_.load(); }
  PressureTotals totals() const {
    std::lock_guard lock(mutex_);
    PressureTotals t = totals_;
    t.request_cap = request_cap_;
    t.requests = completed_.load();
    t.failed = failed_.load();
    return t;
  }

 private:
  void worker();
  void record_failure(const std::string& message) {
    failed_.fetch_add(1);
    std::lock_guard lock(mutex_);
    if (totals_.first_error.empty()) totals_.first_error = message;
  }

  const ServerClient client_;
  ConversationSource& source_;
  const std::string model_;
  const int32_t concurrency_;
  const int64_t request_cap_;
  std::atomic<int32_t> demand_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> next_{0};
  std::atomic<int64_t> completed_{0};
  std::atomic<int64_t> failed_{0};
  std::vector<std::thread> workers_;
  mutable std::mutex mutex_;
  PressureTotals totals_;  // GUARDED_BY(mutex_): prompt and cached tokens, first error
};

void PoolPressure::worker() {
  while (!stop_.load() && !broken()) {
    if (demand_.load() <= 0 || interrupted() || next_.load() >= request_cap_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    const int64_t index = next_.fetch_add(1);
    if (index >= request_cap_) continue;
    auto c = source_.get(static_cast<uint64_t>(index));
    if (!c) {
      record_failure(c.error().message);
      continue;
    }
    auto reply = client_.chat(chat_request(model_, chat_messages(**c, 0, true), 1, false));
    if (!reply) {
      record_failure(reply.error().message);
      continue;
    }
    {
      std::lock_guard lock(mutex_);
      totals_.prompt_tokens += reply->first.prompt_tokens;
      totals_.cached_tokens += reply->first.cached_tokens;
    }
    completed_.fetch_add(1);
  }
}

// Holds one unit of the pressure's demand for its lifetime.
class PressureDemand {
 public:
  explicit PressureDemand(PoolPressure& p) : p_(p) { p_.add_demand(1); }
  ~PressureDemand() { p_.add_demand(-1); }
  PressureDemand(const PressureDemand&) = delete;
  PressureDemand& operator=(const PressureDemand&) = delete;

 private:
  PoolPressure& p_;
};

class ToolCalls {
 public:
  // `pressure` is null without the pressured variant; it outlives this object.
  ToolCalls(const ToolCallsOptions& o, const ServerClient& client, std::string model, PoolSize pool,
            PoolPressure* pressure)
      : o_(o), client_(client), model_(std::move(model)), pool_(pool), pressure_(pressure) {}

  Status preflight();
  // Runs agent `index` to its end; records into turns_.
  void agent(int32_t index, const Conversation& c);
  std::vector<ResumedTurn> turns() const {
    std::lock_guard lock(mutex_);
    return turns_;
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
  // The pause between tool_start and tool_end (or the same wait without them): at least
  // r.drawn_pause_s and, under pressure, until the device pool was cycled (at most
  // pressure_timeout_s). Fills r.pause_s and r.evictions; false on an error or interrupt.
  bool pause(ResumedTurn& r);

  const ToolCallsOptions& o_;
  const ServerClient client_;
  const std::string model_;
  const PoolSize pool_;
  PoolPressure* const pressure_;
  std::atomic<int64_t> done_{0};
  mutable std::mutex mutex_;
  std::vector<ResumedTurn> turns_;  // GUARDED_BY(mutex_)
  std::string error_;               // GUARDED_BY(mutex_)
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

bool ToolCalls::pause(ResumedTurn& r) {
  const double start = monotonic_s();
  auto before = read_evictions(client_);
  if (!before) {
    fail(before.error().message);
    return false;
  }
  PauseEvictions& e = r.evictions;
  e.target_pages = pressure_ ? pressure_target_pages(o_.pressure_cycles, pool_.device_pages) : 0;
  if (e.target_pages > 0) {
    PressureDemand demand(*pressure_);
    while (monotonic_s() - start < o_.pressure_timeout_s) {
      if (interrupted() || !error().empty()) return false;
      if (pressure_->broken()) {
        fail("pressure requests failed: " + pressure_->totals().first_error);
        return false;
      }
      auto now = read_evictions(client_);
      if (!now) {
        fail(now.error().message);
        return false;
      }
      if (now->evicted_pages - before->evicted_pages >= e.target_pages) {
        e.cycled_after_s = monotonic_s() - start;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  if (!sleep_for(r.drawn_pause_s - (monotonic_s() - start))) return false;
  auto after = read_evictions(client_);
  if (!after) {
    fail(after.error().message);
    return false;
  }
  e.evicted_pages = after->evicted_pages - before->evicted_pages;
  e.demoted_pages = after->demoted_pages - before->demoted_pages;
  e.host_evicted_pages = after->host_evicted_pages - before->host_evicted_pages;
  r.pause_s = monotonic_s() - start;
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
    ResumedTurn r;
    r.agent = index;
    r.call = call;
    r.with_api = with_api;
    r.drawn_pause_s = pauses.uniform(o_.pause_min_s, o_.pause_max_s);
    int64_t epoch = 0;
    if (with_api) {
      const double t0 = monotonic_s();
      auto s = session_call(client_, "/session/tool_start", json{{"session_id", session}});
      if (!s) return fail(s.error().message);
      r.tool_start_s = monotonic_s() - t0;
      r.tool_start = *s;
      epoch = s->value("epoch", int64_t{0});
    }
    if (!pause(r)) return;
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
      turns_.push_back(std::move(r));
    }
    done_.fetch_add(1);
  }
}

// The pool sizes of a /cache/state answer.
PoolSize pool_size(const CacheState& s) {
  PoolSize p;
  p.page_size = s.page_size;
  p.device_pages = s.capacity_pages;
  if (s.has_host) {
    p.host_pages = s.raw.at("host").value("capacity_pages", int64_t{0});
    if (p.host_pages <= 0) p.host_pages = s.host_capacity_tokens / s.page_size;
  }
  return p;
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
  o.pressure_prompt_tokens = 256;
  o.pressure_timeout_s = 60;
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
  if (!(o.pressure_cycles >= 0) || o.pressure_cycles > 1000) {
    return make_error(ErrorCode::kInvalidArgument, "--pressure-cycles must be in [0, 1000]");
  }
  if (o.pressure_concurrency < 1) {
    return make_error(ErrorCode::kInvalidArgument, "--pressure-concurrency must be >= 1");
  }
  if (o.pressure_prompt_tokens < 16) {
    return make_error(ErrorCode::kInvalidArgument, "--pressure-prompt-tokens must be >= 16");
  }
  if (!(o.pressure_timeout_s > 0)) {
    return make_error(ErrorCode::kInvalidArgument, "--pressure-timeout-s must be > 0");
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

  ToolCallsRecord record;
  record.model = *model;
  record.machine = machine_info();
  record.server = {{"url", server->url}, {"argv", server->argv()}, {"log", server->log_path}};
  record.first_state = state0->raw;
  record.pool = pool_size(*state0);

  // The pressure: fresh one-turn conversations whose system prompt is the whole prompt.
  const bool pressured = o.pressure_cycles > 0;
  const int64_t pressure_tokens =
      pressure_prompt_tokens(o.pressure_prompt_tokens, state0->capacity_tokens);
  const ConversationShape pressure_shape{.system_min_tokens = pressure_tokens,
                                         .system_max_tokens = pressure_tokens,
                                         .user_min_tokens = 4,
                                         .user_max_tokens = 8,
                                         .assistant_min_tokens = 1,
                                         .assistant_max_tokens = 1,
                                         .min_turns = 1,
                                         .max_turns = 1};
  ConversationSource pressure_source(o.run.seed, "pressure", pressure_shape, *counter);
  std::unique_ptr<PoolPressure> pressure;
  if (pressured) {
    pressure = std::make_unique<PoolPressure>(
        client, pressure_source, *model, o.pressure_concurrency,
        pressure_request_cap(o.pressure_cycles, state0->capacity_tokens, pressure_tokens,
                             static_cast<int64_t>(o.agents) * o.tool_calls));
  }

  ToolCalls scenario(o, client, *model, record.pool, pressure.get());
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
  if (pressure) pressure->start();
  ProgressDisplay progress(stderr, stderr_is_terminal());
  std::vector<std::thread> agents;
  for (int32_t i = 0; i < o.agents; ++i) {
    agents.emplace_back(
        [&scenario, &convs, i] { scenario.agent(i, convs[static_cast<size_t>(i)]); });
  }
  const int64_t total = static_cast<int64_t>(o.agents) * o.tool_calls;
  while (scenario.done() < total && scenario.error().empty() && !interrupted()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::string status = "tool-calls: ";
    status += std::to_string(scenario.done());
    status += "/";
    status += std::to_string(total);
    status += " resumed turns";
    if (background) {
      status += ", background ";
      status += std::to_string(background->completed());
      status += " requests";
    }
    if (pressure) {
      status += ", pressure ";
      status += std::to_string(pressure->completed());
      status += " requests";
    }
    progress.update(static_cast<double>(scenario.done()) / static_cast<double>(total), status);
  }
  for (std::thread& t : agents) t.join();
  if (pressure) pressure->stop();
  if (background) {
    background->request_stop();
    background->join();
  }
  progress.finish();
  std::string error = scenario.error();
  if (error.empty() && background && background->failed() > 0) {
    error = "background traffic failed: " + background->first_error();
  }
  if (pressure) {
    record.pressure = pressure->totals();
    if (error.empty() && record.pressure.failed > 0) {
      error = "pressure requests failed: " + record.pressure.first_error;
    }
  }
  record.pressure.prompt_tokens_target = pressure_tokens;
  if (interrupted() && error.empty()) error = "interrupted";
  if (auto state1 = read_cache_state(client)) {
    record.evicted_pages_during_run = state1->evicted_pages_total - state0->evicted_pages_total;
  }
  record.background_requests = background ? background->completed() : 0;
  record.turns = scenario.turns();
  record.error = error;

  const std::vector<Check> cycled = cycle_checks(o, record);
  const std::vector<Check> targets = target_checks(o, record);
  std::vector<Check> checks = cycled;
  checks.insert(checks.end(), targets.begin(), targets.end());
  if (auto st = write_tool_calls_outputs(o, record, checks); !st) return fail(st.error().message);
  const ArmSummary without = summarize_arm(record.turns, record.pool, false);
  const ArmSummary with = summarize_arm(record.turns, record.pool, true);
  std::cout << "\ntool-calls on " << *model << (pressured ? " under pressure" : "") << "\n"
            << to_text(arms_table({without, with})) << "\n"
            << format_checks(checks) << "results: " << (out / "results.json").string() << "\n";
  if (server->process) (void)server->process->stop();
  if (!error.empty()) return fail(error);
  if (!all_passed(cycled)) return 1;
  if (o.run.check && !all_passed(targets)) return 1;
  return 0;
}

}  // namespace strata::bench
