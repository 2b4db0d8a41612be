#include "bench/depth_sweep.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <thread>

#include "bench/kv_events.h"
#include "bench/progress.h"
#include "bench/report.h"
#include "bench/stats.h"
#include "bench/svg_chart.h"
#include "bench/traffic.h"

namespace strata::bench {

namespace {

using json = nlohmann::ordered_json;
using ojson = nlohmann::ordered_json;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool pins(SweepPhase p) {
  return p != SweepPhase::kBaseline;
}

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

// One (phase, depth) measurement.
struct DepthRun {
  SweepPhase phase = SweepPhase::kBaseline;
  int32_t depth = 0;
  bool skipped = false;
  std::string skip_reason;
  json server;  // url, argv, log, capacity

  // Warm-up of turns 0..D.
  int64_t warm_prompt_tokens = 0;
  int64_t warm_completion_tokens = 0;
  double warm_ttft_s = 0;
  double warm_e2e_s = 0;
  int64_t blocks_captured = 0;
  int64_t blocks_expected = 0;
  int64_t blocks_pinned = 0;

  // Flood.
  int64_t capacity_tokens = 0;
  int64_t capacity_pages = 0;
  int64_t page_size = 0;
  int64_t target_evicted_pages = 0;
  int64_t evicted_pages = 0;
  int64_t flood_requests = 0;
  int64_t flood_request_cap = 0;
  int64_t flood_prompt_tokens = 0;
  int64_t flood_cached_tokens = 0;
  double flood_s = 0;
  bool flood_cycled = false;
  int64_t auto_unpinned_blocks = 0;
  int64_t pinned_blocks_after_flood = 0;

  // Turn D+1.
  double ttft_s = kNaN;
  double e2e_s = 0;
  int64_t prompt_tokens = 0;
  int64_t new_tokens = 0;       // the new turn: prompt - (warm prompt + reply + its end token)
  int64_t reusable_tokens = 0;  // prompt - new_tokens
  int64_t cached_tokens = 0;
  CachedTiers cached;

  double cached_fraction() const {
    return reusable_tokens > 0 ? static_cast<double>(cached_tokens) / reusable_tokens : kNaN;
  }
};

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

class DepthSweep {
 public:
  explicit DepthSweep(const DepthSweepOptions& o)
      : o_(o), out_(o.run.out_dir), progress_(stderr, stderr_is_terminal()) {}

  int run();

 private:
  Status prepare();
  Result<DepthRun> run_one(SweepPhase phase, int32_t depth);
  Status reset_cache(const ServerClient& client);
  Status sync_events(const ServerClient& client, KvEventSubscriber& sub);
  Status pin_vip(const ServerClient& client, KvEventSubscriber& sub, DepthRun& r);
  Status flood(const ServerClient& client, DepthRun& r);
  Status measure(const ServerClient& client, const StreamedChat& warm, DepthRun& r);
  std::optional<std::string> tier_unsupported_reason();
  std::string session_id(SweepPhase phase, int32_t depth) const;
  void report_progress(double within_run, const std::string& status);

  std::vector<Check> checks() const;
  Table summary_table() const;
  json results_json(const std::vector<Check>& checks) const;
  Status write_outputs(const std::vector<Check>& checks) const;

