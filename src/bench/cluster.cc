#include "bench/cluster.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "bench/cluster_fleet.h"
#include "bench/progress.h"
#include "bench/report.h"
#include "bench/svg_chart.h"
#include "bench/traffic.h"
#include "router/prefix_index.h"
#include "storage/redis_connection.h"

namespace strata::bench {

namespace {

using ojson = nlohmann::ordered_json;

// Appends its parts: no temporaries of `"literal" + std::string` (g++ 12's false -Wrestrict).
template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::string out;
  (out += ... += parts);
  return out;
}

// Sleeps until monotonic time `until_s`; false when interrupted first.
bool sleep_until(double until_s) {
  while (monotonic_s() < until_s) {
    if (interrupted()) return false;
    const double left_ms = (until_s - monotonic_s()) * 1000;
    std::this_thread::sleep_for(
        std::chrono::milliseconds(static_cast<int64_t>(std::clamp(left_ms, 1.0, 20.0))));
  }
  return !interrupted();
}

// The routed requests of one phase, filled by the request threads.
class PhaseLog {
 public:
  explicit PhaseLog(double t0_s) : t0_s_(t0_s) {}
  double t0_s() const { return t0_s_; }
  void add(RoutedRequest r) {
    std::lock_guard lock(mutex_);
    requests_.push_back(std::move(r));
  }
  std::vector<RoutedRequest> requests() const {
    std::lock_guard lock(mutex_);
    return requests_;
  }
  int64_t count() const {
    std::lock_guard lock(mutex_);
    return static_cast<int64_t>(requests_.size());
  }
  // The worker URL that answered the most requests so far ("" when none did).
  std::string busiest_worker() const {
    std::lock_guard lock(mutex_);
    std::map<std::string, int64_t> n;
    for (const RoutedRequest& r : requests_) {
      if (!r.worker.empty()) ++n[r.worker];
    }
    std::string best;
    int64_t most = 0;
    for (const auto& [url, c] : n) {
      if (c > most) {
        best = url;
        most = c;
      }
    }
    return best;
  }

 private:
  const double t0_s_;
  mutable std::mutex mutex_;
  std::vector<RoutedRequest> requests_;  // GUARDED_BY(mutex_)
};

// Sends one streamed chat request through the router and records what came back. With
// router replicas (--routers), the request goes through the replica it is given (an L4
// balancer's round robin) and, when that one refuses the connection or breaks the answer
// (killed), again through the next, as a client behind such a balancer would.
class Sender {
 public:
  Sender(ServerClient client, std::string model, int32_t max_tokens)
      : Sender(std::vector<ServerClient>{std::move(client)}, std::move(model), max_tokens) {}
  Sender(std::vector<ServerClient> replicas, std::string model, int32_t max_tokens,
         bool retry_refused = false)
      : replicas_(std::move(replicas)),
        model_(std::move(model)),
        max_tokens_(max_tokens),
        retry_refused_(retry_refused) {}

  // `reply` (may be null) receives the generated text.
  RoutedRequest send(const PhaseLog& log, ojson messages, const std::string& session_id,
                     std::string* reply) const {
    ojson body = chat_request(model_, std::move(messages), max_tokens_, true);
    if (!session_id.empty()) body["session_id"] = session_id;
    return send_body(log, body, false, reply);
  }

  // A streamed completion of `prompt` token ids: `max_tokens` of them, whatever the
  // model would end with (ignore_eos).
  // `session_id` "": none. `replica`: the router replica to try first.
  RoutedRequest send_tokens(const PhaseLog& log, const std::vector<int32_t>& prompt,
                            int64_t max_tokens, const std::string& session_id = "",
                            size_t replica = 0) const {
    ojson body{{"model", model_},          {"prompt", prompt},
               {"max_tokens", max_tokens}, {"ignore_eos", true},
               {"stream", true},           {"stream_options", {{"include_usage", true}}}};
    if (!session_id.empty()) body["session_id"] = session_id;
    const double start_s = monotonic_s() - log.t0_s();
    RoutedRequest r;
    int32_t failovers = 0;
    int32_t refused = 0;
    for (size_t k = replica;;) {
      r = send_body(log, body, true, nullptr, k % replicas_.size());
      // A resent request's latency counts from its first send.
      if (r.ok) r.ttft_s += r.start_s - start_s;
      r.start_s = start_s;
      const bool router_gone = !r.ok && (r.status == 0 || r.broken_stream);
      const bool was_refused = !r.ok && (r.status == 429 || r.status == 503);
      if (router_gone && failovers + 1 < static_cast<int32_t>(replicas_.size())) {
        ++failovers;
        ++k;
      } else if (was_refused && retry_refused_ && refused < kMaxRefusedRetries) {
        // As a client would: wait what the answer asked (1 s when it did not say), again.
        ++refused;
        const double wait_s = r.retry_after_s > 0 ? std::min(r.retry_after_s, 30.0) : 1.0;
        if (!sleep_until(monotonic_s() + wait_s)) break;
      } else {
        break;
      }
    }
    r.router_failovers = failovers;
    r.refused_retries = refused;
    return r;
  }

 private:
  RoutedRequest send_body(const PhaseLog& log, const ojson& body, bool completion,
                          std::string* reply, size_t replica = 0) const {
    const ServerClient& client_ = replicas_[replica];
    RoutedRequest r;
    r.start_s = monotonic_s() - log.t0_s();
    AnswerHead head;
    auto answer =
        completion ? client_.stream_completion(body, &head) : client_.stream_chat(body, &head);
    r.end_s = monotonic_s() - log.t0_s();
    r.status = head.status;
    r.worker = head.header("x-strata-worker");
    if (const std::string ra = head.header("retry-after"); !ra.empty()) {
      r.retry_after_s = std::strtod(ra.c_str(), nullptr);
    }
    if (!answer) {
      r.error = answer.error().message;
      r.broken_stream = head.status == 200;
      return r;
    }
    r.ok = true;
    r.ttft_s = answer->ttft_s;
    r.itl_s = answer->inter_chunk_s();
    r.prompt_tokens = answer->usage.prompt_tokens;
    r.cached_tokens = answer->usage.cached_tokens;
    r.completion_tokens = answer->usage.completion_tokens;
    if (reply != nullptr) *reply = std::move(answer->text);
    return r;
  }

