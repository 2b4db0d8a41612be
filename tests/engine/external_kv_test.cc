// The tiers over a model that keeps its KV pages in memory of its own, as the GPU model does
// (ForwardModel::external_kv, cuda/gpu_model.h): the engine's pool only counts pages, the
// host pool takes the model's page shape, and every copy goes through the model's copy
// device and the StreamTransferEngine. Here the "device memory" is a KvPool the CPU model
// computes in and the copy device is the test's (tests/memory/fake_copy_device.h), so the
// whole GPU tier path runs without a GPU: demotion and load-back, pins, tool sessions,
// storage, faults, and the refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "engine/engine.h"
#include "engine/engine_test_access.h"
#include "engine_test_util.h"
#include "model/make_model.h"
#include "own_kv_model.h"

namespace strata {
namespace {

constexpr int32_t kOwnKvPageSize = 16;
constexpr int32_t kOwnKvPages = 64;

class ExternalKvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = make_preset_model(ModelPreset::kTiny, Architecture::kLlama, 11,
                                   ModelOptions{.num_threads = 1});
    ASSERT_TRUE(model.has_value()) << model.error().message;
    model_ = std::make_unique<OwnKvModel>(std::move(*model), kOwnKvPages, kOwnKvPageSize);
  }

  static EngineOptions options(WritePolicy policy = WritePolicy::kWriteThrough) {
    EngineOptions o;
    o.page_size = kOwnKvPageSize;
    o.kv_cache_tokens = kOwnKvPages * kOwnKvPageSize;
    o.max_running_requests = 4;
    o.chunked_prefill_size = 256;
    o.hicache.enabled = true;
    o.hicache.ratio = 4.0;
    o.hicache.write_policy = policy;
    return o;
  }

  std::unique_ptr<Engine> start(EngineOptions o) {
    auto e = Engine::create(model_.get(), std::move(o), {});
    EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().message);
    return e ? std::move(*e) : nullptr;
  }

  static Outcome run(Engine& e, std::vector<int32_t> p, int32_t max_tokens = 8,
                     std::string session = {}) {
    return run_greedy(e, std::move(p), max_tokens, std::move(session));
  }

  std::unique_ptr<OwnKvModel> model_;
};

TEST_F(ExternalKvTest, TheHostPoolTakesTheModelsPageShapeAndItsCopyDevice) {
  auto e = start(options());
  ASSERT_NE(model_->device_, nullptr);
  // The host pool the copy device was given holds 4x the pages, each the model's page.
  EXPECT_EQ(model_->host_.size(), 4 * model_->own_->total_bytes());
  EXPECT_EQ(model_->path_, CopyPath::kDirect);
}

TEST_F(ExternalKvTest, FloodDemotesAndTheNextTurnLoadsBackWithIdenticalOutput) {
  for (WritePolicy policy :
       {WritePolicy::kWriteThrough, WritePolicy::kWriteBack, WritePolicy::kWriteThroughSelective}) {
    SCOPED_TRACE(std::string(write_policy_name(policy)));
    auto e = start(options(policy));
    const std::vector<int32_t> vip = test_prompt(400, 1);
    const Outcome first = run(*e, vip);
    if (policy == WritePolicy::kWriteThroughSelective) run(*e, vip);
    flood_engine(*e, 8, 300, 100);
    settle_transfers(*e);
    const Outcome again = run(*e, vip);
    EXPECT_EQ(again.tokens, first.tokens);
    EXPECT_GT(again.usage.cached_host, 0);
    settle_transfers(*e);
    expect_engine_consistent(*e);
    expect_counting_pool_untouched(*e);
  }
}