  const DepthSweepOptions& o_;
  const std::filesystem::path out_;
  ProgressDisplay progress_;
  std::vector<SweepPhase> phases_;
  std::vector<int32_t> depths_;
  TokenCounter counter_;
  std::shared_ptr<const Conversation> vip_;
  std::unique_ptr<ConversationSource> flood_source_;
  std::string model_;
  json machine_;
  json first_state_;
  std::vector<DepthRun> runs_;
  std::vector<int64_t> pinned_here_;  // what we pinned on a --url server, to unpin
  size_t runs_done_ = 0;
  size_t runs_total_ = 1;
  std::string error_;
};

std::string DepthSweep::session_id(SweepPhase phase, int32_t depth) const {
  return "strata-bench-vip-" + std::to_string(o_.run.seed) + "-" + std::string(phase_name(phase)) +
         "-d" + std::to_string(depth);
}

void DepthSweep::report_progress(double within_run, const std::string& status) {
  const double f = (static_cast<double>(runs_done_) + std::clamp(within_run, 0.0, 1.0)) /
                   static_cast<double>(runs_total_);
  progress_.update(f, status);
}

Status DepthSweep::prepare() {
  for (const std::string& p : o_.phases) {
    auto phase = parse_phase(p);
    if (!phase) return std::unexpected(phase.error());
    if (std::find(phases_.begin(), phases_.end(), *phase) == phases_.end()) {
      phases_.push_back(*phase);
    }
  }
  depths_ = o_.depths;
  std::sort(depths_.begin(), depths_.end());
  depths_.erase(std::unique(depths_.begin(), depths_.end()), depths_.end());
  runs_total_ = std::max<size_t>(1, phases_.size() * depths_.size());

  auto counter = make_token_counter(o_.target);
  if (!counter) return std::unexpected(counter.error());
  counter_ = *counter;
  ConversationShape vip_shape = o_.vip_shape;
  vip_shape.system_min_tokens = vip_shape.system_max_tokens = o_.vip_system_tokens;
  vip_shape.min_turns = vip_shape.max_turns = depths_.back() + 2;
  auto vip = make_conversation(o_.run.seed, "vip", 0, vip_shape, counter_);
  if (!vip) return std::unexpected(vip.error());
  vip_ = std::make_shared<const Conversation>(std::move(*vip));
  // The system prompt as the real tokenizer counts it in one piece.
  if (auto n = counter_(vip_->system); n) {
    auto copy = std::make_shared<Conversation>(*vip_);
    copy->system_tokens = *n;
    vip_ = copy;
  }
  flood_source_ =
      std::make_unique<ConversationSource>(o_.run.seed, "flood", o_.flood_shape, counter_);
  machine_ = machine_info();
  return {};
}

std::optional<std::string> DepthSweep::tier_unsupported_reason() {
  if (o_.target.spawn) {
    if (!serve_supports(o_.target.strata_bin, "--enable-hierarchical-cache")) {
      return "this `strata serve` has no --enable-hierarchical-cache option";
    }
    return std::nullopt;
  }
  auto st = read_cache_state(ServerClient(o_.target.url, o_.target.api_key));
  if (!st) return "cannot read /cache/state: " + st.error().message;
  if (!st->has_host) {
    return "the server at " + o_.target.url +
           " has no host tier (/cache/state host is null): start it with "
           "--enable-hierarchical-cache";
  }
  return std::nullopt;
}

Status DepthSweep::reset_cache(const ServerClient& client) {
  if (!pinned_here_.empty()) {
    auto r = client.post_json("/cache/unpin", json{{"block_hashes", pinned_here_}});
    if (!r) return std::unexpected(r.error());
    pinned_here_.clear();
  }
  auto idle = wait_idle(client, 300);
  if (!idle) return std::unexpected(idle.error());
  if (auto r = client.post_json("/cache/flush", json::object()); !r) {
    return std::unexpected(r.error());
  }
  auto st = read_cache_state(client);
  if (!st) return std::unexpected(st.error());
  if (st->cached_pages > 0 || st->pinned_blocks > 0) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "the cache is not empty after a flush (" + std::to_string(st->cached_pages) +
                          " cached pages, " + std::to_string(st->pinned_blocks) +
                          " pinned blocks): the depth sweep needs a server no one else uses");
  }
  return {};
}

