// Disaggregation on a model that keeps its KV in memory of its own (a GPU's): the pages cross
// a stage of host memory on both sides (engine/pd_stage.h). Both workers run the CPU model
// computing in a pool of its own, its copies through a fake copy device
// (tests/engine/own_kv_model.h), over the real control plane and data planes (UCX over
// tcp, the file store), against a colocated engine's greedy output; then a stage smaller
// than a room on each side, a stage kept busy by concurrent rooms, and failed copies on
// each side. Every test ends with page audits, the stage's included.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <thread>

#include "../engine/engine_test_util.h"
#include "../engine/own_kv_model.h"
#include "engine/engine.h"
#include "engine/engine_test_access.h"
#include "model/make_model.h"
#include "pd_test_util.h"

namespace strata {
namespace {

using namespace std::chrono_literals;

constexpr int32_t kPageSize = 4;  // pd_test_options's
constexpr int32_t kPages = 256;

class PdStageTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    setenv("UCX_TLS", "tcp", 0);
    auto make = [] {
      auto m = make_preset_model(ModelPreset::kTiny, Architecture::kLlama, 7,
                                 ModelOptions{.num_threads = 1});
      EXPECT_TRUE(m.has_value());
      return std::move(*m);
    };
    colocated_model_ = make();
    prefill_model_ = std::make_unique<OwnKvModel>(make(), kPages, kPageSize);
    decode_model_ = std::make_unique<OwnKvModel>(make(), kPages, kPageSize);
    store_dir_ = std::filesystem::temp_directory_path() /
                 ("strata-pd-stage-test-" + std::to_string(::getpid()) + "-" +
                  std::to_string(reinterpret_cast<uintptr_t>(this)));
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(store_dir_, ec);
  }

  EngineOptions base() const {
    EngineOptions o =
        pd_test_options(GetParam(), store_dir_, "test-layout;tiny;own-kv", kPages * kPageSize);
    o.pd.stall_ms = 2'000;
    return o;
  }

  static std::unique_ptr<Engine> start(ForwardModel* model, const EngineOptions& o) {
    auto e = Engine::create(model, o, nullptr);
    EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().message);
    return e ? std::move(*e) : nullptr;
  }

  void start_all(int64_t prefill_stage_tokens, int64_t decode_stage_tokens) {
    colocated_ = start(colocated_model_.get(), base());
    EngineOptions po = base();
    po.pd.role = WorkerRole::kPrefill;
    po.pd.worker_id = "prefill-1";
    po.pd.bind = "tcp://127.0.0.1:0";
    po.pd.stage_tokens = prefill_stage_tokens;
    prefill_ = start(prefill_model_.get(), po);
    ASSERT_TRUE(colocated_ && prefill_);
    EngineOptions dopt = base();
    dopt.pd.role = WorkerRole::kDecode;
    dopt.pd.worker_id = "decode-1";
    dopt.pd.prefill_peers = {prefill_->pd_info().endpoint};
    dopt.pd.stage_tokens = decode_stage_tokens;
    decode_ = start(decode_model_.get(), dopt);
    ASSERT_TRUE(decode_);
    for (int i = 0; i < 400; ++i) {
      if (!decode_->pd_info().peers_alive.empty()) return;
      std::this_thread::sleep_for(10ms);
    }
    FAIL() << "the prefill worker never came alive";
  }

  Outcome remote(std::vector<int32_t> prompt, int32_t max_tokens) {
    RequestSpec spec;
    spec.prompt = std::move(prompt);
    spec.sampling.temperature = 0;
    spec.max_tokens = max_tokens;
    spec.prefill_peer = "prefill-1";
    auto stream = decode_->submit(std::move(spec));
    EXPECT_TRUE(stream.has_value());
    return stream ? drain(**stream) : Outcome{};
  }

  static size_t fallbacks(Engine& e, PdFallback why) {
    return e.counters().pd_fallbacks[static_cast<size_t>(why)];
  }

  // ... and the engine's counting pool never written (every byte went through the model's
  // own memory and the stage).
  static void expect_audited(Engine& e) {
    expect_pd_audited(e);
    expect_counting_pool_untouched(e);
  }

  // The prefill engine publishes its counters after the iteration that answered.
  EngineCounters settled_prefill_counters(uint64_t orders_ended) {
    EngineCounters c = prefill_->counters();
    for (int i = 0; i < 200 && c.pd_orders_done + c.pd_orders_failed < orders_ended; ++i) {
      std::this_thread::sleep_for(5ms);
      c = prefill_->counters();
    }
    return c;
  }

  std::unique_ptr<Model> colocated_model_;
  std::unique_ptr<OwnKvModel> prefill_model_, decode_model_;
  std::unique_ptr<Engine> colocated_, prefill_, decode_;
  std::filesystem::path store_dir_;
};

