// The engine on the GPU model with the host tier (issue 31): the host pool in the GPU pages'
// shape, page-locked, and every copy through the GPU's copy streams, for both I/O paths and
// both host layouts that have whole blocks. A prompt demoted to the host by a flood and
// loaded back answers as it did the first time; a tool session leaves the GPU and comes back
// the same; P/D between two GPU engines through their page-locked stages. "The same": the
// same greedy tokens, or where the two runs part (BF16 rounds a prefix loaded back and one
// computed at other batch shapes differently), a near-tie on the CPU model
// (expect_same_greedy_or_tied).
// (tests/engine/external_kv_test.cc and tests/pd_engine/pd_stage_test.cc run the same engine
// paths on the CPU, over fake devices.)
//
// Without a GPU (or CUDA) these skip (fail under STRATA_REQUIRE_GPU=1).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "../engine/engine_test_util.h"
#include "cuda/gpu_model.h"
#include "engine/engine.h"
#include "gpu_test_util.h"
#include "model/make_model.h"
#include "model/model.h"

namespace strata::cuda {
namespace {

constexpr int32_t kGpuPages = 64;
constexpr int32_t kGpuPageSize = 16;

class GpuEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    STRATA_NEED_GPU();
    auto cpu = make_gpu_test_model(ModelPreset::kDemo, Architecture::kQwen3, 5);
    ASSERT_TRUE(cpu.has_value()) << cpu.error().message;
    cpu_ = std::move(*cpu);
    GpuModelOptions o{.num_pages = kGpuPages,
                      .page_size = kGpuPageSize,
                      .max_batch_tokens = 256 + 8,
                      .max_batch_sequences = 8};
    auto gpu = GpuModel::create(cpu_->config(), cpu_->weights(), o);
    ASSERT_TRUE(gpu.has_value()) << gpu.error().message;
    gpu_ = std::move(*gpu);
  }

  static EngineOptions options(CopyPath path, HostLayout layout) {
    EngineOptions o;
    o.page_size = kGpuPageSize;
    o.kv_cache_tokens = kGpuPages * kGpuPageSize;
    o.max_running_requests = 4;
    o.chunked_prefill_size = 256;
    o.hicache.enabled = true;
    o.hicache.ratio = 4.0;
    o.hicache.layout = layout;
    o.hicache.io_backend = path;
    return o;
  }

  std::unique_ptr<Model> cpu_;
  std::unique_ptr<GpuModel> gpu_;
};

TEST_F(GpuEngineTest, APromptLoadedBackFromTheHostAnswersAsItDidFirst) {
  // Each I/O path and layout, the load-back overlapped with the prefill layer by layer (the
  // compute stream waiting on each layer's copy event) or landed whole first.
  for (CopyPath path : {CopyPath::kDirect, CopyPath::kKernel}) {
    for (HostLayout layout : {HostLayout::kLayerFirst, HostLayout::kPageFirstDirect}) {
      for (LoadOverlap overlap : {LoadOverlap::kLayer, LoadOverlap::kNone}) {
        const std::string what = std::string(copy_path_name(path)) + " " +
                                 std::string(host_layout_name(layout)) + " overlap " +
                                 std::string(load_overlap_name(overlap));
        SCOPED_TRACE(what);
        EngineOptions o = options(path, layout);
        o.hicache.load_overlap = overlap;
        auto e = Engine::create(gpu_.get(), o, {});
        ASSERT_TRUE(e.has_value()) << what << ": " << e.error().message;
        const std::vector<int32_t> vip = test_prompt(400, 1);
        const Outcome first = run_greedy(**e, vip, 8);
        flood_engine(**e, 8, 300, 100);
        settle_transfers(**e, 5000);
        const Outcome again = run_greedy(**e, vip, 8);
        expect_same_greedy_or_tied(*cpu_, vip, first.tokens, again.tokens, what);
        EXPECT_GT(again.usage.cached_host, 0);
        settle_transfers(**e, 5000);
        expect_engine_consistent(**e);
        EXPECT_EQ((*e)->counters().copy_faults, 0u);
        EXPECT_EQ((*e)->counters().loads_overlapped, overlap == LoadOverlap::kLayer ? 1u : 0u);
      }
    }
  }
}

