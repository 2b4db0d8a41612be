// Where the engine tests run their model (issue 30: "the engine tests take
// STRATA_TEST_DEVICE=cuda and pass on a GPU"):
//
//   STRATA_TEST_DEVICE=cpu (or unset)  the CPU engine's Model, the preset as named
//   STRATA_TEST_DEVICE=cuda            the same weights on the GPU (cuda::GpuModel), one per
//                                      engine, sized to its options as `strata serve
//                                      --device cuda` sizes it; without a usable GPU every
//                                      such test skips (fails under STRATA_REQUIRE_GPU=1,
//                                      which scripts/gpu-check.sh sets), never passes
//   STRATA_TEST_DEVICE=own-kv          the CPU model keeping its KV in memory of its own and
//                                      drawing its sampled rows itself, as the GPU model does
//                                      (own_kv_model.h): the cuda runs' paths (a counting
//                                      pool, copies through the model's copy devices, tokens
//                                      instead of logits) and their model, on any machine
//
// On a device other than the CPU the model is the preset's with the GPU kernels' head size
// (64: cuda::gpu_test_config, whose shapes GpuModelTest.EveryGpuTestModelPassesTheShapeChecks
// checks on every machine) and the LM head's weights ×8. The ×8 does not keep BF16's
// rounding from flipping a greedy choice between two runs that should agree: a power of two
// scales every logit and every rounding error alike, so the top two tokens' margin relative
// to the error is what it was. A comparison with the CPU model allows for it
// (test_device_test.cc, GreedyOutputsAgreeWithTheCpuModel: near-ties counted, not failed).
// The own-kv run checks that the tests hold on that model; on a GPU only the arithmetic
// differs.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "../cuda/gpu_test_util.h"
#include "cuda/cuda_device.h"
#include "cuda/gpu_model.h"
#include "engine/engine.h"
#include "model/make_model.h"
#include "model/model.h"
#include "own_kv_model.h"

namespace strata {

enum class TestDevice : uint8_t { kCpu, kCuda, kOwnKv };

inline Result<TestDevice> test_device() {
  const char* v = std::getenv("STRATA_TEST_DEVICE");
  const std::string_view name = v == nullptr ? "" : v;
  if (name.empty() || name == "cpu") return TestDevice::kCpu;
  if (name == "cuda") return TestDevice::kCuda;
  if (name == "own-kv") return TestDevice::kOwnKv;
  return bad_argument("STRATA_TEST_DEVICE=" + std::string(name) + ": cpu, cuda or own-kv");
}

// The preset's model on the test device, and the forward model of each engine made on it.
class TestModel {
 public:
  // kUnsupported when the device is cuda and there is no usable GPU (or no CUDA build):
  // STRATA_TEST_MODEL below skips then.
  static Result<TestModel> make(ModelPreset preset, Architecture arch, uint64_t seed,
                                ModelOptions options = {}) {
    auto device = test_device();
    if (!device) return std::unexpected(device.error());
    TestModel m;
    m.device_ = *device;
    m.options_ = options;
    if (m.device_ == TestDevice::kCuda) {
      auto probed = cuda::probe_device(0);
      if (!probed) return std::unexpected(probed.error());
    }
    auto config = device_config(preset, arch, m.device_);
    if (!config) return std::unexpected(config.error());
    m.config_ = *config;
    m.tensors_ = std::make_unique<TensorStore>(make_random_tensors(
        m.config_, seed, TensorDtype::kF32, m.device_ == TestDevice::kCpu ? 1.0 : 8.0));
    auto cpu = Model::from_tensors(m.config_, *m.tensors_, options);
    if (!cpu) return std::unexpected(cpu.error());
    m.cpu_ = std::move(*cpu);
    return m;
  }

