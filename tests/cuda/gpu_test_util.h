// What the GPU tests share: skipping without a usable device (failing instead under
// STRATA_REQUIRE_GPU=1, which scripts/gpu-check.sh sets), the smoke switch
// (STRATA_GPU_SMOKE=1: fewer shapes, for a rerun within the device time), the models the
// GPU tests make, the error BF16 leaves in a logit, and greedy outputs checked against the
// CPU model within it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cuda/cuda_device.h"
#include "model/make_model.h"
#include "model/model.h"

namespace strata::cuda {

inline bool smoke() {
  const char* v = std::getenv("STRATA_GPU_SMOKE");
  return v != nullptr && std::string_view(v) == "1";
}

inline bool gpu_required() {
  const char* v = std::getenv("STRATA_REQUIRE_GPU");
  return v != nullptr && std::string_view(v) == "1";
}

// Skips the test (fails it under STRATA_REQUIRE_GPU=1) without a usable device.
#define STRATA_NEED_GPU()                                   \
  do {                                                      \
    auto device = probe_device(0);                          \
    if (!device) {                                          \
      if (gpu_required()) FAIL() << device.error().message; \
      GTEST_SKIP() << device.error().message;               \
    }                                                       \
  } while (0)

// How far a logit of the GPU model (BF16 weights and activations, F32 accumulation) may lie
// from the CPU engine's (F32), as a fraction of the row's largest |logit|: what
// GpuModelTest.LogitsMatchTheCpuEngineStepByStep holds each logit to, and what the greedy
// comparisons against the CPU allow for (two logits, each this far off, may swap).
inline constexpr float kBf16LogitError = 0.04f;

// Every (preset, architecture) a GPU test makes its model in, through gpu_test_config (the
// GPU tests in tests/cuda and the engine tests under STRATA_TEST_DEVICE=cuda, test_device.h).
// GpuModelTest.EveryGpuTestModelPassesTheShapeChecks checks each against GpuModel::check on
// every machine, so a model the GPU would refuse fails here, not on the first GPU run.
struct GpuTestShape {
  ModelPreset preset;
  Architecture arch;
};
inline constexpr GpuTestShape kGpuTestShapes[] = {
    {ModelPreset::kDemo, Architecture::kQwen3},  // tests/cuda
    {ModelPreset::kDemo, Architecture::kLlama},  // the forward against the CPU's
    {ModelPreset::kDemo, Architecture::kQwen2},
    {ModelPreset::kTiny, Architecture::kLlama},  // tests/engine (test_device.h)
};

inline std::string gpu_test_shape_name(ModelPreset preset, Architecture arch) {
  return std::string(model_preset_name(preset)) + "/" + std::string(architecture_model_type(arch));
}

// The preset's config with the GPU kernels' head size (64): make_model gives the Llama and
// Qwen2 presets hidden / heads (32 for demo, 16 for tiny), which GpuModel::create refuses.
// The query and KV widths follow the head size; the hidden size stays. kInvalidArgument for
// a pair missing from kGpuTestShapes (add it there, so the shape check covers it).
inline Result<ModelConfig> gpu_test_config(ModelPreset preset, Architecture arch) {
  bool listed = false;
  for (const GpuTestShape& s : kGpuTestShapes)
    listed = listed || (s.preset == preset && s.arch == arch);
  if (!listed) {
    return bad_argument(gpu_test_shape_name(preset, arch) +
                        " is not in kGpuTestShapes (tests/cuda/gpu_test_util.h): add it, so that "
                        "GpuModelTest.EveryGpuTestModelPassesTheShapeChecks checks it");
  }
  ModelConfig c = preset_config(preset, arch);
  c.head_dim = 64;
  if (auto s = validate_model_config(c); !s) return std::unexpected(s.error());
  return c;
}

// The CPU model of gpu_test_config's shape with random F32 weights (make_random_tensors),
// the reference the GPU model is made from (from its weights()).
inline Result<std::unique_ptr<Model>> make_gpu_test_model(ModelPreset preset, Architecture arch,
                                                          uint64_t seed,
                                                          const ModelOptions& options = {}) {
  auto config = gpu_test_config(preset, arch);
  if (!config) return std::unexpected(config.error());
  const TensorStore tensors = make_random_tensors(*config, seed, TensorDtype::kF32);
  return Model::from_tensors(*config, tensors, options);
}

// The greedy choices `tokens` a device answered to `prompt`, checked against the CPU model
// teacher-forced along them: at each step the CPU model reads the prompt and the device's
// tokens before it (one forward for the prompt, then one a token), and the device's token
// must be the CPU's argmax, unless the CPU's margin between its argmax and the device's token
// is within `margin_fraction` of the row's largest |logit|: a tie the device's rounding may
// break either way. Teacher forcing keeps one such tie from sending the rest of the sequence
// down another path, which a comparison of whole outputs would count against the device.
// Adds to `checked` and `ties` (choices that differ from the CPU's within the margin).
inline void expect_greedy_choices(Model& cpu, const std::vector<int32_t>& prompt,
                                  const std::vector<int32_t>& tokens, float margin_fraction,
                                  const std::string& what, int& checked, int& ties) {
  const int32_t page_size = 16;
  const auto total = static_cast<int32_t>(prompt.size() + tokens.size());
  const int32_t pages = (total + page_size - 1) / page_size;
  auto pool = cpu.make_kv_pool(pages, page_size, KvDtype::kF32);
  ASSERT_TRUE(pool.has_value()) << pool.error().message;
  std::vector<PageId> table;
  for (int32_t p = 0; p < pages; ++p) table.push_back(make_page_id(p));
  const auto vocab = static_cast<size_t>(cpu.config().vocab_size);
  std::vector<int32_t> input = prompt;
  int64_t start = 0;
  ForwardOutput out;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const ForwardSequence seq{
        .token_ids = input, .start_position = start, .page_table = table, .want_logits = true};
    const Status st = cpu.forward(std::span(&seq, 1), **pool, out);
    ASSERT_TRUE(st.has_value()) << what << ": " << st.error().message;
    ASSERT_EQ(out.logits.size(), vocab) << what;
    const std::span<const float> row(out.logits);
    const auto best = static_cast<size_t>(std::max_element(row.begin(), row.end()) - row.begin());
    float largest = 0.0f;
    for (float v : row) largest = std::max(largest, std::fabs(v));
    const auto chosen = static_cast<size_t>(tokens[i]);
    ASSERT_LT(chosen, vocab) << what << " token " << i;
    ++checked;
    if (chosen != best) {
      const float margin = row[best] - row[chosen];
      const float bound = margin_fraction * largest;
      if (margin <= bound) {
        ++ties;
      } else {
        ADD_FAILURE() << what << ", token " << i << ": the device chose " << chosen
                      << " (CPU logit " << row[chosen] << "), the CPU " << best << " (" << row[best]
                      << "): a margin of " << margin << " beyond the bound " << bound << " ("
                      << margin_fraction << " of the row's largest |logit| " << largest << ")";
      }
    }
    start += static_cast<int64_t>(input.size());
    input.assign(1, tokens[i]);
  }
}