TEST_F(ExternalKvTest, TheLoadBackOverlapsThePrefillLayerByLayerOrWaitsForItWhole) {
  for (LoadOverlap overlap : {LoadOverlap::kLayer, LoadOverlap::kNone}) {
    SCOPED_TRACE(std::string(load_overlap_name(overlap)));
    EngineOptions o = options();
    o.hicache.load_overlap = overlap;
    auto e = start(o);
    const std::vector<int32_t> vip = test_prompt(400, 9);
    const Outcome first = run(*e, vip);
    flood_engine(*e, 8, 300, 900);
    settle_transfers(*e);
    const size_t waits_before = model_->device_->compute_waits_now().size();
    const Outcome again = run(*e, vip);
    EXPECT_EQ(again.tokens, first.tokens);
    EXPECT_GT(again.usage.cached_host, 0);
    const std::vector<CopyEvent> waits = model_->device_->compute_waits_now();
    if (overlap == LoadOverlap::kLayer) {
      // The first pass over the loaded prefix made the model's compute wait once per layer,
      // on that layer's load event.
      EXPECT_EQ(e->counters().loads_overlapped, 1u);
      ASSERT_EQ(waits.size() - waits_before, static_cast<size_t>(model_->config().num_layers));
      for (size_t i = waits_before; i < waits.size(); ++i) {
        EXPECT_EQ(model_->device_->queue_of(waits[i]), CopyQueue::kLoad);
        if (i > waits_before) {
          EXPECT_GT(waits[i], waits[i - 1]);
        }
      }
    } else {
      EXPECT_EQ(e->counters().loads_overlapped, 0u);
      EXPECT_EQ(waits.size(), waits_before);
    }
    settle_transfers(*e);
    expect_engine_consistent(*e);
    expect_counting_pool_untouched(*e);
  }
}

TEST_F(ExternalKvTest, APinnedPrefixSurvivesAFloodAndAFlushOnTheHost) {
  auto e = start(options());
  const std::vector<int32_t> vip = test_prompt(480, 2);
  const Outcome first = run(*e, vip);
  auto hashes =
      engine_call(*e, [&](EngineState& s) { return s.tree.block_hashes_of(vip, ""); }).get();
  EXPECT_EQ(engine_call(*e, [&](EngineState& s) { return s.tree.pin(hashes); }).get().pinned,
            static_cast<int32_t>(hashes.size()));
  flood_engine(*e, 30, 400, 300);
  settle_transfers(*e);
  EXPECT_EQ(engine_call(*e, [](EngineState& s) { return s.tree.flush(); }).get().pinned_preserved,
            static_cast<int32_t>(hashes.size()));
  settle_transfers(*e);
  const Outcome again = run(*e, vip);
  EXPECT_EQ(again.tokens, first.tokens);
  EXPECT_GT(again.usage.cached_host, 0);
  expect_engine_consistent(*e);
}

