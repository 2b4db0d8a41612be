// What the GPU tests share: skipping without a usable device (failing instead under
// STRATA_REQUIRE_GPU=1, which scripts/gpu-check.sh sets), the smoke switch
// (STRATA_GPU_SMOKE=1: fewer shapes, for a rerun within the device time), the models the
// GPU tests make and the error BF16 leaves in a logit.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

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

}  // namespace strata::cuda
