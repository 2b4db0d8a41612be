// `strata bench tiers`: what each tier of the hierarchical cache saves, measured on the
// engine itself (no HTTP in the way).
//
//  - TTFT of a --prompt-tokens prompt (default 3,000) computed cold, then served from the
//    device pool, from the host pool (device copy evicted), from a file store and from
//    Redis (fresh engines on the same store, prefetch wait_complete).
//  - The tool-call pause (issue 7): a --session-tokens session (default 16K) whose next
//    turn comes (a) right away (never left the device), (b) after tool_start, a flood
//    that fills the device pool --flood-factor times, and tool_end, (c) after the same
//    flood without tool_start/tool_end; and, after tool_end, how long until the session is
//    RUNNABLE again.
//
// --device cuda runs the engines on the GPU's forward pass (cuda/gpu_model.h): the device
// pool in GPU memory, the host pool page-locked, every copy on the GPU's copy streams
// (issue 31's TTFT-by-tier and tool_end figures; scripts/gpu-check.sh runs it).
#include "bench/tiers.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "cuda/cuda_device.h"
#include "cuda/gpu_model.h"
#include "engine/engine.h"
#include "model/make_model.h"
#include "model/model.h"

namespace strata::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct TierBenchOptions {
  std::string model_dir;
  std::string device = "cpu";         // cpu | cuda
  std::string io_backend = "direct";  // --hicache-io-backend (cuda)
  int threads = 2;
  std::string weight_dtype = "bf16";
  std::string kv_dtype = "bf16";
  int32_t prompt_tokens = 3000;
  int32_t session_tokens = 16384;
  int32_t device_tokens = 24576;
  double flood_factor = 3.0;
  int32_t redis_port = 0;  // 0: skip Redis
  std::string store_dir = "/tmp/strata-bench-tiers-store";
  bool skip_session = false;
  bool json = false;
  std::string load_overlap = "layer";  // --hicache-load-overlap of the engines
};

std::vector<int32_t> random_tokens(int32_t n, uint32_t seed, int32_t vocab) {
  std::mt19937 rng(seed);
  std::vector<int32_t> out(static_cast<size_t>(n));
  for (auto& t : out) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab - 100)) + 50;
  return out;
}

struct Timed {
  double ttft_s = 0;
  RequestUsage usage;
};

// Submits one greedy request and measures the time to its first token.
Result<Timed> timed_request(Engine& e, std::vector<int32_t> prompt, int32_t max_tokens,
                            std::string session = {}) {
  RequestSpec spec;
  spec.prompt = std::move(prompt);
  spec.sampling.temperature = 0;
  spec.max_tokens = max_tokens;
  spec.session_id = std::move(session);
  const auto t0 = Clock::now();
  auto stream = e.submit(std::move(spec));
  if (!stream) return std::unexpected(stream.error());
  Timed out;
  bool first = false;
  for (;;) {
    for (StreamItem& item : (*stream)->wait(50)) {
      if (!first && (!item.tokens.empty() || item.finish)) {
        out.ttft_s = std::chrono::duration<double>(Clock::now() - t0).count();
        first = true;
      }
      if (item.finish) {
        if (*item.finish == FinishReason::kError) {
          return make_error(ErrorCode::kInternal, "request failed: " + item.error);
        }
        out.usage = item.usage;
        return out;
      }
    }
  }
}

