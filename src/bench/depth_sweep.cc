// Running a depth sweep (depth_sweep.h): the options' checks and quick configuration, and
// the runner that starts the servers, warms the VIP conversation, pins it, floods the cache
// and measures the next turn. What it records and writes out is depth_sweep_results.h.
#include "bench/depth_sweep.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <thread>

#include "bench/depth_sweep_results.h"
#include "bench/kv_events.h"
#include "bench/progress.h"
#include "bench/report.h"
#include "bench/stats.h"
#include "bench/svg_chart.h"  // format_number
#include "bench/traffic.h"

namespace strata::bench {

namespace {

using json = nlohmann::ordered_json;
using ojson = nlohmann::ordered_json;

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

  const DepthSweepOptions& o_;
  const std::filesystem::path out_;
  ProgressDisplay progress_;
  SweepRecord record_;  // what the runs measured; depth_sweep_results.h writes it out
  TokenCounter counter_;
  std::unique_ptr<ConversationSource> flood_source_;
  std::vector<int64_t> pinned_here_;  // what we pinned on a --url server, to unpin
  size_t runs_done_ = 0;
  size_t runs_total_ = 1;
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
    if (std::find(record_.phases.begin(), record_.phases.end(), *phase) == record_.phases.end()) {
      record_.phases.push_back(*phase);
    }
  }
  record_.depths = o_.depths;
  std::sort(record_.depths.begin(), record_.depths.end());
  record_.depths.erase(std::unique(record_.depths.begin(), record_.depths.end()),
                       record_.depths.end());
  runs_total_ = std::max<size_t>(1, record_.phases.size() * record_.depths.size());

  auto counter = make_token_counter(o_.target);
  if (!counter) return std::unexpected(counter.error());
  counter_ = *counter;
  ConversationShape vip_shape = o_.vip_shape;
  vip_shape.system_min_tokens = vip_shape.system_max_tokens = o_.vip_system_tokens;
  vip_shape.min_turns = vip_shape.max_turns = record_.depths.back() + 2;
  auto vip = make_conversation(o_.run.seed, "vip", 0, vip_shape, counter_);
  if (!vip) return std::unexpected(vip.error());
  record_.vip = std::make_shared<const Conversation>(std::move(*vip));
  // The system prompt as the real tokenizer counts it in one piece.
  if (auto n = counter_(record_.vip->system); n) {
    auto copy = std::make_shared<Conversation>(*record_.vip);
    copy->system_tokens = *n;
    record_.vip = copy;
  }
  flood_source_ =
      std::make_unique<ConversationSource>(o_.run.seed, "flood", o_.flood_shape, counter_);
  record_.machine = machine_info();
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
        json{{"model", record_.model}, {"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}});
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
  to.model = record_.model;
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
  ojson messages = chat_messages(*record_.vip, d, true);
  messages.push_back(ojson{{"role", "assistant"}, {"content", warm.text}});
  messages.push_back(ojson{{"role", "user"}, {"content", record_.vip->turns[d + 1].user}});
  ojson body = chat_request(record_.model, std::move(messages), o_.measure_max_tokens, true);
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
  auto server = open_server(o_.target, extra, log, pins_vip(phase));
  if (!server) return std::unexpected(server.error());
  const ServerClient client = server->client();
  if (record_.model.empty()) {
    auto id = served_model_id(client);
    if (!id) return std::unexpected(id.error());
    record_.model = *id;
  }
  auto state = read_cache_state(client);
  if (!state) return std::unexpected(state.error());
  if (record_.first_state.is_null()) record_.first_state = state->raw;
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
  if (pins_vip(phase)) {
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
  ojson warm_body =
      chat_request(record_.model, chat_messages(*record_.vip, d, true),
                   static_cast<int32_t>(record_.vip->turns[d].assistant_tokens), true);
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

int DepthSweep::run() {
  if (auto st = prepare(); !st) {
    std::cerr << "strata bench depth-sweep: " << st.error().message << "\n";
    return 2;
  }
  progress_.message("depth-sweep: VIP system prompt " + format_count(record_.vip->system_tokens) +
                    " tokens, depths " + json(record_.depths).dump() + ", " +
                    std::to_string(record_.phases.size()) + " phases; results in " + out_.string());
  std::optional<std::string> tier_skip;
  for (SweepPhase phase : record_.phases) {
    for (int32_t depth : record_.depths) {
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
        record_.error = std::string(phase_name(phase)) + " depth " + std::to_string(depth) + ": " +
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
      record_.runs.push_back(std::move(*r));
      ++runs_done_;
      (void)write_sweep_outputs(
          o_, record_, sweep_checks(o_, record_));  // partial results survive a later failure
    }
    if (!record_.error.empty() || interrupted()) break;
  }
  progress_.finish();
  if (!pinned_here_.empty()) {
    // A run that failed on a --url server leaves its pins there otherwise.
    (void)ServerClient(o_.target.url, o_.target.api_key)
        .post_json("/cache/unpin", json{{"block_hashes", pinned_here_}});
  }
  if (interrupted() && record_.error.empty()) record_.error = "interrupted";
  const std::vector<Check> all = sweep_checks(o_, record_);
  if (auto st = write_sweep_outputs(o_, record_, all); !st) {
    std::cerr << "strata bench depth-sweep: " << st.error().message << "\n";
    return 2;
  }
  std::cout << "\ndepth-sweep on " << record_.model << " (" << machine_line(record_.machine)
            << ")\n"
            << to_text(sweep_summary_table(record_));
  for (SweepPhase p : record_.phases) {
    const std::vector<double> ttfts = phase_ttfts(record_, p);
    if (!ttfts.empty()) {
      std::cout << phase_name(p) << ": TTFT max/min across depths "
                << format_ratio(max_over_min(ttfts)) << "\n";
    }
  }
  std::cout << "\n"
            << format_checks(all) << "results: " << (out_ / "results.json").string() << "\n";
  if (!record_.error.empty()) {
    std::cerr << "strata bench depth-sweep: " << record_.error << "\n";
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
