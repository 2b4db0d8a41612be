// What the GPU tests share: skipping without a usable device (failing instead under
// STRATA_REQUIRE_GPU=1, which scripts/gpu-check.sh sets) and the smoke switch
// (STRATA_GPU_SMOKE=1: fewer shapes, for a rerun within the device time).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string_view>

#include "cuda/cuda_device.h"

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

}  // namespace strata::cuda