  // The config make() gives `device`: the preset's on the CPU; on the others the GPU tests'
  // (cuda::gpu_test_config: head_dim 64; kInvalidArgument for a preset and architecture
  // missing from cuda::kGpuTestShapes).
  static Result<ModelConfig> device_config(ModelPreset preset, Architecture arch,
                                           TestDevice device) {
    if (device != TestDevice::kCpu) return cuda::gpu_test_config(preset, arch);
    ModelConfig c = preset_config(preset, arch);
    if (auto s = validate_model_config(c); !s) return std::unexpected(s.error());
    return c;
  }

  TestDevice device() const { return device_; }
  const ModelConfig& config() const { return cpu_->config(); }
  // The model on the host (the CPU device's forward model, and every device's reference).
  Model& cpu() { return *cpu_; }

  // The forward model an engine with `o` runs on: the CPU model itself, or one made for it
  // with the pool's pages and the batch limits `o` implies, kept until this object goes
  // (declare it before the engines that use it).
  Result<ForwardModel*> forward_model(const EngineOptions& o) {
    if (device_ == TestDevice::kCpu) return cpu_.get();
    const cuda::GpuModelOptions g = cuda::gpu_options_for_engine(
        o.page_size, o.kv_cache_tokens, o.max_running_requests, o.chunked_prefill_size);
    if (device_ == TestDevice::kCuda) {
      auto gpu = cuda::GpuModel::create(config(), cpu_->weights(), g);
      if (!gpu) return std::unexpected(gpu.error());
      models_.push_back(std::move(*gpu));
      return models_.back().get();
    }
    auto inner = Model::from_tensors(config_, *tensors_, options_);
    if (!inner) return std::unexpected(inner.error());
    auto own = std::make_unique<OwnKvModel>(std::move(*inner), g.num_pages, g.page_size);
    own->sample_ = true;
    models_.push_back(std::move(own));
    return models_.back().get();
  }

 private:
  TestDevice device_ = TestDevice::kCpu;
  ModelOptions options_;
  ModelConfig config_;
  std::unique_ptr<TensorStore> tensors_;  // the weights, for own-kv models
  std::unique_ptr<Model> cpu_;
  std::vector<std::unique_ptr<ForwardModel>> models_;
};

// Engine::create on the test model's device. STRATA_TEST_KV_DTYPE (e.g. int8) sets the
// pool's dtype of engines on the CPU model (tests/CMakeLists.txt runs the tier suites once
// more with 8-bit pages, issue 54); the own-kv and cuda models keep their own.
inline Result<std::unique_ptr<Engine>> create_test_engine(
    TestModel& model, EngineOptions o, std::function<void(std::vector<KvEvent>)> publish = {}) {
  if (const char* dtype = std::getenv("STRATA_TEST_KV_DTYPE");
      dtype != nullptr && test_device().value_or(TestDevice::kCpu) == TestDevice::kCpu) {
    auto parsed = parse_kv_dtype(dtype);
    if (!parsed) return std::unexpected(parsed.error());
    o.kv_dtype = *parsed;
  }
  auto forward = model.forward_model(o);
  if (!forward) return std::unexpected(forward.error());
  return Engine::create(*forward, std::move(o), std::move(publish));
}

}  // namespace strata

// In a fixture's SetUp (or a test): `var` = the preset's TestModel, or the test skips where
// STRATA_TEST_DEVICE=cuda finds no GPU (fails under STRATA_REQUIRE_GPU=1) and fails on any
// other error.
#define STRATA_TEST_MODEL(var, ...)                                           \
  do {                                                                        \
    auto made_ = ::strata::TestModel::make(__VA_ARGS__);                      \
    if (!made_) {                                                             \
      if (made_.error().code == ::strata::ErrorCode::kUnsupported &&          \
          ::strata::test_device().value_or(::strata::TestDevice::kCpu) ==     \
              ::strata::TestDevice::kCuda &&                                  \
          !::strata::cuda::gpu_required()) {                                  \
        GTEST_SKIP() << "STRATA_TEST_DEVICE=cuda: " << made_.error().message; \
      }                                                                       \
      FAIL() << made_.error().message;                                        \
    }                                                                         \
    var = std::move(*made_);                                                  \
  } while (0)