  static constexpr int32_t kMaxRefusedRetries = 20;

  const std::vector<ServerClient> replicas_;
  const std::string model_;
  const int32_t max_tokens_;
  const bool retry_refused_;
};

// The CPU seconds processes used between two readings, summed over those read both times;
// -1 when none was.
double cpu_delta(const std::vector<double>& before, const std::vector<double>& after) {
  double sum = 0;
  bool any = false;
  for (size_t i = 0; i < before.size() && i < after.size(); ++i) {
    if (before[i] < 0 || after[i] < 0) continue;
    sum += after[i] - before[i];
    any = true;
  }
  return any ? sum : -1;
}

// Each worker's strata_kv_evicted_pages_total (-1 where it did not answer).
std::vector<int64_t> read_worker_evictions(const std::vector<std::string>& workers,
                                           const std::string& api_key) {
  std::vector<int64_t> out;
  for (const std::string& url : workers) {
    int64_t v = -1;
    if (auto m = ServerClient(url, api_key, 10).get("/metrics"); m && m->status == 200) {
      const std::string key = "\nstrata_kv_evicted_pages_total ";
      if (const size_t at = m->body.find(key); at != std::string::npos) {
        v = std::strtoll(m->body.c_str() + at + key.size(), nullptr, 10);
      }
    }
    out.push_back(v);
  }
  return out;
}

// Pages each worker evicted between two readings (-1 where either is missing).
std::vector<int64_t> evictions_since(const std::vector<int64_t>& before,
                                     const std::vector<int64_t>& after) {
  std::vector<int64_t> out;
  for (size_t w = 0; w < after.size() && w < before.size(); ++w) {
    out.push_back(after[w] >= 0 && before[w] >= 0 ? after[w] - before[w] : -1);
  }
  return out;
}

// The counters of every router replica that answers, summed (a killed one's are gone).
Result<RouterCounters> read_router_counters(const std::vector<ServerClient>& routers) {
  std::string all;
  std::string last_error = "no router";
  bool any = false;
  for (const ServerClient& router : routers) {
    auto m = router.get("/metrics");
    if (!m) {
      last_error = m.error().message;
    } else if (m->status != 200) {
      last_error = cat("GET /metrics of the router answered HTTP ", std::to_string(m->status));
    } else {
      all += m->body;
      all += "\n";
      any = true;
    }
  }
  if (!any) return make_error(ErrorCode::kFailedPrecondition, last_error);
  return parse_router_metrics(all);
}

// The cluster as the router lists it (GET /workers).
struct ClusterView {
  std::vector<std::string> workers;
  std::string policy;
  int64_t pool_tokens = 0;  // the smallest worker's device pool
  int64_t page_size = 0;
};

ClusterView cluster_view(const nlohmann::json& answer) {
  ClusterView v;
  v.policy = answer.value("policy", std::string());
  for (const auto& w : answer.value("workers", nlohmann::json::array())) {
    v.workers.push_back(w.value("url", std::string()));
    const int64_t block = w.value("block_size", int64_t{0});
    const int64_t pages =
        w.value("load", nlohmann::json::object()).value("total_pages", int64_t{0});
    if (block > 0) v.page_size = block;
    if (pages > 0 && block > 0) {
      v.pool_tokens = v.pool_tokens == 0 ? pages * block : std::min(v.pool_tokens, pages * block);
    }
  }
  return v;
}

// Runs the agentic-shaped sessions of `w` through `sender`; each session thread starts at
// its arrival. Returns when every session ended (or on an interrupt). `on_tick` runs on the
// calling thread every 20 ms meanwhile (the failure workload's kill and restart).
void run_sessions(const AgenticWorkload& w, const std::string& id_prefix, const Sender& sender,
                  PhaseLog& log, const std::function<void()>& on_tick) {
  std::atomic<int32_t> finished{0};
  auto session = [&](const AgentSession& s) {
    const std::string id = cat(id_prefix, std::to_string(s.index));
    ojson messages = ojson::array({ojson{{"role", "system"}, {"content", w.boilerplate.text}},
                                   ojson{{"role", "user"}, {"content", s.task}}});
    for (int32_t turn = 0; turn <= w.shape.tool_calls; ++turn) {
      std::string reply;
      RoutedRequest r = sender.send(log, messages, id, &reply);
      r.session = s.index;
      r.turn = turn;
      const bool ok = r.ok;
      log.add(std::move(r));
      if (!ok || turn == w.shape.tool_calls) break;
      if (!sleep_until(monotonic_s() + s.pauses_s[static_cast<size_t>(turn)])) break;
      messages.push_back(ojson{{"role", "assistant"}, {"content", reply}});
      messages.push_back(
          ojson{{"role", "tool"}, {"content", s.tool_results[static_cast<size_t>(turn)]}});
    }
    finished.fetch_add(1);
  };
  std::atomic<int32_t> started{0};
  std::atomic<bool> dispatch_done{false};
  std::vector<std::thread> threads;  // the dispatcher's; read only once it joined
  std::thread dispatcher([&] {
    for (const AgentSession& s : w.sessions) {
      if (!sleep_until(log.t0_s() + s.arrival_s)) break;
      started.fetch_add(1);
      threads.emplace_back(session, std::cref(s));
    }
    dispatch_done.store(true);
  });
  for (;;) {
    if (on_tick) on_tick();
    if (dispatch_done.load() && finished.load() == started.load()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  dispatcher.join();
  for (std::thread& t : threads) t.join();
}

// The trace of workload 4 as it is replayed: the requests that fit the served model, their
// ideal hits and prefix families, and the token blocks of their hash ids.
struct TraceReplay {
  std::vector<TraceRequest> requests;  // in arrival order
  int64_t skipped_too_long = 0;        // input + output beyond the model's context
  int64_t max_model_len = 0;
  TraceIdeal ideal;
  TraceFamilies families;
  std::unique_ptr<TraceTokens> tokens;
};

class ClusterRun {
 public:
  // `trace`: the requests of --trace (empty without it), read before anything starts.
  ClusterRun(const ClusterOptions& o, TokenCounter counter, std::vector<TraceRequest> trace)
      : o_(o), counter_(std::move(counter)), progress_(stderr, stderr_is_terminal()) {
    trace_.requests = std::move(trace);
  }

  int run();

 private:
  int fail(const std::string& message) {
    std::cerr << "strata bench cluster: " << message << "\n";
    return 2;
  }
  // Starts the fleet of one phase (spawn) or reads the running router (--router).
  Status open(const std::string& workload, const std::string& policy);
  void close() {
    if (fleet_) fleet_->stop();
    fleet_.reset();
  }
  Status ensure_workloads(const ClusterView& view);
  Status run_shared_prefix(const std::string& policy, const std::vector<std::string>& args);
  Status run_agentic(const std::string& workload, const std::string& policy,
                     const std::vector<std::string>& args);
  // Workload 4's preparation, once the served model is known: the vocabulary of the
  // blocks and the context length (POST /tokenize), the ideal and the families.
  Status prepare_trace(const ClusterView& view);
  Status run_trace(const std::string& policy, const std::vector<std::string>& args);
  PhaseRecord new_phase(const std::string& workload, const std::string& policy,
                        const std::vector<std::string>& args) const {
    PhaseRecord p;
    p.workload = workload;
    p.policy = policy;
    p.router_args = args;
    p.workers = view_.workers;
    return p;
  }
  void show(const std::string& status, double phase_fraction) {
    const double total = static_cast<double>(std::max<int64_t>(1, phases_total_));
    progress_.update(
        (static_cast<double>(phases_done_) + std::clamp(phase_fraction, 0.0, 1.0)) / total, status);
  }

  const ClusterOptions& o_;
  const TokenCounter counter_;
  ProgressDisplay progress_;
  ClusterRecord record_;
  std::unique_ptr<Fleet> fleet_;
  ServerClient router_{"http://127.0.0.1:1"};  // the first replica: set-up, listings
  std::vector<ServerClient> replicas_;         // every router replica (--routers)
  int64_t phase_number_ = 0;                   // phases opened: session-store namespaces
  ClusterView view_;
  std::string model_;
  bool workloads_made_ = false;
  SharedPrefixWorkload shared_;
  AgenticWorkload agentic_;
  AgenticWorkload failure_;
  TraceReplay trace_;
  int64_t phases_total_ = 0;
  int64_t phases_done_ = 0;
};

Status ClusterRun::open(const std::string& workload, const std::string& policy) {
  if (o_.target.spawn) {
    auto args = policy_router_args(policy);
    if (!args) return std::unexpected(args.error());
    FleetOptions fo;
    fo.strata_bin = o_.target.strata_bin.empty() ? self_executable() : o_.target.strata_bin;
    fo.model_dir = o_.target.model_dir;
    fo.workers = o_.workers;
    fo.worker_args = {"--threads", std::to_string(o_.worker_threads), "--kv-cache-tokens",
                      std::to_string(o_.worker_kv_tokens)};
    if (!o_.simulate_profile.empty()) {
      fo.worker_args.push_back("--simulate");
      fo.worker_args.push_back(o_.simulate_profile);
    }
    for (const std::string& a : split_args(o_.target.server_args)) fo.worker_args.push_back(a);
    fo.router_args = *args;
    for (const std::string& a : split_args(o_.router_args)) fo.router_args.push_back(a);
    fo.routers = o_.routers;
    if (!o_.session_store.empty()) {
      // Each phase's replicas share bindings among themselves only: a namespace per phase.
      fo.router_args.insert(
          fo.router_args.end(),
          {"--session-store", o_.session_store, "--session-store-namespace",
           cat("bench-", std::to_string(::getpid()), "-", std::to_string(++phase_number_))});
    }
    fo.log_dir = std::filesystem::path(o_.run.out_dir) / "logs";
    fo.log_prefix = cat(workload, "-", policy);
    fo.start_timeout_s = o_.target.start_timeout_s;
    fo.join_timeout_s = o_.join_timeout_s;
    auto f = Fleet::start(fo);
    if (!f) return std::unexpected(f.error());
    fleet_ = std::move(*f);
    router_ = ServerClient(fleet_->router_url(), o_.target.api_key);
    replicas_.clear();
    for (const std::string& url : fleet_->router_urls()) {
      replicas_.emplace_back(url, o_.target.api_key);
    }
  } else {
    router_ = ServerClient(o_.target.url, o_.target.api_key);
    replicas_ = {router_};
  }
  auto joined = wait_workers_joined(router_, 0, o_.join_timeout_s);
  if (!joined) return std::unexpected(joined.error());
  view_ = cluster_view(*joined);
  if (model_.empty()) {
    auto model = served_model_id(router_);
    if (!model) return std::unexpected(model.error());
    model_ = *model;
  }
  return ensure_workloads(view_);
}

Status ClusterRun::ensure_workloads(const ClusterView& view) {
  if (workloads_made_) return {};
  if (view.pool_tokens <= 0 || view.page_size <= 0) {
    return make_error(ErrorCode::kCorrupt, "the router's GET /workers shows no device pool");
  }
  SharedPrefixShape shape = o_.shared;
  shape.prefix_tokens =
      shared_prefix_tokens(o_.prefix_kv_fraction, static_cast<int32_t>(view.workers.size()),
                           view.pool_tokens, shape.groups);
  auto shared = make_shared_prefix_workload(o_.run.seed, shape, counter_);
  if (!shared) return std::unexpected(shared.error());
  shared_ = std::move(*shared);
  auto agentic = make_agentic_workload(o_.run.seed, kAgentic, o_.agentic, counter_);
  if (!agentic) return std::unexpected(agentic.error());
  agentic_ = std::move(*agentic);
  AgenticShape fshape = o_.agentic;
  fshape.session_rate_per_s = o_.failure_session_rate_per_s;
  fshape.sessions = std::max<int32_t>(
      1, static_cast<int32_t>(std::ceil(o_.failure_duration_s * o_.failure_session_rate_per_s)));
  auto failure = make_agentic_workload(o_.run.seed, kFailure, fshape, counter_);
  if (!failure) return std::unexpected(failure.error());
  failure_ = std::move(*failure);
  workloads_made_ = true;
  record_.cluster = {
      {"workers", static_cast<int64_t>(view.workers.size())},
      {"worker_pool_tokens", view.pool_tokens},
      {"page_size", view.page_size},
      {"shared_prefix_tokens", shape.prefix_tokens},
      {"shared_prefixes_over_cluster_kv",
       static_cast<double>(shape.prefix_tokens * shape.groups) /
           static_cast<double>(view.pool_tokens * static_cast<int64_t>(view.workers.size()))},
      {"agentic_boilerplate_tokens", agentic_.boilerplate.tokens},
      {"failure_sessions", fshape.sessions}};
  if (!view.policy.empty() && !o_.target.spawn) record_.cluster["router_policy"] = view.policy;
  if (!trace_.requests.empty()) return prepare_trace(view);
  return {};
}

Status ClusterRun::prepare_trace(const ClusterView& view) {
  // Ordinary tokens of the served model: those of generated text, as it tokenizes them.
  TextGenerator gen(derive_seed(o_.run.seed, "trace-vocabulary", 0), counter_);
  auto text = gen.text(3000);
  if (!text) return std::unexpected(text.error());
  auto tokenized = router_.post_json(
      "/tokenize", nlohmann::json{{"prompt", text->text}, {"add_special_tokens", false}});
  if (!tokenized) return std::unexpected(tokenized.error());
  std::vector<int32_t> vocabulary;
  for (const auto& t : tokenized->value("tokens", nlohmann::json::array())) {
    if (t.is_number_integer()) vocabulary.push_back(t.get<int32_t>());
  }
  std::sort(vocabulary.begin(), vocabulary.end());
  vocabulary.erase(std::unique(vocabulary.begin(), vocabulary.end()), vocabulary.end());
  if (vocabulary.size() < 64) {
    return make_error(ErrorCode::kCorrupt,
                      cat("POST /tokenize gave ", std::to_string(vocabulary.size()),
                          " distinct tokens of generated text; the trace's blocks need >= 64"));
  }
  trace_.max_model_len = tokenized->value("max_model_len", int64_t{0});
  const int64_t given = static_cast<int64_t>(trace_.requests.size());
  if (trace_.max_model_len > 0) {
    std::erase_if(trace_.requests, [&](const TraceRequest& r) {
      return r.input_tokens + r.output_tokens > trace_.max_model_len;
    });
  }
  trace_.skipped_too_long = given - static_cast<int64_t>(trace_.requests.size());
  if (trace_.requests.empty()) {
    return make_error(ErrorCode::kInvalidArgument,
                      cat("no request of the trace fits the model's context of ",
                          std::to_string(trace_.max_model_len), " tokens"));
  }
  const auto vocabulary_tokens = static_cast<int64_t>(vocabulary.size());
  trace_.tokens =
      std::make_unique<TraceTokens>(o_.run.seed, o_.trace_block_tokens, std::move(vocabulary));
  trace_.ideal = trace_ideal_hit(trace_.requests, o_.trace_block_tokens, view.page_size);
  trace_.families = trace_families(trace_.requests);
  const double first_ms = trace_.requests.front().timestamp_ms;
  const double span_ms = trace_.requests.back().timestamp_ms - first_ms;
  int64_t input = 0, output = 0;
  for (const TraceRequest& r : trace_.requests) {
    input += r.input_tokens;
    output += r.output_tokens;
  }
  record_.cluster["trace"] = {{"file", o_.trace_path},
                              {"requests", static_cast<int64_t>(trace_.requests.size())},
                              {"skipped_beyond_context", trace_.skipped_too_long},
                              {"max_model_len", trace_.max_model_len},
                              {"block_tokens", o_.trace_block_tokens},
                              {"time_scale", o_.time_scale},
                              {"trace_span_s", span_ms / 1000},
                              {"arrival_span_s", span_ms / 1000 * o_.time_scale},
                              {"input_tokens", input},
                              {"output_tokens", output},
                              {"prefix_families", trace_.families.count},
                              {"vocabulary_tokens", vocabulary_tokens},
                              {"ideal",
                               {{"blocks", trace_.ideal.blocks},
                                {"seen_blocks", trace_.ideal.seen_blocks},
                                {"block_fraction", trace_.ideal.block_fraction()},
                                {"prompt_tokens", trace_.ideal.prompt_tokens},
                                {"hit_tokens", trace_.ideal.hit_tokens},
                                {"token_fraction", trace_.ideal.token_fraction()}}}};
  if (trace_.skipped_too_long > 0) {
    std::cerr << "strata bench cluster: " << trace_.skipped_too_long << " of " << given
              << " trace requests need more than the model's context of " << trace_.max_model_len
              << " tokens; skipped\n";
  }
  return {};
}

Status ClusterRun::run_shared_prefix(const std::string& policy,
                                     const std::vector<std::string>& args) {
  const Sender sender(router_, model_, o_.max_tokens);
  const int64_t page = std::max<int64_t>(1, view_.page_size);
  const int64_t reusable = shared_.shape.prefix_tokens / page * page;
  // Warm-up, not measured: one request per group, all at once, so that every measured
  // request's prefix is cached somewhere in the cluster (the reusable share is then the
  // prefix of every request) and the sweep's first rate does not carry the cold starts.
  std::set<int32_t> seen;  // groups sent before
  {
    PhaseLog warm(monotonic_s());
    std::vector<std::thread> threads;
    for (int32_t g = 0; g < shared_.shape.groups; ++g) {
      threads.emplace_back([&, g] {
        SharedPrefixRequest q;
        q.group = g;
        q.question = "Warm-up: say hello.";
        (void)sender.send(warm, shared_prefix_messages(shared_, q), "", nullptr);
      });
      seen.insert(g);
    }
    show(cat(kSharedPrefix, " / ", policy, ": warming up"), 0);
    for (std::thread& t : threads) t.join();
  }
  for (size_t level = 0; level < shared_.levels.size(); ++level) {
    const auto& requests = shared_.levels[level];
    PhaseRecord phase = new_phase(kSharedPrefix, policy, args);
    phase.rate_per_s = shared_.shape.rates_per_s[level];
    phase.arrival_span_s = requests.empty() ? 0 : requests.back().arrival_s;
    auto before = read_router_counters(replicas_);
    if (!before) return std::unexpected(before.error());
    PhaseLog log(monotonic_s());
    std::vector<std::thread> threads;
    for (const SharedPrefixRequest& q : requests) {
      if (!sleep_until(log.t0_s() + q.arrival_s)) break;
      const int64_t reusable_tokens = seen.insert(q.group).second ? 0 : reusable;
      threads.emplace_back([&, reusable_tokens, q_ptr = &q] {
        RoutedRequest r = sender.send(log, shared_prefix_messages(shared_, *q_ptr), "", nullptr);
        r.group = q_ptr->group;
        r.reusable_tokens = reusable_tokens;
        log.add(std::move(r));
      });
      show(cat(kSharedPrefix, " / ", policy, " at ", format_number(phase.rate_per_s),
               " req/s: ", std::to_string(log.count()), "/", std::to_string(requests.size())),
           (static_cast<double>(level) +
            static_cast<double>(log.count()) / static_cast<double>(requests.size())) /
               static_cast<double>(shared_.levels.size()));
    }
    for (std::thread& t : threads) t.join();
    phase.requests = log.requests();
    for (const RoutedRequest& r : phase.requests) phase.wall_s = std::max(phase.wall_s, r.end_s);
    auto after = read_router_counters(replicas_);
    if (!after) return std::unexpected(after.error());
    phase.router = *after - *before;
    if (interrupted()) phase.error = "interrupted";
    record_.phases.push_back(std::move(phase));
    if (interrupted()) break;
  }
  return {};
}

Status ClusterRun::run_agentic(const std::string& workload, const std::string& policy,
                               const std::vector<std::string>& args) {
  const bool failure = workload == kFailure;
  const AgenticWorkload& w = failure ? failure_ : agentic_;
  const Sender sender(router_, model_, o_.max_tokens);
  PhaseRecord phase = new_phase(workload, policy, args);
  phase.sessions_planned = static_cast<int64_t>(w.sessions.size());
  phase.arrival_span_s = w.sessions.back().arrival_s;
  auto before = read_router_counters(replicas_);
  if (!before) return std::unexpected(before.error());
  // Pages each worker evicted over the phase (not with a worker killed: its count restarts).
  const std::vector<int64_t> evicted_before =
      failure ? std::vector<int64_t>{} : read_worker_evictions(view_.workers, o_.target.api_key);
  PhaseLog log(monotonic_s());
  const double kill_s = o_.kill_at * o_.failure_duration_s;
  const double restart_s = o_.restart_at * o_.failure_duration_s;
  const int64_t expected = phase.sessions_planned * (static_cast<int64_t>(w.shape.tool_calls) + 1);
  std::string tick_error;
  auto tick = [&] {
    const double now = monotonic_s() - log.t0_s();
    show(cat(workload, " / ", policy, ": ", std::to_string(log.count()), "/",
             std::to_string(expected), " requests"),
         static_cast<double>(log.count()) / static_cast<double>(std::max<int64_t>(1, expected)));
    if (!failure || !fleet_ || !tick_error.empty()) return;
    if (phase.killed_worker < 0 && now >= kill_s) {
      std::string busiest = log.busiest_worker();
      const auto& urls = fleet_->worker_urls();
      auto it = std::find(urls.begin(), urls.end(), busiest);
      const size_t index =
          it == urls.end() ? urls.size() - 1 : static_cast<size_t>(it - urls.begin());
      phase.killed_at_s = monotonic_s() - log.t0_s();
      phase.killed_worker = static_cast<int32_t>(index);
      if (auto st = fleet_->kill_worker(index); !st) tick_error = st.error().message;
      progress_.message(cat("killed worker ", std::to_string(index + 1), " (", urls[index], ") at ",
                            format_number(std::round(phase.killed_at_s * 10) / 10), " s"));
    } else if (phase.killed_worker >= 0 && phase.restarted_at_s < 0 && now >= restart_s) {
      if (auto st = fleet_->restart_worker(static_cast<size_t>(phase.killed_worker)); !st) {
        tick_error = st.error().message;
        return;
      }
      phase.restarted_at_s = monotonic_s() - log.t0_s();
      progress_.message(cat("restarted worker ", std::to_string(phase.killed_worker + 1), " at ",
                            format_number(std::round(phase.restarted_at_s * 10) / 10), " s"));
    }
  };
  run_sessions(w, cat(workload, "-", std::to_string(o_.run.seed), "-"), sender, log, tick);
  // A run shorter than the restart time still restarts the worker (the figures say when).
  if (failure && fleet_ && phase.killed_worker >= 0 && phase.restarted_at_s < 0 &&
      tick_error.empty() && !interrupted()) {
    if (auto st = fleet_->restart_worker(static_cast<size_t>(phase.killed_worker)); !st) {
      tick_error = st.error().message;
    } else {
      phase.restarted_at_s = monotonic_s() - log.t0_s();
    }
  }
  phase.requests = log.requests();
  for (const RoutedRequest& r : phase.requests) phase.wall_s = std::max(phase.wall_s, r.end_s);
  auto after = read_router_counters(replicas_);
  if (!after) return std::unexpected(after.error());
  phase.router = *after - *before;
  if (!failure) {
    phase.evicted_pages_per_worker =
        evictions_since(evicted_before, read_worker_evictions(view_.workers, o_.target.api_key));
  }
  phase.error = interrupted() ? std::string("interrupted") : tick_error;
  record_.phases.push_back(std::move(phase));
  return {};
}

Status ClusterRun::run_trace(const std::string& policy, const std::vector<std::string>& args) {
  const Sender sender(replicas_, model_, o_.max_tokens, o_.retry_refused);
  const std::vector<TraceRequest>& requests = trace_.requests;
  const std::vector<int64_t> evicted_before =
      read_worker_evictions(view_.workers, o_.target.api_key);
  const double first_ms = requests.front().timestamp_ms;
  PhaseRecord phase = new_phase(kTrace, policy, args);
  phase.sessions_planned = trace_.families.count;
  phase.arrival_span_s = (requests.back().timestamp_ms - first_ms) / 1000 * o_.time_scale;
  phase.routers = static_cast<int32_t>(replicas_.size());
  auto before = read_router_counters(replicas_);
  if (!before) return std::unexpected(before.error());
  const Fleet::CpuSeconds cpu_before = fleet_ ? fleet_->cpu_seconds() : Fleet::CpuSeconds{};
  PhaseLog log(monotonic_s());
  // Open loop: each request on its own thread at its time, whatever is in flight.
  std::vector<std::thread> threads;
  threads.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const TraceRequest& q = requests[i];
    const double at_s = (q.timestamp_ms - first_ms) / 1000 * o_.time_scale;
    if (!sleep_until(log.t0_s() + at_s)) break;
    // --kill-router-at: replica 1 dies (SIGKILL) mid-run; its clients go to the others.
    if (fleet_ && o_.kill_router_at > 0 && phase.killed_router_at_s < 0 &&
        at_s >= o_.kill_router_at * phase.arrival_span_s) {
      if (auto st = fleet_->kill_router(0); !st) {
        phase.error = st.error().message;
        break;
      }
      phase.killed_router_at_s = monotonic_s() - log.t0_s();
    }
    threads.emplace_back([&, i] {
      const TraceRequest& r = requests[i];
      const std::string session =
          o_.trace_sessions ? cat("family-", std::to_string(trace_.families.family[i])) : "";
      RoutedRequest out = sender.send_tokens(log, trace_.tokens->prompt(r), r.output_tokens,
                                             session, i % replicas_.size());
      out.session = trace_.families.family[i];
      out.turn = trace_.families.first[i] ? 0 : 1;
      out.reusable_tokens = trace_.ideal.hit_tokens_per_request[i];
      out.trace_line = r.line;
      log.add(std::move(out));
    });
    show(cat(kTrace, " / ", policy, ": ", std::to_string(i + 1), "/",
             std::to_string(requests.size()), " sent, ", std::to_string(log.count()), " done"),
         static_cast<double>(log.count()) / static_cast<double>(requests.size()));
  }
  // The answers still streaming after the last arrival.
  while (log.count() < static_cast<int64_t>(threads.size()) && !interrupted()) {
    show(cat(kTrace, " / ", policy, ": ", std::to_string(log.count()), "/",
             std::to_string(requests.size()), " done"),
         static_cast<double>(log.count()) / static_cast<double>(requests.size()));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  for (std::thread& t : threads) t.join();
  phase.requests = log.requests();
  for (const RoutedRequest& r : phase.requests) phase.wall_s = std::max(phase.wall_s, r.end_s);
  auto after = read_router_counters(replicas_);
  if (!after) return std::unexpected(after.error());
  phase.router = *after - *before;
  phase.evicted_pages_per_worker =
      evictions_since(evicted_before, read_worker_evictions(view_.workers, o_.target.api_key));
  if (fleet_) {
    const Fleet::CpuSeconds cpu_after = fleet_->cpu_seconds();
    phase.router_cpu_s = cpu_delta(cpu_before.routers, cpu_after.routers);
    phase.worker_cpu_s = cpu_delta(cpu_before.workers, cpu_after.workers);
  }
  if (interrupted()) phase.error = "interrupted";
  record_.phases.push_back(std::move(phase));
  return {};
}

int ClusterRun::run() {
  const std::filesystem::path out = o_.run.out_dir;
  record_.machine = machine_info();
  record_.parameters = {
      {"workers", o_.workers},
      {"worker_kv_tokens", o_.worker_kv_tokens},
      {"worker_threads", o_.worker_threads},
      {"policies", o_.policies},
      {"workloads", o_.workloads},
      {"router_args", split_args(o_.router_args)},
      {"max_tokens", o_.max_tokens},
      {"prefix_kv_fraction", o_.prefix_kv_fraction},
      {"shared_prefix",
       {{"groups", o_.shared.groups},
        {"users_per_group", o_.shared.users_per_group},
        {"question_tokens", {o_.shared.question_min_tokens, o_.shared.question_max_tokens}},
        {"rates_per_s", o_.shared.rates_per_s},
        {"requests_per_rate", o_.shared.requests_per_rate},
        {"arrivals", "poisson"}}},
      {"agentic",
       {{"sessions", o_.agentic.sessions},
        {"session_rate_per_s", o_.agentic.session_rate_per_s},
        {"boilerplate_tokens", o_.agentic.boilerplate_tokens},
        {"task_tokens", {o_.agentic.task_min_tokens, o_.agentic.task_max_tokens}},
        {"tool_calls", o_.agentic.tool_calls},
        {"tool_pause_s", {o_.agentic.pause_min_s, o_.agentic.pause_max_s}},
        {"tool_result_tokens",
         {o_.agentic.tool_result_min_tokens, o_.agentic.tool_result_max_tokens}}}},
      {"failure",
       {{"duration_s", o_.failure_duration_s},
        {"session_rate_per_s", o_.failure_session_rate_per_s},
        {"kill_at", o_.kill_at},
        {"restart_at", o_.restart_at}}},
      {"trace",
       {{"file", o_.trace_path},
        {"block_tokens", o_.trace_block_tokens},
        {"time_scale", o_.time_scale},
        {"limit", o_.trace_limit},
        {"requests_read", static_cast<int64_t>(trace_.requests.size())},
        {"sessions", o_.trace_sessions},
        {"retry_refused", o_.retry_refused}}},
      {"routers", o_.routers},
      {"session_store", o_.session_store},
      {"kill_router_at", o_.kill_router_at},
      {"simulate", o_.simulate_profile},
      {"seed", o_.run.seed},
      {"quick", o_.run.quick},
      {"check", o_.run.check},
      {"router_url", o_.target.spawn ? std::string() : o_.target.url},
      {"spawn", o_.target.spawn},
      {"model_dir", o_.target.model_dir},
      {"server_args", split_args(o_.target.server_args)}};

  std::vector<std::string> workloads = o_.workloads;
  if (!o_.target.spawn) {
    std::erase(workloads, std::string(kFailure));
    if (workloads.size() != o_.workloads.size()) {
      std::cerr << "strata bench cluster: the failure workload needs --spawn (it kills a "
                   "worker); skipped\n";
    }
  }
  const std::vector<std::string> policies =
      o_.target.spawn ? o_.policies : std::vector<std::string>{"as-run"};
  phases_total_ = static_cast<int64_t>(workloads.size() * policies.size());
  for (const std::string& workload : workloads) {
    for (const std::string& policy : policies) {
      if (interrupted()) break;
      if (auto st = open(workload, policy); !st) {
        record_.error = cat(workload, " / ", policy, ": ", st.error().message);
        break;
      }
      const std::string name =
          o_.target.spawn ? policy : (view_.policy.empty() ? policy : view_.policy);
      // The policy's options as given to `strata route` (its full argv is in the log).
      std::vector<std::string> args;
      if (auto policy_args = policy_router_args(policy); policy_args && o_.target.spawn) {
        args = *policy_args;
        for (const std::string& a : split_args(o_.router_args)) args.push_back(a);
      }
      auto st = workload == kSharedPrefix ? run_shared_prefix(name, args)
                : workload == kTrace      ? run_trace(name, args)
                                          : run_agentic(workload, name, args);
      close();
      if (!st) {
        record_.error = cat(workload, " / ", policy, ": ", st.error().message);
        break;
      }
      ++phases_done_;
    }
    if (!record_.error.empty() || interrupted()) break;
  }
  close();
  progress_.finish();
  if (interrupted() && record_.error.empty()) record_.error = "interrupted";
  record_.model = model_;

  const std::vector<Check> valid = validity_checks(record_);
  const std::vector<Check> targets = cluster_checks(record_, o_.targets);
  std::vector<Check> checks = valid;
  checks.insert(checks.end(), targets.begin(), targets.end());
  if (auto st = write_cluster_outputs(o_.run.out_dir, record_, checks); !st) {
    return fail(st.error().message);
  }
  std::cout << "\ncluster on " << model_ << "\n"
            << cluster_summary_markdown(record_, checks)
            << "results: " << (out / "results.json").string() << "\n";
  if (!record_.error.empty()) return fail(record_.error);
  if (!all_passed(valid)) return 1;
  if (o_.run.check && !all_passed(targets)) return 1;
  return 0;
}

}  // namespace

void apply_quick(ClusterOptions& o) {
  o.workers = 2;
  o.worker_kv_tokens = 2048;
  o.policies = {"round-robin", "default"};
  o.max_tokens = 4;
  o.shared.groups = 4;
  o.shared.users_per_group = 2;
  o.shared.question_min_tokens = 8;
  o.shared.question_max_tokens = 16;
  o.shared.rates_per_s = {4, 16};
  o.shared.requests_per_rate = 8;
  o.agentic = AgenticShape{.sessions = 6,
                           .session_rate_per_s = 4,
                           .boilerplate_tokens = 300,
                           .task_min_tokens = 20,
                           .task_max_tokens = 40,
                           .tool_calls = 2,
                           .pause_min_s = 0.1,
                           .pause_max_s = 0.3,
                           .tool_result_min_tokens = 20,
                           .tool_result_max_tokens = 40};
  o.failure_duration_s = 5;
  o.failure_session_rate_per_s = 3;
}

Result<std::vector<std::string>> policy_router_args(const std::string& policy) {
  if (policy == "round-robin" || policy == "least-loaded" || policy == "approximate" ||
      policy == "precise" || policy == "default") {
    return std::vector<std::string>{"--policy", policy};
  }
  if (policy == "default-no-floor") {
    return std::vector<std::string>{"--policy", "default", "--load-floor-bonus", "0"};
  }
  return make_error(ErrorCode::kInvalidArgument,
                    cat("unknown policy '", policy,
                        "' (round-robin, least-loaded, approximate, precise, default, "
                        "default-no-floor)"));
}

Status validate(const ClusterOptions& o) {
  auto bad = [](const std::string& m) -> Status {
    return make_error(ErrorCode::kInvalidArgument, m);
  };
  if (auto st = validate(o.target); !st) return st;
  if (o.run.out_dir.empty()) return bad("--out is required");
  if (o.target.spawn && (o.workers < 1 || o.workers > static_cast<int32_t>(router::kMaxWorkers))) {
    return bad(cat("--workers must be in [1, ", std::to_string(router::kMaxWorkers), "]"));
  }
  if (o.worker_kv_tokens < 256) return bad("--worker-kv-tokens must be >= 256");
  if (o.worker_threads < 1) return bad("--worker-threads must be >= 1");
  if (o.policies.empty()) return bad("--policies is empty");
  for (const std::string& p : o.policies) {
    if (auto a = policy_router_args(p); !a) return std::unexpected(a.error());
  }
  if (o.workloads.empty()) return bad("--workloads is empty");
  for (const std::string& w : o.workloads) {
    if (w != kSharedPrefix && w != kAgentic && w != kFailure && w != kTrace) {
      return bad(cat("unknown workload '", w, "' (shared-prefix, agentic, failure, trace)"));
    }
  }
  const bool trace = std::find(o.workloads.begin(), o.workloads.end(), kTrace) != o.workloads.end();
  if (trace && o.trace_path.empty()) return bad("the trace workload needs --trace FILE");
  if (!trace && !o.trace_path.empty()) return bad("--trace is given but --workloads has no trace");
  if (o.trace_block_tokens < 1) return bad("--trace-block-tokens must be >= 1");
  if (!(o.time_scale > 0) || o.time_scale > 1000) return bad("--time-scale must be in (0, 1000]");
  if (o.trace_limit < 0) return bad("--trace-limit must be >= 0 (0: every request)");
  if (!o.simulate_profile.empty() && !o.target.spawn) return bad("--simulate needs --spawn");
  if (o.max_tokens < 2) return bad("--max-tokens must be >= 2 (inter-token latency needs two)");
  if (!(o.prefix_kv_fraction > 0) || o.prefix_kv_fraction > 4) {
    return bad("--prefix-kv-fraction must be in (0, 4]");
  }
  SharedPrefixShape shared = o.shared;
  shared.prefix_tokens = std::max<int64_t>(shared.prefix_tokens, 16);
  if (auto st = validate(shared); !st) return st;
  if (auto st = validate(o.agentic); !st) return st;
  if (!(o.failure_duration_s > 0)) return bad("--failure-duration-s must be > 0");
  if (!(o.failure_session_rate_per_s > 0)) return bad("--failure-session-rate must be > 0");
  if (!(o.kill_at > 0) || !(o.restart_at > o.kill_at) || !(o.restart_at < 1)) {
    return bad("--kill-at and --restart-at need 0 < kill < restart < 1");
  }
  if (!(o.join_timeout_s > 0)) return bad("--join-timeout-s must be > 0");
  if (o.routers < 1 || o.routers > 16) return bad("--routers must be in [1, 16]");
  if (o.routers > 1 && !o.target.spawn) return bad("--routers needs --spawn");
  if (o.routers > 1 && o.session_store.empty()) {
    return bad(
        "--routers above 1 needs --session-store redis://HOST:PORT (the replicas share "
        "session bindings through it)");
  }
  if (!o.session_store.empty()) {
    if (auto e = parse_redis_url(o.session_store); !e) {
      return bad("--session-store: " + e.error().message);
    }
  }
  if (!(o.kill_router_at >= 0) || !(o.kill_router_at < 1)) {
    return bad("--kill-router-at must be in [0, 1)");
  }
  if (o.kill_router_at > 0 && o.routers < 2) return bad("--kill-router-at needs --routers >= 2");
  if (o.kill_router_at > 0 && !trace) return bad("--kill-router-at applies to the trace workload");
  if (o.trace_sessions && !trace) return bad("--trace-sessions needs --trace");
  if (o.retry_refused && !trace) return bad("--retry-refused applies to the trace workload");
  return {};
}

int run_cluster(const ClusterOptions& o) {
  if (auto st = validate(o); !st) {
    std::cerr << "strata bench cluster: " << st.error().message << "\n";
    return 2;
  }
  install_interrupt_handler();
  TargetOptions counting = o.target;
  auto counter = make_token_counter(counting);
  if (!counter) {
    std::cerr << "strata bench cluster: " << counter.error().message << "\n";
    return 2;
  }
  // A bad trace is an error before any process starts.
  std::vector<TraceRequest> trace;
  if (!o.trace_path.empty()) {
    auto t = load_trace(o.trace_path, o.trace_block_tokens, o.trace_limit);
    if (!t) {
      std::cerr << "strata bench cluster: " << t.error().message << "\n";
      return 2;
    }
    trace = std::move(*t);
  }
  ClusterRun run(o, std::move(*counter), std::move(trace));
  return run.run();
}

}  // namespace strata::bench