// Two greedy runs on the GPU that a test expects to agree (a prompt computed against the same
// prompt's prefix loaded back, a colocated worker against a P/D pair): the same tokens, or,
// where they part, a near-tie. Runs of other batch shapes round differently in BF16 (the
// products run at another M), so a choice between two tokens whose logits lie within the
// error may go either way; then both runs must pass expect_greedy_choices against the CPU
// model with the GPU's margin (the token where they part is not the CPU's argmax in at least
// one of them, so it is counted as a tie there, not passed over). Prints where they part.
inline void expect_same_greedy_or_tied(Model& cpu, const std::vector<int32_t>& prompt,
                                       const std::vector<int32_t>& first,
                                       const std::vector<int32_t>& second,
                                       const std::string& what) {
  if (first == second) return;
  size_t at = 0;
  while (at < first.size() && at < second.size() && first[at] == second[at]) ++at;
  std::printf("[greedy tie] %s: the runs part at token %zu (%d against %d)\n", what.c_str(), at,
              at < first.size() ? first[at] : -1, at < second.size() ? second[at] : -1);
  int checked = 0, ties = 0;
  expect_greedy_choices(cpu, prompt, first, 2 * kBf16LogitError, what + ", first run", checked,
                        ties);
  expect_greedy_choices(cpu, prompt, second, 2 * kBf16LogitError, what + ", second run", checked,
                        ties);
  const size_t shorter = std::min(first.size(), second.size());
  if (at < shorter) {
    EXPECT_GT(ties, 0) << what << ": the runs part at token " << at;
  } else {
    ADD_FAILURE() << what << ": one run stopped at token " << shorter << ", the other did not";
  }
}

}  // namespace strata::cuda
