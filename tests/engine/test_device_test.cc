// The engine tests' device switch (test_device.h): STRATA_TEST_DEVICE names the model an
// engine runs on; its model passes the GPU model's shape checks; and the greedy outputs on
// the device are the CPU model's choices on the same weights, within BF16's error on a GPU
// (issue 30: "greedy outputs agree"; issue 50: compared where the CPU's margin exceeds the
// error bound, the rest counted as ties).
#include "test_device.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
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

// The model the engine tests make for a GPU (TestModel::device_config), on every machine:
// it passes the checks GpuModel::create makes before any device work, with the options an
// engine of the tests' sizes makes it with, so that a shape the kernels cannot run fails
// here and not on the first GPU run (the preset as make_model gives it would: head_dim 16).
TEST(TestDeviceTest, TheGpuModelOfTheEngineTestsPassesTheShapeChecks) {
  auto config =
      TestModel::device_config(ModelPreset::kTiny, Architecture::kLlama, TestDevice::kCuda);
  ASSERT_TRUE(config.has_value()) << config.error().message;
  EXPECT_EQ(config->head_dim, 64);
  const EngineOptions o = small_engine();
  const cuda::GpuModelOptions g = cuda::gpu_options_for_engine(
      o.page_size, o.kv_cache_tokens, o.max_running_requests, o.chunked_prefill_size);
  const Status st = cuda::GpuModel::check(*config, g);
  EXPECT_TRUE(st.has_value()) << st.error().message;
  const Status as_made = cuda::GpuModel::check(
      *TestModel::device_config(ModelPreset::kTiny, Architecture::kLlama, TestDevice::kCpu), g);
  EXPECT_FALSE(as_made.has_value());
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

// The same prompts, alone and then all at once (other batch shapes, a cached prefix reused,
// a prompt in two chunks), greedy, on an engine over the test device: every choice the
// CPU model's on the same weights (cuda::expect_greedy_choices). On the CPU and own-kv
// devices the
// arithmetic is the CPU model's, so the margin is 0: the same tokens exactly. On a GPU each
// logit may lie kBf16LogitError (4 %) of the row's largest |logit| from the CPU's (what
// GpuModelTest.LogitsMatchTheCpuEngineStepByStep holds it to), so two tokens whose CPU logits
// are within twice that may come out in either order: those choices are ties, counted and
// printed, not failures. (The LM head's ×8 cannot spare this: a power of two scales every
// logit and every rounding error alike.)
TEST(TestDeviceTest, GreedyOutputsAgreeWithTheCpuModel) {
  TestModel model;
  STRATA_TEST_MODEL(model, ModelPreset::kTiny, Architecture::kLlama, 3,
                    ModelOptions{.num_threads = 1});
  auto on_device = create_test_engine(model, small_engine());
  ASSERT_TRUE(on_device.has_value()) << on_device.error().message;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(test_prompt(1 + 7 * i, 40 + i));
  prompts.push_back(test_prompt(300, 60));  // two chunks
  std::vector<int32_t> shared = prompts.back();
  shared.resize(200);
  shared.push_back(5);
  prompts.push_back(shared);  // its first 12 pages cached
  std::vector<Outcome> alone, batched;
  for (const auto& p : prompts) alone.push_back(run_greedy(**on_device, p, 12));
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
  for (const auto& s : streams) batched.push_back(drain(*s));
  expect_engine_consistent(**on_device);
  // The engine goes first: on the CPU device it runs on the model checked against below,
  // which takes one forward at a time.
  on_device->reset();
  const float margin = model.device() == TestDevice::kCuda ? 2 * cuda::kBf16LogitError : 0.0f;
  int checked = 0, ties = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::pair<const Outcome*, const char*> runs[] = {{&alone[i], "alone"},
                                                           {&batched[i], "batched"}};
    for (const auto& [outcome, how] : runs) {
      const std::string what = "prompt " + std::to_string(i) + " of " +
                               std::to_string(prompts[i].size()) + " tokens, " + how;
      ASSERT_TRUE(outcome->reason == FinishReason::kLength ||
                  outcome->reason == FinishReason::kStop)
          << what << ": " << outcome->error;
      EXPECT_FALSE(outcome->tokens.empty()) << what;
      cuda::expect_greedy_choices(model.cpu(), prompts[i], outcome->tokens, margin, what, checked,
                                  ties);
    }
  }
  std::printf(
      "[greedy vs cpu] %d choices checked, %d ties (within %.3g of the row's largest "
      "|logit|)\n",
      checked, ties, static_cast<double>(margin));
  EXPECT_GT(checked, 0);
  if (margin == 0.0f) {
    EXPECT_EQ(ties, 0);
  }
}

