// The engine tests' device switch (test_device.h): STRATA_TEST_DEVICE names the model an
// engine runs on, and on a device other than the CPU the greedy outputs agree with the CPU
// model's on the same weights (issue 30: "greedy outputs agree on a test model whose LM
// head is made peaky").
#include "test_device.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "engine_test_util.h"

namespace strata {
namespace {

EngineOptions small_engine() {
  EngineOptions o;
  o.page_size = 16;
  o.kv_cache_tokens = 1024;
  o.max_running_requests = 4;
  o.chunked_prefill_size = 256;
  return o;
}

TEST(TestDeviceTest, TheEnginesRunOnTheDeviceNamed) {
  TestModel model;
  STRATA_TEST_MODEL(model, ModelPreset::kTiny, Architecture::kLlama, 3,
                    ModelOptions{.num_threads = 1});
  auto forward = model.forward_model(small_engine());
  ASSERT_TRUE(forward.has_value()) << forward.error().message;
  if (model.device() == TestDevice::kCpu) {
    EXPECT_EQ(*forward, &model.cpu());
    EXPECT_FALSE((*forward)->external_kv().has_value());
    return;
  }
  // The GPU kernels' head size, and a model of its own per engine with its KV outside the
  // engine's pool (the pool only counts pages).
  EXPECT_EQ(model.config().head_dim, 64);
  EXPECT_NE(*forward, &model.cpu());
  EXPECT_TRUE((*forward)->external_kv().has_value());
  auto second = model.forward_model(small_engine());
  ASSERT_TRUE(second.has_value());
  EXPECT_NE(*second, *forward);
}

TEST(TestDeviceTest, AnUnknownDeviceIsRefusedByName) {
  const char* before = std::getenv("STRATA_TEST_DEVICE");
  const std::string saved = before == nullptr ? "" : before;
  setenv("STRATA_TEST_DEVICE", "tpu", 1);
  auto made = TestModel::make(ModelPreset::kTiny, Architecture::kLlama, 3);
  if (before == nullptr) {
    unsetenv("STRATA_TEST_DEVICE");
  } else {
    setenv("STRATA_TEST_DEVICE", saved.c_str(), 1);
  }
  ASSERT_FALSE(made.has_value());
  EXPECT_NE(made.error().message.find("STRATA_TEST_DEVICE=tpu"), std::string::npos)
      << made.error().message;
}

// The same prompts, alone and then eight at a time (other batch shapes, a cached prefix
// reused), greedy, on an engine over the test device and on one over the CPU model with the
// same weights: the same tokens. On the CPU device the two engines share the model.
TEST(TestDeviceTest, GreedyOutputsAgreeWithTheCpuModel) {
  TestModel model;
  STRATA_TEST_MODEL(model, ModelPreset::kTiny, Architecture::kLlama, 3,
                    ModelOptions{.num_threads = 1});
  auto on_device = create_test_engine(model, small_engine());
  ASSERT_TRUE(on_device.has_value()) << on_device.error().message;
  auto on_cpu = Engine::create(&model.cpu(), small_engine(), {});
  ASSERT_TRUE(on_cpu.has_value()) << on_cpu.error().message;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(test_prompt(1 + 7 * i, 40 + i));
  prompts.push_back(test_prompt(300, 60));  // two chunks
  std::vector<int32_t> shared = prompts.back();
  shared.resize(200);
  shared.push_back(5);
  prompts.push_back(shared);  // its first 12 pages cached
  // The CPU model's answers first: on the CPU device both engines run on one Model, which
  // takes one forward at a time.
  std::vector<Outcome> want;
  for (const auto& p : prompts) {
    want.push_back(run_greedy(**on_cpu, p, 12));
    ASSERT_EQ(want.back().reason, FinishReason::kLength);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Outcome got = run_greedy(**on_device, prompts[i], 12);
    EXPECT_EQ(got.tokens, want[i].tokens) << "prompt of " << prompts[i].size() << " tokens, alone";
  }
  // All at once: prefill and decode rows mixed in the device's batches.
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& p : prompts) {
    RequestSpec spec;
    spec.prompt = p;
    spec.sampling.temperature = 0;
    spec.max_tokens = 12;
    auto s = (*on_device)->submit(std::move(spec));
    ASSERT_TRUE(s.has_value());
    streams.push_back(std::move(*s));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Outcome got = drain(*streams[i]);
    EXPECT_EQ(got.tokens, want[i].tokens) << "prompt " << i << ", batched";
  }
  expect_engine_consistent(**on_device);
}

}  // namespace
}  // namespace strata