void settle(Engine& e) {
  for (int i = 0; i < 100000; ++i) {
    auto state = e.cache().state().get();
    const bool copying = state && state->host && state->tree.io_pending_nodes > 0;
    if (!copying && e.counters().running == 0 && e.counters().waiting == 0) {
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void wait_storage_written(Engine& e, uint64_t pages) {
  for (int i = 0; i < 30000 && e.counters().storage_pages_written < pages; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int run_tier_bench(const TierBenchOptions& o) {
  auto fail = [](const std::string& m) {
    std::cerr << "strata bench tiers: " << m << "\n";
    return 1;
  };
  if (o.device == "cuda") {  // before the weights load: a machine without a GPU says so at once
    if (auto device = cuda::probe_device(0); !device) {
      return fail("--device cuda: " + device.error().message);
    }
  }
  ModelOptions mo{.num_threads = o.threads};
  if (o.weight_dtype == "bf16") mo.weight_dtype = WeightDtype::kBF16;
  if (o.weight_dtype == "f32") mo.weight_dtype = WeightDtype::kF32;
  auto model = o.model_dir.empty()
                   ? make_preset_model(ModelPreset::kBench, Architecture::kQwen3, 1, mo)
                   : Model::load(o.model_dir, mo);
  if (!model) return fail(model.error().message);
  auto kv = parse_kv_dtype(o.kv_dtype);
  if (!kv) return fail(kv.error().message);
  const int32_t vocab = (*model)->config().vocab_size;
  auto io_backend = parse_copy_path(o.io_backend);
  if (!io_backend) return fail(io_backend.error().message);
  // The model every engine runs on: the CPU engine's, or its weights on the GPU with a
  // device pool of --device-tokens (the engines come one after another, so they share it).
  ForwardModel* forward_model = model->get();
  std::unique_ptr<ForwardModel> gpu;
  const EngineOptions defaults;
  if (o.device == "cuda") {
    auto device = cuda::probe_device(0);
    if (!device) return fail("--device cuda: " + device.error().message);
    const cuda::GpuModelOptions g =
        cuda::gpu_options_for_engine(defaults.page_size, o.device_tokens,
                                     defaults.max_running_requests, defaults.chunked_prefill_size);
    auto made = cuda::GpuModel::create((*model)->config(), (*model)->weights(), g);
    if (!made) return fail("--device cuda: " + made.error().message);
    gpu = std::move(*made);
    forward_model = gpu.get();
    std::printf("forward pass on %s\n", cuda::describe(*device).c_str());
  } else if (o.device != "cpu") {
    return fail("--device must be cpu or cuda");
  }
  auto overlap = parse_load_overlap(o.load_overlap);
  if (!overlap) return fail(overlap.error().message);

  // A fresh namespace per run: a store left over from an earlier run must not turn the
  // cold measurement into a storage hit.
  const std::string name_space =
      "bench-tiers-" + std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
  auto engine_options = [&](const std::string& backend, int32_t device_tokens) {
    EngineOptions eo;
    eo.kv_cache_tokens = device_tokens / defaults.page_size * defaults.page_size;
    eo.kv_dtype = *kv;
    eo.hicache.enabled = true;
    eo.hicache.io_backend = *io_backend;
    eo.hicache.ratio = 4.0;
    eo.hicache.storage_backend = backend;
    eo.hicache.storage_namespace = name_space;
    eo.hicache.prefetch_policy = PrefetchPolicy::kWaitComplete;
    eo.hicache.load_overlap = *overlap;
    if (backend == "file") {
      eo.hicache.storage_extra_config = nlohmann::json{{"dir", o.store_dir}}.dump();
    } else if (backend == "redis") {
      eo.hicache.storage_extra_config = nlohmann::json{{"port", o.redis_port}}.dump();
    }
    return eo;
  };
  nlohmann::json report = {{"prompt_tokens", o.prompt_tokens}, {"device", o.device},
                           {"io_backend", o.io_backend},       {"kv_dtype", o.kv_dtype},
                           {"weight_dtype", o.weight_dtype},   {"threads", o.threads},
                           {"load_overlap", o.load_overlap}};
  auto print = [&](const std::string& what, const Timed& t) {
    std::printf("%-44s TTFT %8.1f ms   cached device %6d host %6d storage %6d\n", what.c_str(),
                t.ttft_s * 1e3, t.usage.cached_device, t.usage.cached_host, t.usage.cached_storage);
    std::fflush(stdout);
    report["ttft"][what] = {{"ttft_ms", t.ttft_s * 1e3},
                            {"cached_device", t.usage.cached_device},
                            {"cached_host", t.usage.cached_host},
                            {"cached_storage", t.usage.cached_storage}};
  };

  const std::vector<int32_t> prompt = random_tokens(o.prompt_tokens, 7, vocab);
  std::filesystem::remove_all(o.store_dir);
  std::vector<std::string> backends = {"file"};
  if (o.redis_port > 0) backends.push_back("redis");
  {
    auto e = Engine::create(forward_model, engine_options(backends.back(), o.device_tokens), {});
    if (!e) return fail(e.error().message);
    auto warm = timed_request(**e, random_tokens(64, 99, vocab), 1);  // first-touch costs
    auto cold = timed_request(**e, prompt, 1);
    if (!cold) return fail(cold.error().message);
    print("cold prefill", *cold);
    settle(**e);
    // The same prompt again is a full hit (its last position's logits are remembered:
    // docs/full-hit.md), whatever tier holds its KV; a next turn (the prompt and 64 new
    // tokens) computes over the restored prefix, which is where the tiers differ.
    auto next_turn = [&](uint32_t seed) {
      std::vector<int32_t> t = prompt;
      const std::vector<int32_t> more = random_tokens(64, seed, vocab);
      t.insert(t.end(), more.begin(), more.end());
      return t;
    };
    auto dev = timed_request(**e, prompt, 1);
    if (!dev) return fail(dev.error().message);
    print("from the device pool", *dev);
    settle(**e);
    auto dev_turn = timed_request(**e, next_turn(21), 1);
    if (!dev_turn) return fail(dev_turn.error().message);
    print("  a next turn (+64 tokens), device", *dev_turn);
    settle(**e);
    (*e)->cache().evict_lru(int64_t{1} << 30).get();  // demote all
    settle(**e);
    auto host = timed_request(**e, prompt, 1);
    if (!host) return fail(host.error().message);
    print("from the host pool (device copy evicted)", *host);
    settle(**e);
    (*e)->cache().evict_lru(int64_t{1} << 30).get();
    settle(**e);
    auto host_turn = timed_request(**e, next_turn(22), 1);
    if (!host_turn) return fail(host_turn.error().message);
    print("  a next turn (+64 tokens), host", *host_turn);
  }
  for (const std::string& backend : backends) {
    {
      // Fill the store (the Redis store was filled above; the file store needs a run).
      auto e = Engine::create(forward_model, engine_options(backend, o.device_tokens), {});
      if (!e) return fail(e.error().message);
      if (backend == "file") {
        auto r = timed_request(**e, prompt, 1);
        if (!r) return fail(r.error().message);
      }
      settle(**e);
      wait_storage_written(**e,
                           backend == "file" ? static_cast<uint64_t>(o.prompt_tokens / 16 - 1) : 0);
    }
    auto e = Engine::create(forward_model, engine_options(backend, o.device_tokens), {});
    if (!e) return fail(e.error().message);
    auto warm = timed_request(**e, random_tokens(64, 98, vocab), 1);
    auto st = timed_request(**e, prompt, 1);
    if (!st) return fail(st.error().message);
    print("from storage: " + backend + " (fresh engine)", *st);
  }

  if (!o.skip_session) {
    // Issue 7: a long agent session paused while other traffic cycles the device pool.
    const std::vector<int32_t> turn1 = random_tokens(o.session_tokens, 11, vocab);
    const int64_t flood_tokens = static_cast<int64_t>(o.flood_factor * o.device_tokens);
    auto next_turn = [&](const std::vector<int32_t>& generated) {
      std::vector<int32_t> t = turn1;
      t.insert(t.end(), generated.begin(), generated.end());
      auto more = random_tokens(64, 12, vocab);
      t.insert(t.end(), more.begin(), more.end());
      return t;
    };
    for (const std::string mode :
         {"never left the device", "tool_start/tool_end", "no offload (device pool only)"}) {
      EngineOptions eo = engine_options("", o.device_tokens);
      // Without tool sessions the paused conversation is just more LRU data: on a device
      // pool alone the flood evicts it and the next turn recomputes it.
      eo.hicache.enabled = std::string(mode) != "no offload (device pool only)";
      auto e = Engine::create(forward_model, eo, {});
      if (!e) return fail(e.error().message);
      auto first = timed_request(**e, turn1, 1, "agent");
      if (!first) return fail(first.error().message);
      settle(**e);
      const std::string m(mode);
      uint64_t epoch = 0;
      if (m == "tool_start/tool_end") {
        auto s = (*e)->cache().tool_start("agent").get();
        if (!s) return fail(s.error().message);
        epoch = s->epoch;
        settle(**e);
      }
      if (m != "never left the device") {
        for (int64_t done = 0, i = 0; done < flood_tokens; ++i) {
          auto r =
              timed_request(**e, random_tokens(2048, 1000 + static_cast<uint32_t>(i), vocab), 1);
          if (!r) return fail(r.error().message);
          done += 2048;
        }
        settle(**e);
      }
      if (m == "tool_start/tool_end") {
        const auto t0 = Clock::now();
        auto s = (*e)->cache().tool_end("agent", epoch).get();
        if (!s) return fail(s.error().message);
        bool runnable = s->state == ToolSessionState::kRunnable;
        for (int i = 0; i < 100000 && !runnable; ++i) {
          auto v = (*e)->cache().kv_meta("agent").get();
          runnable = v && v->state == ToolSessionState::kRunnable;
          if (!runnable) std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        const double ms = std::chrono::duration<double>(Clock::now() - t0).count() * 1e3;
        std::printf("%-44s %8.1f ms (%lld tokens back on the device)\n", "tool_end to RUNNABLE", ms,
                    static_cast<long long>(s->moved_tokens));
        report["tool_end_to_runnable_ms"] = ms;
      }
      auto t = timed_request(**e, next_turn({}), 1, "agent");
      if (!t) return fail(t.error().message);
      print("session " + std::to_string(o.session_tokens) + ": " + m, *t);
    }
  }
  if (o.json) std::cout << report.dump() << "\n";
  return 0;
}

}  // namespace

void add_bench_tiers(CLI::App& bench, int& exit_code) {
  auto o = std::make_shared<TierBenchOptions>();
  CLI::App* cmd = bench.add_subcommand(
      "tiers", "TTFT of a prompt restored from each cache tier, and of a paused tool session");
  cmd->add_option("--model", o->model_dir, "Model folder (default: the bench preset, Qwen3)");
  cmd->add_option("--device", o->device, "Where the forward pass runs: cpu | cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--hicache-io-backend", o->io_backend,
                  "--device cuda: how pages cross, direct | kernel (serve's flag)")
      ->check(CLI::IsMember({"direct", "kernel"}))
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "Compute threads")->capture_default_str();
  cmd->add_option("--weight-dtype", o->weight_dtype, "auto | f32 | bf16")->capture_default_str();
  cmd->add_option("--kv-dtype", o->kv_dtype, "f32 | f16 | bf16 | int8 | fp8_e4m3")
      ->capture_default_str();
  cmd->add_option("--prompt-tokens", o->prompt_tokens, "Prompt length for the tier TTFTs")
      ->check(CLI::Range(64, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--session-tokens", o->session_tokens, "Length of the paused tool session")
      ->check(CLI::Range(64, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--device-tokens", o->device_tokens, "Device KV pool in tokens")
      ->check(CLI::Range(1024, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--flood-factor", o->flood_factor, "Flood = this many device pools of tokens")
      ->check(CLI::Range(0.5, 100.0))
      ->capture_default_str();
  cmd->add_option("--redis-port", o->redis_port, "A running redis-server on 127.0.0.1 (0: skip)");
  cmd->add_option("--store-dir", o->store_dir, "Directory for the file store (wiped first)")
      ->capture_default_str();
  cmd->add_option("--hicache-load-overlap", o->load_overlap,
                  "How the host and storage hits load back: layer | none (serve's flag)")
      ->check(CLI::IsMember({"layer", "none"}))
      ->capture_default_str();
  cmd->add_flag("--skip-session", o->skip_session, "Only the tier TTFTs");
  cmd->add_flag("--json", o->json, "Also print one JSON object");
  cmd->callback([o, &exit_code] { exit_code = run_tier_bench(*o); });
}

}  // namespace strata::bench