TEST_P(PdStageTest, GreedyOutputThroughTheStagesEqualsColocated) {
  // The prefill worker's stage (4 pages) is smaller than most rooms: they go out in parts.
  start_all(16, 1024);
  int salt = 100;
  int64_t pages = 0;
  for (int n : {1, 4, 5, 16, 37, 101}) {
    const auto prompt = test_prompt(n, ++salt);
    const Outcome want = run_greedy(*colocated_, prompt, 12);
    const Outcome got = remote(prompt, 12);
    EXPECT_EQ(got.tokens, want.tokens) << "prompt of " << n << " tokens";
    EXPECT_TRUE(got.usage.kv_transferred) << n;
    EXPECT_EQ(got.usage.kv_transfer_tokens, n) << n;
    pages += (n + kPageSize - 1) / kPageSize;
  }
  const EngineCounters dc = decode_->counters();
  EXPECT_EQ(dc.pd_rooms_done, 6u);
  EXPECT_EQ(dc.pd_stage_pages_copied, static_cast<uint64_t>(pages));
  EXPECT_EQ(dc.pd_stage_copy_faults, 0u);
  const EngineCounters pc = settled_prefill_counters(6);
  EXPECT_EQ(pc.pd_orders_done, 6u);
  EXPECT_EQ(pc.pd_pages_sent, dc.pd_pages_received);
  EXPECT_EQ(pc.pd_stage_pages_copied, static_cast<uint64_t>(pages));
  // The bytes are the model's pages, not the counting pool's.
  EXPECT_EQ(pc.pd_bytes_sent, static_cast<uint64_t>(pages) * prefill_model_->own_->page_bytes());
  expect_audited(*decode_);
  expect_audited(*prefill_);
}

TEST_P(PdStageTest, ARoomLargerThanTheDecodeStagePrefillsLocally) {
  start_all(1024, 32);                     // 8 stage pages on the decode side
  const auto prompt = test_prompt(60, 3);  // 15 pages
  const Outcome want = run_greedy(*colocated_, prompt, 8);
  const Outcome got = remote(prompt, 8);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_FALSE(got.usage.kv_transferred);
  EXPECT_EQ(fallbacks(*decode_, PdFallback::kStageTooSmall), 1u);
  // One that fits still goes remote.
  const auto small = test_prompt(20, 4);
  EXPECT_EQ(remote(small, 6).tokens, run_greedy(*colocated_, small, 6).tokens);
  EXPECT_EQ(decode_->counters().pd_rooms_done, 1u);
  expect_audited(*decode_);
  expect_audited(*prefill_);
}

TEST_P(PdStageTest, ConcurrentRoomsWaitForTheStageAndAllArrive) {
  // 12 stage pages on the decode side: one 40-token room (10 pages) at a time.
  start_all(1024, 48);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(test_prompt(40, 50 + i));
  std::vector<std::future<Outcome>> got;
  for (const auto& p : prompts)
    got.push_back(std::async(std::launch::async, [&, p] { return remote(p, 6); }));
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Outcome o = got[i].get();
    EXPECT_EQ(o.tokens, run_greedy(*colocated_, prompts[i], 6).tokens) << i;
    EXPECT_TRUE(o.usage.kv_transferred) << i;
  }
  EXPECT_EQ(decode_->counters().pd_rooms_done, prompts.size());
  expect_audited(*decode_);
  expect_audited(*prefill_);
}

TEST_P(PdStageTest, AFailedCopyToTheDecodeDeviceFailsOnlyThatRoom) {
  start_all(1024, 1024);
  FakeCopyDevice* stage_device = decode_model_->device_;  // the decode stage's (no host tier)
  ASSERT_NE(stage_device, nullptr);
  stage_device->fail_all(true);
  const auto prompt = test_prompt(30, 5);
  const Outcome want = run_greedy(*colocated_, prompt, 8);
  const Outcome got = remote(prompt, 8);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_FALSE(got.usage.kv_transferred);
  EXPECT_EQ(fallbacks(*decode_, PdFallback::kTransfer), 1u);
  EXPECT_EQ(decode_->counters().pd_stage_copy_faults, 1u);
  stage_device->fail_all(false);
  const auto next = test_prompt(30, 6);
  const Outcome ok = remote(next, 8);
  EXPECT_EQ(ok.tokens, run_greedy(*colocated_, next, 8).tokens);
  EXPECT_TRUE(ok.usage.kv_transferred);
  expect_audited(*decode_);
  expect_audited(*prefill_);
}

TEST_P(PdStageTest, AFailedCopyToThePrefillStageFailsTheOrder) {
  start_all(1024, 1024);
  FakeCopyDevice* stage_device = prefill_model_->device_;
  ASSERT_NE(stage_device, nullptr);
  stage_device->fail_all(true);
  const auto prompt = test_prompt(30, 7);
  const Outcome want = run_greedy(*colocated_, prompt, 8);
  const Outcome got = remote(prompt, 8);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_FALSE(got.usage.kv_transferred);
  EXPECT_EQ(fallbacks(*decode_, PdFallback::kPrefillFailed), 1u);
  const EngineCounters pc = settled_prefill_counters(1);
  EXPECT_GE(pc.pd_stage_copy_faults, 1u);
  EXPECT_EQ(pc.pd_orders_failed, 1u);
  stage_device->fail_all(false);
  const auto next = test_prompt(30, 8);
  const Outcome ok = remote(next, 8);
  EXPECT_EQ(ok.tokens, run_greedy(*colocated_, next, 8).tokens);
  EXPECT_TRUE(ok.usage.kv_transferred);
  expect_audited(*decode_);
  expect_audited(*prefill_);
}

INSTANTIATE_TEST_SUITE_P(Transports, PdStageTest, ::testing::Values("ucx", "storage"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace strata