// The subscription reaches the publisher asynchronously (ZeroMQ's slow joiner): send small
// requests until their events arrive, then flush them away.
Status DepthSweep::sync_events(const ServerClient& client, KvEventSubscriber& sub) {
  bool synced = false;
  for (int attempt = 0; attempt < 40 && !synced && !interrupted(); ++attempt) {
    const uint64_t before = sub.batches_received();
    std::string prompt;
    for (int k = 0; k < 12; ++k) {
      prompt +=
          "strata bench event probe " + std::to_string(attempt) + " of " + std::to_string(k) + ". ";
    }
    auto r = client.post_json(
        "/v1/completions",
        json{{"model", model_}, {"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}});
    if (!r) return std::unexpected(r.error());
    synced = sub.wait_batches_above(before, 0.25);
  }
  if (!synced) {
    return make_error(ErrorCode::kTimeout,
                      "no KV events arrived on the subscriber (" + sub.last_error() +
                          "): is the server publishing on the given --kv-events-endpoint?");
  }
  if (auto r = client.post_json("/cache/flush", json::object()); !r) {
    return std::unexpected(r.error());
  }
  sub.wait_quiet(0.3, 5);
  return {};
}

Status DepthSweep::pin_vip(const ServerClient& client, KvEventSubscriber& sub, DepthRun& r) {
  // Pages whose KV the warm-up computed: the prompt and all generated tokens but the last.
  r.blocks_expected = (r.warm_prompt_tokens + r.warm_completion_tokens - 1) / r.page_size;
  sub.wait_quiet(0.3, 10);
  for (int i = 0; i < 50 && static_cast<int64_t>(sub.captured_blocks().size()) < r.blocks_expected;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::vector<int64_t> blocks = sub.captured_blocks();
  r.blocks_captured = static_cast<int64_t>(blocks.size());
  if (blocks.empty()) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "no BlockStored events arrived while the VIP conversation warmed");
  }
  auto pinned = client.post_json("/cache/pin", json{{"block_hashes", blocks}});
  if (!pinned) return std::unexpected(pinned.error());
  r.blocks_pinned = pinned->value("pinned_count", int64_t{0});
  if (!o_.target.spawn) pinned_here_ = blocks;
  return {};
}

Status DepthSweep::flood(const ServerClient& client, DepthRun& r) {
  auto before = read_cache_state(client);
  if (!before) return std::unexpected(before.error());
  r.target_evicted_pages =
      static_cast<int64_t>(std::ceil(o_.flood_factor * static_cast<double>(r.capacity_pages)));
  // What the capacity calls for: the flood first fills the pool, then evicts factor times
  // it; each request adds its new turns and its generated tokens.
  const double per_request =
      flood_source_->mean_new_tokens_per_turn() + static_cast<double>(o_.flood_max_tokens);
  const double needed = static_cast<double>(r.capacity_tokens) * (o_.flood_factor + 1);
  r.flood_request_cap = std::max<int64_t>(
      50, static_cast<int64_t>(std::ceil(needed / per_request * o_.flood_request_cap)));
  TrafficOptions to;
  to.concurrency = o_.flood_concurrency;
  to.max_tokens = o_.flood_max_tokens;
  to.max_requests = r.flood_request_cap;
  to.model = model_;
  TrafficRun traffic(client, *flood_source_, to);
  const double start = monotonic_s();
  traffic.start();
  const std::string label = std::string(phase_name(r.phase)) + " d=" + std::to_string(r.depth);
  while (!traffic.stopping()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (interrupted()) break;
    auto st = read_cache_state(client);
    if (!st) {
      traffic.request_stop();
      return std::unexpected(st.error());
    }
    const int64_t evicted = st->evicted_pages_total - before->evicted_pages_total;
    const double cycles = static_cast<double>(evicted) / static_cast<double>(r.capacity_pages);
    char status[160];
    std::snprintf(status, sizeof(status), "%s: flood %.2f/%.1fx cache cycles, %lld requests",
                  label.c_str(), cycles, o_.flood_factor,
                  static_cast<long long>(traffic.completed()));
    report_progress(0.1 + 0.8 * std::min(1.0, static_cast<double>(evicted) /
                                                  static_cast<double>(r.target_evicted_pages)),
                    status);
    if (evicted >= r.target_evicted_pages) break;
  }
  traffic.request_stop();
  traffic.join();
  if (interrupted()) return make_error(ErrorCode::kFailedPrecondition, "interrupted");
  // Drain: everything the flood sent has finished; the server is idle.
  auto idle = wait_idle(client, 600);
  if (!idle) return std::unexpected(idle.error());
  if (!*idle) {
    return make_error(ErrorCode::kTimeout, "the server did not become idle after the flood");
  }
  r.flood_s = monotonic_s() - start;
  if (traffic.failed() > 0) {
    return make_error(ErrorCode::kFailedPrecondition,
                      std::to_string(traffic.failed()) +
                          " flood requests failed; the first: " + traffic.first_error());
  }
  auto after = read_cache_state(client);
  if (!after) return std::unexpected(after.error());
  r.evicted_pages = after->evicted_pages_total - before->evicted_pages_total;
  r.flood_cycled = r.evicted_pages >= r.target_evicted_pages;
  r.flood_requests = traffic.completed();
  r.auto_unpinned_blocks = after->auto_unpinned_blocks_total - before->auto_unpinned_blocks_total;
  r.pinned_blocks_after_flood = after->pinned_blocks;
  for (const RequestRecord& rec : traffic.records()) {
    r.flood_prompt_tokens += rec.usage.prompt_tokens;
    r.flood_cached_tokens += rec.usage.cached_tokens;
  }
  return {};
}

Status DepthSweep::measure(const ServerClient& client, const StreamedChat& warm, DepthRun& r) {
  const auto d = static_cast<size_t>(r.depth);
  ojson messages = chat_messages(*vip_, d, true);
  messages.push_back(ojson{{"role", "assistant"}, {"content", warm.text}});
  messages.push_back(ojson{{"role", "user"}, {"content", vip_->turns[d + 1].user}});
  ojson body = chat_request(model_, std::move(messages), o_.measure_max_tokens, true);
  body["session_id"] = session_id(r.phase, r.depth);
  auto m = client.stream_chat(body);
  if (!m) return std::unexpected(m.error());
  if (!m->usage.present) {
    return make_error(ErrorCode::kCorrupt, "the measured turn's stream carried no usage");
  }
  r.ttft_s = m->ttft_s;
  r.e2e_s = m->e2e_s;
  r.prompt_tokens = m->usage.prompt_tokens;
  r.cached_tokens = m->usage.cached_tokens;
  r.cached = m->usage.cached;
  // What the conversation had computed before: the warm-up's prompt, its reply and the
  // token that ends the reply. The rest of the prompt is the new turn.
  r.reusable_tokens =
      std::min(r.prompt_tokens, r.warm_prompt_tokens + r.warm_completion_tokens + 1);
  r.new_tokens = r.prompt_tokens - r.reusable_tokens;
  return {};
}

Result<DepthRun> DepthSweep::run_one(SweepPhase phase, int32_t depth) {
  DepthRun r;
  r.phase = phase;
  r.depth = depth;
  const std::string label = std::string(phase_name(phase)) + " d=" + std::to_string(depth);
  if (phase == SweepPhase::kTierPinned) {
    if (auto reason = tier_unsupported_reason()) {
      r.skipped = true;
      r.skip_reason = *reason;
      return r;
    }
  }
  std::vector<std::string> extra;
  if (phase == SweepPhase::kTierPinned && o_.target.spawn) {
    extra = {"--enable-hierarchical-cache", "--hicache-ratio", format_number(o_.hicache_ratio)};
  }
  report_progress(0, label + ": starting the server");
  const auto log =
      out_ / "logs" /
      ("depth-sweep-" + std::string(phase_name(phase)) + "-d" + std::to_string(depth) + ".log");
  auto server = open_server(o_.target, extra, log, pins(phase));
  if (!server) return std::unexpected(server.error());
  const ServerClient client = server->client();
  if (model_.empty()) {
    auto id = served_model_id(client);
    if (!id) return std::unexpected(id.error());
    model_ = *id;
  }
  auto state = read_cache_state(client);
  if (!state) return std::unexpected(state.error());
  if (first_state_.is_null()) first_state_ = state->raw;
  if (phase == SweepPhase::kTierPinned && !state->has_host) {
    r.skipped = true;
    r.skip_reason = "the server started with --enable-hierarchical-cache shows no host tier";
    return r;
  }
  r.capacity_tokens = state->capacity_tokens;
  r.capacity_pages = state->capacity_pages;
  r.page_size = state->page_size;
  r.server = {{"url", server->url},
              {"argv", server->argv()},
              {"log", server->log_path.string()},
              {"cache_state_at_start", state->raw}};
  if (auto st = reset_cache(client); !st) return std::unexpected(st.error());

  std::unique_ptr<KvEventSubscriber> sub;
  if (pins(phase)) {
    if (server->kv_events_endpoint.empty()) {
      return make_error(ErrorCode::kInvalidArgument,
                        "the pinned phases need the server's KV events: give "
                        "--kv-events-endpoint with --url");
    }
    auto s = KvEventSubscriber::connect(server->kv_events_endpoint);
    if (!s) return std::unexpected(s.error());
    sub = std::move(*s);
    if (auto st = sync_events(client, *sub); !st) return std::unexpected(st.error());
    sub->start_capture();
  }

  report_progress(0.02, label + ": warming the VIP conversation");
  const auto d = static_cast<size_t>(depth);
  ojson warm_body = chat_request(model_, chat_messages(*vip_, d, true),
                                 static_cast<int32_t>(vip_->turns[d].assistant_tokens), true);
  warm_body["session_id"] = session_id(phase, depth);
  auto warm = client.stream_chat(warm_body);
  if (!warm) return std::unexpected(warm.error());
  r.warm_prompt_tokens = warm->usage.prompt_tokens;
  r.warm_completion_tokens = warm->usage.completion_tokens;
  r.warm_ttft_s = warm->ttft_s;
  r.warm_e2e_s = warm->e2e_s;
  if (sub) {
    if (auto st = pin_vip(client, *sub, r); !st) return std::unexpected(st.error());
  }
  report_progress(0.1, label + ": flood");
  if (auto st = flood(client, r); !st) return std::unexpected(st.error());
  report_progress(0.9, label + ": measuring turn " + std::to_string(depth + 1));
  if (auto st = measure(client, *warm, r); !st) return std::unexpected(st.error());
  if (auto after = read_cache_state(client); after) r.server["cache_state_at_end"] = after->raw;
  if (!o_.target.spawn) {
    if (auto st = reset_cache(client); !st) return std::unexpected(st.error());
  } else if (server->process) {
    (void)server->process->stop();
  }
  return r;
}

std::vector<Check> DepthSweep::checks() const {
  std::vector<Check> out;
  for (const DepthRun& r : runs_) {
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
  if (!o_.run.check) return out;
  for (const DepthRun& r : runs_) {
    if (r.skipped) continue;
    const std::string where =
        std::string(phase_name(r.phase)) + " depth " + std::to_string(r.depth);
    const double f = r.cached_fraction();
    const std::string measured = format_count(r.cached_tokens) + " of " +
                                 format_count(r.reusable_tokens) + " reusable tokens cached (" +
                                 format_percent(f) + ")";
    if (r.phase == SweepPhase::kBaseline && r.depth > 0) {
      out.push_back(Check{"baseline evicted (" + where + ")", f <= o_.baseline_max_cached,
                          measured + ", target <= " + format_percent(o_.baseline_max_cached)});
    }
    if (pins(r.phase)) {
      out.push_back(Check{"pinned prefix kept (" + where + ")", f >= o_.pinned_min_cached,
                          measured + ", target >= " + format_percent(o_.pinned_min_cached)});
    }
  }
  return out;
}

Table DepthSweep::summary_table() const {
  std::map<std::pair<SweepPhase, int32_t>, const DepthRun*> at;
  std::vector<SweepPhase> shown;
  for (const DepthRun& r : runs_) {
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
    if (pins(p)) t.header.push_back(short_name(p) + " blocks pinned");
  }
  for (int32_t d : depths_) {
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
      if (pins(p)) row.push_back(get(p) ? format_count(get(p)->blocks_pinned) : "-");
    }
    t.rows.push_back(std::move(row));
  }
  return t;
}

json DepthSweep::results_json(const std::vector<Check>& checks) const {
  json runs = json::array();
  for (const DepthRun& r : runs_) runs.push_back(run_json(r));
  json phase_stats = json::object();
  for (SweepPhase p : phases_) {
    std::vector<double> ttfts;
    for (const DepthRun& r : runs_) {
      if (r.phase == p && !r.skipped) ttfts.push_back(r.ttft_s);
    }
    if (ttfts.empty()) continue;
    const double ratio = max_over_min(ttfts);
    phase_stats[std::string(phase_name(p))] = {
        {"ttft_max_over_min", std::isfinite(ratio) ? json(ratio) : json(nullptr)}};
  }
  json speedups = json::array();
  for (const DepthRun& r : runs_) {
    if (r.skipped || r.phase == SweepPhase::kBaseline) continue;
    for (const DepthRun& b : runs_) {
      if (b.phase == SweepPhase::kBaseline && !b.skipped && b.depth == r.depth) {
        speedups.push_back({{"phase", phase_name(r.phase)},
                            {"depth", r.depth},
                            {"ttft_speedup_vs_baseline", b.ttft_s / r.ttft_s}});
      }
    }
  }
  json params = {{"depths", depths_},
                 {"phases", o_.phases},
                 {"flood_concurrency", o_.flood_concurrency},
                 {"flood_factor", o_.flood_factor},
                 {"flood_max_tokens", o_.flood_max_tokens},
                 {"flood_request_cap_factor", o_.flood_request_cap},
                 {"vip_system_tokens", o_.vip_system_tokens},
                 {"measure_max_tokens", o_.measure_max_tokens},
                 {"hicache_ratio", o_.hicache_ratio},
                 {"vip_shape", shape_json(o_.vip_shape)},
                 {"flood_shape", shape_json(o_.flood_shape)},
                 {"seed", o_.run.seed},
                 {"quick", o_.run.quick},
                 {"check", o_.run.check},
                 {"baseline_max_cached", o_.baseline_max_cached},
                 {"pinned_min_cached", o_.pinned_min_cached},
                 {"url", o_.target.url},
                 {"spawn", o_.target.spawn},
                 {"model_dir", o_.target.model_dir},
                 {"server_args", split_args(o_.target.server_args)}};
  json vip_turns = json::array();
  if (vip_) {
    for (const Turn& t : vip_->turns) {
      vip_turns.push_back(
          {{"user_tokens", t.user_tokens}, {"assistant_tokens", t.assistant_tokens}});
    }
  }
  return json{{"scenario", "depth-sweep"},
              {"finished_at", utc_timestamp()},
              {"parameters", params},
              {"machine", machine_},
              {"model", model_},
              {"server_cache_state", first_state_},
              {"vip", {{"system_tokens", vip_ ? vip_->system_tokens : 0}, {"turns", vip_turns}}},
              {"runs", runs},
              {"phase_stats", phase_stats},
              {"speedups", speedups},
              {"checks", to_json(checks)},
              {"error", error_.empty() ? json(nullptr) : json(error_)},
              {"passed", error_.empty() && all_passed(checks)}};
}

Status DepthSweep::write_outputs(const std::vector<Check>& checks) const {
  if (auto st = write_file(out_ / "results.json", results_json(checks).dump(2) + "\n"); !st) {
    return st;
  }
  LineChart ttft{.title = "Depth sweep: TTFT of turn D+1 after the flood",
                 .x_label = "conversation depth D (turns warmed)",
                 .y_label = "TTFT (ms)"};
  LineChart cached{.title = "Depth sweep: cached share of the reusable prompt",
                   .x_label = "conversation depth D (turns warmed)",
                   .y_label = "cached tokens / (prompt - new turn) (%)"};
  for (SweepPhase p : phases_) {
    ChartSeries t{std::string(phase_name(p)), {}, {}};
    ChartSeries c{std::string(phase_name(p)), {}, {}};
    for (const DepthRun& r : runs_) {
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
  if (auto st = write_file(out_ / "depth_sweep_ttft.svg", render_line_chart(ttft)); !st) return st;
  if (auto st = write_file(out_ / "depth_sweep_cached.svg", render_line_chart(cached)); !st) {
    return st;
  }
  std::string md = "Model `" + model_ + "`; machine " + machine_line(machine_) + ".\n\n";
  md += to_markdown(summary_table()) + "\n";
  for (SweepPhase p : phases_) {
    std::vector<double> ttfts;
    for (const DepthRun& r : runs_) {
      if (r.phase == p && !r.skipped) ttfts.push_back(r.ttft_s);
    }
    if (!ttfts.empty()) {
      md += "- " + std::string(phase_name(p)) + ": TTFT max/min across depths " +
            format_ratio(max_over_min(ttfts)) + "\n";
    }
  }
  for (const DepthRun& r : runs_) {
    if (r.skipped) {
      md += "- " + std::string(phase_name(r.phase)) + " depth " + std::to_string(r.depth) +
            " skipped: " + r.skip_reason + "\n";
    }
  }
  md += "\nChecks:\n\n";
  for (const Check& c : checks) {
    md += std::string("- ") + (c.passed ? "PASS " : "**FAIL** ") + c.name + ": " + c.detail + "\n";
  }
  return write_file(out_ / "summary.md", md);
}

int DepthSweep::run() {
  if (auto st = prepare(); !st) {
    std::cerr << "strata bench depth-sweep: " << st.error().message << "\n";
    return 2;
  }
  progress_.message("depth-sweep: VIP system prompt " + format_count(vip_->system_tokens) +
                    " tokens, depths " + json(depths_).dump() + ", " +
                    std::to_string(phases_.size()) + " phases; results in " + out_.string());
  std::optional<std::string> tier_skip;
  for (SweepPhase phase : phases_) {
    for (int32_t depth : depths_) {
      if (interrupted()) break;
      Result<DepthRun> r = make_error(ErrorCode::kInternal, "not run");
      if (phase == SweepPhase::kTierPinned && tier_skip) {
        DepthRun s;
        s.phase = phase;
        s.depth = depth;
        s.skipped = true;
        s.skip_reason = *tier_skip;
        r = s;
      } else {
        r = run_one(phase, depth);
      }
      if (!r) {
        error_ = std::string(phase_name(phase)) + " depth " + std::to_string(depth) + ": " +
                 r.error().message;
        break;
      }
      if (r->skipped) {
        if (phase == SweepPhase::kTierPinned) tier_skip = r->skip_reason;
        progress_.message(std::string(phase_name(phase)) + " d=" + std::to_string(depth) +
                          " skipped: " + r->skip_reason);
      } else {
        progress_.message(
            std::string(phase_name(phase)) + " d=" + std::to_string(depth) + ": TTFT " +
            format_ms(r->ttft_s) + ", cached " + format_percent(r->cached_fraction()) + " of " +
            format_count(r->reusable_tokens) + " reusable (" + format_count(r->prompt_tokens) +
            " prompt), flood " + format_count(r->flood_requests) + " requests evicted " +
            format_count(r->evicted_pages) + " pages in " + format_duration(r->flood_s));
      }
      runs_.push_back(std::move(*r));
      ++runs_done_;
      (void)write_outputs(checks());  // partial results survive a later failure
    }
    if (!error_.empty() || interrupted()) break;
  }
  progress_.finish();
  if (!pinned_here_.empty()) {
    // A run that failed on a --url server leaves its pins there otherwise.
    (void)ServerClient(o_.target.url, o_.target.api_key)
        .post_json("/cache/unpin", json{{"block_hashes", pinned_here_}});
  }
  if (interrupted() && error_.empty()) error_ = "interrupted";
  const std::vector<Check> all = checks();
  if (auto st = write_outputs(all); !st) {
    std::cerr << "strata bench depth-sweep: " << st.error().message << "\n";
    return 2;
  }
  std::cout << "\ndepth-sweep on " << model_ << " (" << machine_line(machine_) << ")\n"
            << to_text(summary_table());
  for (SweepPhase p : phases_) {
    std::vector<double> ttfts;
    for (const DepthRun& r : runs_) {
      if (r.phase == p && !r.skipped) ttfts.push_back(r.ttft_s);
    }
    if (!ttfts.empty()) {
      std::cout << phase_name(p) << ": TTFT max/min across depths "
                << format_ratio(max_over_min(ttfts)) << "\n";
    }
  }
  std::cout << "\n"
            << format_checks(all) << "results: " << (out_ / "results.json").string() << "\n";
  if (!error_.empty()) {
    std::cerr << "strata bench depth-sweep: " << error_ << "\n";
    return 2;
  }
  return all_passed(all) ? 0 : 1;
}

}  // namespace

std::string_view phase_name(SweepPhase p) {
  switch (p) {
    case SweepPhase::kBaseline:
      return "baseline";
    case SweepPhase::kPinned:
      return "pinned";
    case SweepPhase::kTierPinned:
      return "tier-pinned";
  }
  return "unknown";
}

Result<SweepPhase> parse_phase(std::string_view name) {
  if (name == "baseline") return SweepPhase::kBaseline;
  if (name == "pinned") return SweepPhase::kPinned;
  if (name == "tier-pinned") return SweepPhase::kTierPinned;
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown phase '" + std::string(name) + "' (baseline, pinned, tier-pinned)");
}

void apply_quick(DepthSweepOptions& o) {
  o.depths = {0, 2};
  o.phases = {"baseline", "pinned", "tier-pinned"};
  o.vip_system_tokens = 1800;
  o.vip_shape.user_min_tokens = 30;
  o.vip_shape.user_max_tokens = 80;
  o.vip_shape.assistant_min_tokens = 30;
  o.vip_shape.assistant_max_tokens = 80;
  o.flood_shape = ConversationShape{.system_min_tokens = 100,
                                    .system_max_tokens = 200,
                                    .user_min_tokens = 30,
                                    .user_max_tokens = 80,
                                    .assistant_min_tokens = 30,
                                    .assistant_max_tokens = 80,
                                    .min_turns = 3,
                                    .max_turns = 6};
  o.flood_concurrency = 2;
  o.flood_max_tokens = 4;
  o.measure_max_tokens = 4;
  o.run.check = true;
}

Status validate(const DepthSweepOptions& o) {
  if (auto st = validate(o.target); !st) return st;
  if (o.run.out_dir.empty()) return make_error(ErrorCode::kInvalidArgument, "--out is required");
  if (o.depths.empty()) return make_error(ErrorCode::kInvalidArgument, "--depths is empty");
  for (int32_t d : o.depths) {
    if (d < 0 || d > 1000) {
      return make_error(ErrorCode::kInvalidArgument,
                        "--depths must be in [0, 1000], got " + std::to_string(d));
    }
  }
  if (o.phases.empty()) return make_error(ErrorCode::kInvalidArgument, "--phases is empty");
  for (const std::string& p : o.phases) {
    if (auto ph = parse_phase(p); !ph) return std::unexpected(ph.error());
  }
  if (o.flood_concurrency < 1) {
    return make_error(ErrorCode::kInvalidArgument, "--flood-concurrency must be >= 1");
  }
  if (!(o.flood_factor > 0)) {
    return make_error(ErrorCode::kInvalidArgument, "--flood-factor must be > 0");
  }
  if (!(o.flood_request_cap >= 1)) {
    return make_error(ErrorCode::kInvalidArgument, "--flood-request-cap must be >= 1");
  }
  if (o.flood_max_tokens < 1 || o.measure_max_tokens < 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      "--flood-max-tokens and --measure-max-tokens must be >= 1");
  }
  if (o.vip_system_tokens < 16) {
    return make_error(ErrorCode::kInvalidArgument, "--vip-system-tokens must be >= 16");
  }
  if (!(o.hicache_ratio > 0)) {
    return make_error(ErrorCode::kInvalidArgument, "--hicache-ratio must be > 0");
  }
  if (auto st = validate(o.vip_shape); !st) return st;
  if (auto st = validate(o.flood_shape); !st) return st;
  return {};
}

int run_depth_sweep(const DepthSweepOptions& o) {
  if (auto st = validate(o); !st) {
    std::cerr << "strata bench depth-sweep: " << st.error().message << "\n";
    return 2;
  }
  install_interrupt_handler();
  DepthSweep sweep(o);
  return sweep.run();
}

}  // namespace strata::bench
