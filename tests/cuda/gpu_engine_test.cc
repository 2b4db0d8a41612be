// The engine on the GPU model with the host tier (issue 31): the host pool in the GPU pages'
// shape, page-locked, and every copy through the GPU's copy streams, for both I/O paths and
// both host layouts that have whole blocks. A prompt demoted to the host by a flood and
// loaded back answers exactly as it did the first time; a tool session leaves the GPU and
// comes back the same. (tests/engine/external_kv_test.cc runs the same engine path on the
// CPU, over a fake device.)
//
// Without a GPU (or CUDA) these skip (fail under STRATA_REQUIRE_GPU=1).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

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
    auto cpu = make_preset_model(ModelPreset::kDemo, Architecture::kQwen3, 5);
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
        EXPECT_EQ(again.tokens, first.tokens);
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
  EXPECT_EQ(again.tokens, first.tokens);
  EXPECT_GE(again.usage.cached_tokens, 256);
  settle_transfers(**e, 5000);
  expect_engine_consistent(**e);
}

}  // namespace
}  // namespace strata::cuda