TEST_F(GpuEngineTest, AToolSessionLeavesTheGpuAndComesBackTheSame) {
  auto e = Engine::create(gpu_.get(), options(CopyPath::kDirect, HostLayout::kLayerFirst), {});
  ASSERT_TRUE(e.has_value()) << e.error().message;
  const std::vector<int32_t> turn = test_prompt(300, 4);
  const Outcome first = run_greedy(**e, turn, 8, "agent");
  ASSERT_TRUE((*e)->cache().tool_start("agent").get().has_value());
  for (int i = 0; i < 5000; ++i) {
    if ((*e)->cache().kv_meta("agent").get()->state == ToolSessionState::kOffloaded) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  flood_engine(**e, 8, 300, 500);
  ASSERT_TRUE((*e)->cache().tool_end("agent", 1).get().has_value());
  const Outcome again = run_greedy(**e, turn, 8, "agent");
  expect_same_greedy_or_tied(*cpu_, turn, first.tokens, again.tokens, "the tool session's turn");
  EXPECT_GE(again.usage.cached_tokens, 256);
  settle_transfers(**e, 5000);
  expect_engine_consistent(**e);
}

// Issue 31's overlap on a real GPU, measured (printed, never asserted): the TTFT of a next
// turn (a 4,096-token conversation and 64 new tokens) whose prefix is on the GPU, against
// the same turn after the conversation was demoted to the host, with the load-back
// overlapped layer by layer and with the request waiting for the whole load. Demo preset
// (small: the copy and the 64-token prefill both take little), direct I/O path,
// page_first_direct. gpu-check collects the "[tier ttft]" lines.
TEST(GpuTierTtftTest, AHostHitNextTurnAgainstADeviceHitPerOverlap) {
  STRATA_NEED_GPU();
  auto cpu = make_gpu_test_model(ModelPreset::kDemo, Architecture::kQwen3, 5);
  ASSERT_TRUE(cpu.has_value()) << cpu.error().message;
  constexpr int32_t kPages = 1024;  // 16K tokens
  GpuModelOptions mo{.num_pages = kPages,
                     .page_size = kGpuPageSize,
                     .max_batch_tokens = 2048 + 8,
                     .max_batch_sequences = 8};
  auto gpu = GpuModel::create((*cpu)->config(), (*cpu)->weights(), mo);
  ASSERT_TRUE(gpu.has_value()) << gpu.error().message;
  auto ttft = [](Engine& e, std::vector<int32_t> prompt, Outcome& out) {
    RequestSpec spec;
    spec.prompt = std::move(prompt);
    spec.sampling.temperature = 0;
    spec.max_tokens = 4;
    const auto t0 = std::chrono::steady_clock::now();
    auto stream = e.submit(std::move(spec));
    EXPECT_TRUE(stream.has_value());
    if (!stream) return 0.0;
    double first_ms = -1;
    bool finished = false;
    for (int i = 0; i < 60000 && !finished; ++i) {
      for (StreamItem& item : (*stream)->wait(1)) {
        if (first_ms < 0 && (!item.tokens.empty() || item.finish)) {
          first_ms =
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count();
        }
        for (const auto& t : item.tokens) out.tokens.push_back(t.token);
        if (item.finish) {
          finished = true;
          out.reason = *item.finish;
          out.usage = item.usage;
        }
      }
    }
    EXPECT_TRUE(finished);
    return first_ms;
  };
  const std::vector<int32_t> conversation = test_prompt(4096, 31);
  auto next_turn = [&](int salt) {
    std::vector<int32_t> t = conversation;
    const std::vector<int32_t> more = test_prompt(64, salt);
    t.insert(t.end(), more.begin(), more.end());
    return t;
  };
  for (LoadOverlap overlap : {LoadOverlap::kLayer, LoadOverlap::kNone}) {
    SCOPED_TRACE(std::string(load_overlap_name(overlap)));
    EngineOptions o;
    o.page_size = kGpuPageSize;
    o.kv_cache_tokens = kPages * kGpuPageSize;
    o.max_running_requests = 8;
    o.chunked_prefill_size = 2048;
    o.hicache.enabled = true;
    o.hicache.ratio = 4.0;
    o.hicache.layout = HostLayout::kPageFirstDirect;
    o.hicache.load_overlap = overlap;
    auto e = Engine::create(gpu->get(), o, {});
    ASSERT_TRUE(e.has_value()) << e.error().message;
    Outcome cold;
    const double cold_ms = ttft(**e, conversation, cold);
    settle_transfers(**e, 5000);
    double device_ms = 0, host_ms = 0;
    constexpr int kRounds = 5;
    for (int round = 0; round < kRounds; ++round) {
      Outcome dev, host;
      device_ms += ttft(**e, next_turn(100 + round), dev) / kRounds;
      settle_transfers(**e, 5000);
      ASSERT_TRUE((*e)->cache().evict_lru(int64_t{1} << 30).get().has_value());  // all to host
      settle_transfers(**e, 5000);
      host_ms += ttft(**e, next_turn(200 + round), host) / kRounds;
      EXPECT_GT(host.usage.cached_host, 4000);
      settle_transfers(**e, 5000);
    }
    std::printf(
        "[tier ttft] demo preset, 4096 cached + 64 new tokens, overlap %s: cold %.2f ms, device "
        "hit %.2f ms, host hit %.2f ms, host/device %.2f (mean of %d)\n",
        std::string(load_overlap_name(overlap)).c_str(), cold_ms, device_ms, host_ms,
        device_ms > 0 ? host_ms / device_ms : 0.0, kRounds);
    EXPECT_EQ((*e)->counters().copy_faults, 0u);
    expect_engine_consistent(**e);
  }
}

// P/D between two GPU engines (issue 31): Debian's UCX cannot register GPU memory, so the
// pages cross a page-locked stage on each side (engine/pd_stage.h) on the GPUs' copy
// streams, here over the file store; greedy output equal to a colocated GPU engine's, the
// stage's pages copied, every page audited after.
TEST(GpuPdTest, PrefillAndDecodeWorkersOnTheGpuThroughTheStages) {
  STRATA_NEED_GPU();
  auto cpu = make_gpu_test_model(ModelPreset::kDemo, Architecture::kQwen3, 5);
  ASSERT_TRUE(cpu.has_value()) << cpu.error().message;
  const GpuModelOptions g{.num_pages = kGpuPages,
                          .page_size = kGpuPageSize,
                          .max_batch_tokens = 256 + 8,
                          .max_batch_sequences = 8};
  std::vector<std::unique_ptr<GpuModel>> gpus;
  for (int i = 0; i < 3; ++i) {
    auto m = GpuModel::create((*cpu)->config(), (*cpu)->weights(), g);
    ASSERT_TRUE(m.has_value()) << m.error().message;
    gpus.push_back(std::move(*m));
  }
  const std::filesystem::path store =
      std::filesystem::temp_directory_path() / ("strata-gpu-pd-" + std::to_string(::getpid()));
  EngineOptions base;
  base.page_size = kGpuPageSize;
  base.kv_cache_tokens = kGpuPages * kGpuPageSize;
  base.chunked_prefill_size = 64;
  base.pd.kv_layout = "gpu-pd-test";
  base.pd.transport = "storage";
  base.pd.storage_backend = "file";
  base.pd.storage_extra_config = "{\"dir\": \"" + store.string() + "\"}";
  base.pd.heartbeat_ms = 50;
  base.pd.stage_tokens = 4 * kGpuPageSize;  // the prefill side sends in parts
  auto colocated = Engine::create(gpus[0].get(), base, {});
  ASSERT_TRUE(colocated.has_value()) << colocated.error().message;
  EngineOptions po = base;
  po.pd.role = WorkerRole::kPrefill;
  po.pd.worker_id = "prefill-1";
  po.pd.bind = "tcp://127.0.0.1:0";
  auto prefill = Engine::create(gpus[1].get(), po, {});
  ASSERT_TRUE(prefill.has_value()) << prefill.error().message;
  EngineOptions dopt = base;
  dopt.pd.role = WorkerRole::kDecode;
  dopt.pd.worker_id = "decode-1";
  dopt.pd.prefill_peers = {(*prefill)->pd_info().endpoint};
  dopt.pd.stage_tokens = kGpuPages * kGpuPageSize;
  auto decode = Engine::create(gpus[2].get(), dopt, {});
  ASSERT_TRUE(decode.has_value()) << decode.error().message;
  for (int i = 0; i < 400 && (*decode)->pd_info().peers_alive.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE((*decode)->pd_info().peers_alive.empty());
  int salt = 40;
  for (int n : {1, 17, 100, 300}) {
    const std::vector<int32_t> prompt = test_prompt(n, ++salt);
    const Outcome want = run_greedy(**colocated, prompt, 8);
    RequestSpec spec;
    spec.prompt = prompt;
    spec.sampling.temperature = 0;
    spec.max_tokens = 8;
    spec.prefill_peer = "prefill-1";
    auto stream = (*decode)->submit(std::move(spec));
    ASSERT_TRUE(stream.has_value());
    const Outcome got = drain(**stream);
    expect_same_greedy_or_tied(**cpu, prompt, want.tokens, got.tokens,
                               std::to_string(n) + " tokens through P/D");
    EXPECT_TRUE(got.usage.kv_transferred) << n;
  }
  EXPECT_EQ((*decode)->counters().pd_rooms_done, 4u);
  EXPECT_GT((*decode)->counters().pd_stage_pages_copied, 0u);
  EXPECT_EQ((*decode)->counters().pd_stage_copy_faults, 0u);
  expect_engine_consistent(**decode);
  expect_engine_consistent(**prefill);
  decode->reset();
  prefill->reset();
  std::error_code ec;
  std::filesystem::remove_all(store, ec);
}

}  // namespace
}  // namespace strata::cuda