TEST_F(ExternalKvTest, AToolSessionLeavesTheDeviceAndComesBackWithIdenticalOutput) {
  auto e = start(options());
  const std::vector<int32_t> turn = test_prompt(300, 4);
  const Outcome first = run(*e, turn, 8, "agent");
  ASSERT_TRUE(e->cache().tool_start("agent").get().has_value());
  for (int i = 0; i < 5000; ++i) {
    if (e->cache().kv_meta("agent").get()->state == ToolSessionState::kOffloaded) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(e->cache().kv_meta("agent").get()->state, ToolSessionState::kOffloaded);
  flood_engine(*e, 8, 300, 500);  // the device pool cycles while the tool runs
  ASSERT_TRUE(e->cache().tool_end("agent", 1).get().has_value());
  // tool_end brought the session back to the device (the flood had cycled it twice over):
  // the turn is a device hit, its bytes the ones that went out.
  const Outcome again = run(*e, turn, 8, "agent");
  EXPECT_EQ(again.tokens, first.tokens);
  EXPECT_GE(again.usage.cached_tokens, 256);
  settle_transfers(*e);
  expect_engine_consistent(*e);
}

TEST_F(ExternalKvTest, StorageBehindTheHostPoolServesAFreshEngine) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("strata-external-kv-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  EngineOptions o = options();
  o.hicache.storage_backend = "file";
  o.hicache.storage_extra_config =
      R"({"dir": ")" + dir.string() + R"(", "prefetch_threshold": 64})";
  o.hicache.storage_namespace = "test";
  o.hicache.prefetch_policy = PrefetchPolicy::kWaitComplete;
  const std::vector<int32_t> vip = test_prompt(600, 3);
  Outcome first;
  {
    auto e = start(o);
    first = run(*e, vip);
    settle_transfers(*e);
    for (int i = 0; i < 2000 && e->counters().storage_pages_written < 37; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_GE(e->counters().storage_pages_written, 37u);
  }
  {
    auto e = start(o);
    const Outcome again = run(*e, vip);
    EXPECT_EQ(again.tokens, first.tokens);
    EXPECT_GE(again.usage.cached_storage, 37 * kOwnKvPageSize - kOwnKvPageSize);
    settle_transfers(*e);
    expect_engine_consistent(*e);
  }
  std::filesystem::remove_all(dir);
}

TEST_F(ExternalKvTest, FailedCopiesComputeInsteadAndGiveTheirPagesBack) {
  auto e = start(options());
  const std::vector<int32_t> vip = test_prompt(400, 6);
  const Outcome first = run(*e, vip);
  flood_engine(*e, 8, 300, 700);
  settle_transfers(*e);
  model_->device_->fail_all(true);
  const Outcome again = run(*e, vip);
  EXPECT_EQ(again.tokens, first.tokens);
  flood_engine(*e, 4, 300, 800);
  settle_transfers(*e);
  EXPECT_GT(e->counters().copy_faults, 0u);
  EXPECT_EQ(e->counters().loads_abandoned, 1u);  // it had started over the failed load
  expect_engine_consistent(*e);
  model_->device_->fail_all(false);
  EXPECT_EQ(run(*e, vip).tokens, first.tokens);
  settle_transfers(*e);
  expect_engine_consistent(*e);
}

TEST_F(ExternalKvTest, TheIoBackendReachesTheDeviceAndIsRefusedOnTheCpuEngine) {
  EngineOptions o = options();
  o.hicache.io_backend = CopyPath::kKernel;
  {
    auto e = start(o);
    EXPECT_EQ(model_->path_, CopyPath::kKernel);
  }
  auto cpu = make_preset_model(ModelPreset::kTiny, Architecture::kLlama, 11,
                               ModelOptions{.num_threads = 1});
  ASSERT_TRUE(cpu.has_value());
  const auto refused = Engine::create(cpu->get(), o, {});
  ASSERT_FALSE(refused.has_value());
  EXPECT_NE(refused.error().message.find("--hicache-io-backend kernel needs --device cuda"),
            std::string::npos)
      << refused.error().message;
}

// A model with KV memory of its own (a GPU's) keeps its pages in its own dtype: 8-bit pages
// are refused at start, with the reason (issue 54).
TEST_F(ExternalKvTest, EightBitPagesAreRefusedForAModelWithItsOwnKv) {
  EngineOptions o = options();
  o.kv_dtype = KvDtype::kInt8;
  const auto refused = Engine::create(model_.get(), o, {});
  ASSERT_FALSE(refused.has_value());
  EXPECT_NE(refused.error().message.find("--kv-cache-dtype int8"), std::string::npos)
      << refused.error().message;
  EXPECT_NE(refused.error().message.find("--device cpu"), std::string::npos);
}

// A model that draws decode rows itself (as the GPU model does, sending back a token instead
// of a vocabulary of floats) is given every decode row with its rules and the number its
// Sampler drew; its logits are then NaN. Every output equals the CPU engine's: greedy, at a
// temperature with top-k and top-p, with log-probabilities, in mixed batches (greedy and
// sampled, prompts and decodes), and when the model leaves some rows to the engine (which
// then draws them with the same number).
TEST_F(ExternalKvTest, DecodeRowsAreSampledByTheModelWithTheSamplersNumber) {
  model_->sample_ = true;
  auto plain_model = make_preset_model(ModelPreset::kTiny, Architecture::kLlama, 11,
                                       ModelOptions{.num_threads = 1});
  ASSERT_TRUE(plain_model.has_value());
  EngineOptions po = options();
  po.hicache.enabled = false;
  auto plain = Engine::create(plain_model->get(), po, {});
  ASSERT_TRUE(plain.has_value()) << plain.error().message;
  auto e = start(options());
  for (int n : {1, 20, 300}) {
    const std::vector<int32_t> prompt = test_prompt(n, 70 + n);
    EXPECT_EQ(run(*e, prompt, 12).tokens, run_greedy(**plain, prompt, 12).tokens) << n;
  }
  EXPECT_GE(model_->sampled_rows_, 3 * 11);  // every decode step but the prompt's row
  auto spec_of = [](std::vector<int32_t> prompt, float temperature, bool logprobs) {
    RequestSpec spec;
    spec.prompt = std::move(prompt);
    spec.sampling.temperature = temperature;
    spec.sampling.seed = 5;
    spec.sampling.logprobs = logprobs;
    spec.sampling.top_logprobs = logprobs ? 3 : 0;
    if (temperature > 0.0f) {
      spec.sampling.top_k = 40;
      spec.sampling.top_p = 0.9f;
    }
    spec.max_tokens = 10;
    return spec;
  };
  struct Got {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    std::vector<int32_t> top;  // each token's most likely alternative
  };
  auto collect = [](RequestStream& stream) {
    Got g;
    for (int i = 0; i < 6000; ++i) {
      bool finished = false;
      for (StreamItem& item : stream.wait(10)) {
        for (const auto& t : item.tokens) {
          g.tokens.push_back(t.token);
          g.logprobs.push_back(t.logprob);
          g.top.push_back(t.top_logprobs.empty() ? -1 : t.top_logprobs[0].token);
        }
        finished = finished || item.finish.has_value();
      }
      if (finished) break;
    }
    return g;
  };
  // Drawn by the model, and (fallback_every_ = 3) partly left to the engine.
  for (int64_t fallback : {0, 3}) {
    model_->fallback_every_ = fallback;
    for (const auto& [temperature, logprobs] :
         {std::pair{0.0f, true}, std::pair{0.8f, false}, std::pair{1.2f, true}}) {
      const std::vector<int32_t> prompt = test_prompt(40, 90);
      const int64_t drawn = model_->sampled_rows_;
      auto got = e->submit(spec_of(prompt, temperature, logprobs));
      auto want = (*plain)->submit(spec_of(prompt, temperature, logprobs));
      ASSERT_TRUE(got.has_value() && want.has_value());
      const Got g = collect(**got);
      const Got w = collect(**want);
      EXPECT_EQ(g.tokens, w.tokens) << temperature << " fallback " << fallback;
      EXPECT_EQ(g.top, w.top) << temperature;
      ASSERT_EQ(g.logprobs.size(), w.logprobs.size());
      for (size_t i = 0; i < g.logprobs.size(); ++i) {
        EXPECT_FALSE(std::isnan(g.logprobs[i]));
        if (logprobs) {
          EXPECT_NEAR(g.logprobs[i], w.logprobs[i], 1e-5) << i;
        }
      }
      EXPECT_GT(model_->sampled_rows_, drawn);
    }
  }
  EXPECT_GT(model_->fallback_rows_, 0);
  model_->fallback_every_ = 0;
  // A batch of greedy and sampled requests, prompts beside decodes: each row as the CPU's.
  const int64_t drawn = model_->sampled_rows_;
  std::vector<std::shared_ptr<RequestStream>> streams, refs;
  for (int i = 0; i < 4; ++i) {
    const std::vector<int32_t> prompt = test_prompt(30 + 50 * i, 100 + i);
    auto a = e->submit(spec_of(prompt, i % 2 == 0 ? 0.0f : 0.7f, i == 1));
    auto b = (*plain)->submit(spec_of(prompt, i % 2 == 0 ? 0.0f : 0.7f, i == 1));
    ASSERT_TRUE(a.has_value() && b.has_value());
    streams.push_back(*a);
    refs.push_back(*b);
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    EXPECT_EQ(drain(*streams[i]).tokens, drain(*refs[i]).tokens) << i;
  }
  EXPECT_GT(model_->sampled_rows_, drawn);
  expect_engine_consistent(*e);
}

TEST_F(ExternalKvTest, WhatCannotRunIsRefusedWithItsReason) {
  // page_first interleaves a page's rows: no whole blocks to copy.
  EngineOptions o = options();
  o.hicache.layout = HostLayout::kPageFirst;
  auto e = Engine::create(model_.get(), o, {});
  ASSERT_FALSE(e.has_value());
  EXPECT_NE(e.error().message.find("page_first"), std::string::npos) << e.error().message;
  // A copy device the model cannot make (no page-locked memory): the engine does not start.
  model_->refuse_devices_ = true;
  e = Engine::create(model_.get(), options(), {});
  ASSERT_FALSE(e.has_value());
  EXPECT_EQ(e.error().code, ErrorCode::kResourceExhausted);
  model_->refuse_devices_ = false;
  // P/D crosses a stage of page-locked host memory (pd_engine/pd_stage_test.cc): without a
  // copy device for it, the engine does not start, and says why.
  o = options();
  o.hicache.enabled = false;
  o.pd.role = WorkerRole::kPrefill;
  o.pd.worker_id = "p0";
  o.pd.bind = "tcp://127.0.0.1:0";
  model_->refuse_devices_ = true;
  e = Engine::create(model_.get(), o, {});
  ASSERT_FALSE(e.has_value());
  EXPECT_EQ(e.error().code, ErrorCode::kResourceExhausted) << e.error().message;
  EXPECT_NE(e.error().message.find("P/D stage"), std::string::npos) << e.error().message;
  model_->refuse_devices_ = false;
}

}  // namespace
}  // namespace strata