// The failures `check` reports, intercepted (they do not fail the test that runs it).
template <typename Check>
std::vector<std::string> failures_of(Check check) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    check();
  }
  std::vector<std::string> messages;
  for (int i = 0; i < results.size(); ++i)
    messages.emplace_back(results.GetTestPartResult(i).message());
  return messages;
}

// The greedy checks themselves (cuda::expect_greedy_choices, expect_same_greedy_or_tied), on
// every machine: the CPU model's own greedy tokens pass with no margin and no tie; the same
// tokens with one replaced by the CPU's least likely token fail, with the GPU's margin too,
// and so does a second run that parts from the first there.
TEST(TestDeviceTest, GreedyChecksRefuseAChoiceBeyondTheMargin) {
  auto cpu = make_preset_model(ModelPreset::kTiny, Architecture::kLlama, 3,
                               ModelOptions{.num_threads = 1});
  ASSERT_TRUE(cpu.has_value()) << cpu.error().message;
  auto engine = Engine::create(cpu->get(), small_engine(), {});
  ASSERT_TRUE(engine.has_value()) << engine.error().message;
  const std::vector<int32_t> prompt = test_prompt(20, 5);
  const Outcome greedy = run_greedy(**engine, prompt, 6);
  ASSERT_EQ(greedy.tokens.size(), 6u);
  engine->reset();
  int checked = 0, ties = 0;
  cuda::expect_greedy_choices(**cpu, prompt, greedy.tokens, 0.0f, "greedy", checked, ties);
  EXPECT_EQ(checked, 6);
  EXPECT_EQ(ties, 0);
  cuda::expect_same_greedy_or_tied(**cpu, prompt, greedy.tokens, greedy.tokens, "same");
  // The CPU's least likely token after the prompt and the first three.
  std::vector<int32_t> context = prompt;
  context.insert(context.end(), greedy.tokens.begin(), greedy.tokens.begin() + 3);
  auto pool = (*cpu)->make_kv_pool(4, 16, KvDtype::kF32);
  ASSERT_TRUE(pool.has_value());
  const std::vector<PageId> table = {make_page_id(0), make_page_id(1)};
  const ForwardSequence seq{.token_ids = context, .page_table = table};
  ForwardOutput out;
  ASSERT_TRUE((*cpu)->forward(std::span(&seq, 1), **pool, out).has_value());
  std::vector<int32_t> wrong = greedy.tokens;
  wrong[3] = static_cast<int32_t>(std::min_element(out.logits.begin(), out.logits.end()) -
                                  out.logits.begin());
  ASSERT_NE(wrong[3], greedy.tokens[3]);
  for (const auto& [what, failures] :
       {std::pair{"expect_greedy_choices", failures_of([&] {
                    cuda::expect_greedy_choices(**cpu, prompt, wrong, 2 * cuda::kBf16LogitError,
                                                "wrong", checked, ties);
                  })},
        std::pair{"expect_same_greedy_or_tied", failures_of([&] {
                    cuda::expect_same_greedy_or_tied(**cpu, prompt, greedy.tokens, wrong, "parted");
                  })}}) {
    ASSERT_FALSE(failures.empty()) << what;
    EXPECT_NE(failures[0].find("token 3: the device chose"), std::string::npos)
        << what << ": " << failures[0];
    EXPECT_NE(failures[0].find("beyond the bound"), std::string::npos)
        << what << ": " << failures[0];
  }
}

}  // namespace
}  // namespace strata
