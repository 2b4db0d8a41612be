// cuBLASLt's products (cuda/gemm.h) against a CPU reference on the same BF16 inputs, at the
// shapes the forward pass runs: a decode row, a batch of rows, a prefill's tokens; the fused
// q|k|v, o_proj, the MLP and the LM head of a Qwen3-0.6B-shaped model, and sizes that are
// multiples of nothing. Both outputs (BF16 and F32). On a first GPU run this separates "the
// products are wrong" from "the kernels around them are" when the forward pass disagrees
// with the CPU engine (gpu_model_test.cc).
//
// Without a GPU (or CUDA) the products skip (fail under STRATA_REQUIRE_GPU=1).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_device.h"
#include "cuda/gemm.h"
#include "gpu_test_util.h"
#include "memory/kv_dtype.h"

namespace strata::cuda {
namespace {

struct Shape {
  int64_t m, n, k;
};

std::vector<uint16_t> random_bf16(std::mt19937& rng, size_t count) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> v(count);
  for (auto& x : v) x = f32_to_bf16(normal(rng));
  return v;
}

// y = x w^T over `shape` on the GPU, compared element by element with the product of the
// same BF16 values in double: within 2^-7 of the row's sum of |x w| terms for a BF16 output
// (its rounding is 2^-8 of the value, which that sum bounds), 1e-4 of it for F32 (F32
// accumulation over k <= 4,096 terms). A failure names the shape, the element and both values.
void check_product(Gemm& gemm, const Stream& stream, const Shape& s, bool y_f32,
                   std::mt19937& rng) {
  const std::string what =
      fmt::format("{} x {} x {}, {} out", s.m, s.n, s.k, y_f32 ? "F32" : "BF16");
  const auto x = random_bf16(rng, static_cast<size_t>(s.m * s.k));
  const auto w = random_bf16(rng, static_cast<size_t>(s.n * s.k));
  const size_t y_bytes = static_cast<size_t>(s.m * s.n) * (y_f32 ? 4 : 2);
  auto dx = DeviceBuffer::allocate(x.size() * 2);
  auto dw = DeviceBuffer::allocate(w.size() * 2);
  auto dy = DeviceBuffer::allocate(y_bytes);
  ASSERT_TRUE(dx.has_value() && dw.has_value() && dy.has_value()) << what;
  ASSERT_TRUE(dx->copy_from_host(x.data(), x.size() * 2).has_value());
  ASSERT_TRUE(dw->copy_from_host(w.data(), w.size() * 2).has_value());
  const Status ran = gemm.linear(dx->as<uint16_t>(), dw->as<uint16_t>(), dy->data(), y_f32, s.m,
                                 s.n, s.k, stream.handle());
  ASSERT_TRUE(ran.has_value()) << what << ": " << ran.error().message;
  const Status done = stream.synchronize();
  ASSERT_TRUE(done.has_value()) << what << ": " << done.error().message;
  std::vector<float> got(static_cast<size_t>(s.m * s.n));
  if (y_f32) {
    ASSERT_TRUE(dy->copy_to_host(got.data(), y_bytes).has_value());
  } else {
    std::vector<uint16_t> raw(got.size());
    ASSERT_TRUE(dy->copy_to_host(raw.data(), y_bytes).has_value());
    for (size_t i = 0; i < raw.size(); ++i) got[i] = bf16_to_f32(raw[i]);
  }
  int bad = 0;
  double worst = 0.0;
  for (int64_t i = 0; i < s.m && bad < 5; ++i) {
    for (int64_t j = 0; j < s.n && bad < 5; ++j) {
      double want = 0.0, magnitude = 0.0;
      for (int64_t t = 0; t < s.k; ++t) {
        const double term = static_cast<double>(bf16_to_f32(x[static_cast<size_t>(i * s.k + t)])) *
                            bf16_to_f32(w[static_cast<size_t>(j * s.k + t)]);
        want += term;
        magnitude += std::fabs(term);
      }
      const double have = got[static_cast<size_t>(i * s.n + j)];
      const double bound = (y_f32 ? 1e-4 : 1.0 / 128) * magnitude + 1e-6;
      const double err = std::fabs(have - want);
      worst = std::max(worst, err / (magnitude + 1e-30));
      if (!(err <= bound)) {  // NaN fails too
        ADD_FAILURE() << what << ": y[" << i << "][" << j << "] = " << have << ", want " << want
                      << " (|error| " << err << " > bound " << bound << ")";
        ++bad;
      }
    }
  }
  std::printf("[gemm] %s: worst |error| / sum|x w| = %.3g\n", what.c_str(), worst);
}

TEST(GemmTest, ProductsMatchTheCpuAtTheForwardPassShapes) {
  STRATA_NEED_GPU();
  auto gemm = Gemm::create();
  ASSERT_TRUE(gemm.has_value()) << gemm.error().message;
  auto stream = Stream::create();
  ASSERT_TRUE(stream.has_value()) << stream.error().message;
  // Qwen3-0.6B: hidden 1,024, q|k|v 2,048 + 2 x 1,024 = 4,096, FFN 3,072 (gate|up 6,144),
  // vocabulary 151,936 (the LM head on one row).
  std::vector<Shape> shapes = {
      {1, 4096, 1024},  {1, 1024, 2048},   {1, 6144, 1024},   {1, 1024, 3072}, {8, 4096, 1024},
      {64, 6144, 1024}, {300, 1024, 3072}, {1, 151936, 1024}, {37, 1000, 96},  {5, 77, 40}};
  if (smoke()) shapes = {{1, 4096, 1024}, {64, 6144, 1024}, {37, 1000, 96}};
  std::mt19937 rng(5);
  for (const Shape& s : shapes) {
    for (bool y_f32 : {false, true}) check_product(**gemm, *stream, s, y_f32, rng);
  }
}

TEST(GemmTest, BadSizesAndNullPointersAreRefusedBeforeCuBlasLt) {
  STRATA_NEED_GPU();
  auto gemm = Gemm::create();
  ASSERT_TRUE(gemm.has_value()) << gemm.error().message;
  auto buf = DeviceBuffer::allocate(64);
  ASSERT_TRUE(buf.has_value());
  const auto* p = buf->as<uint16_t>();
  EXPECT_EQ((*gemm)->linear(p, p, buf->data(), true, 0, 4, 4, nullptr).error().code,
            ErrorCode::kInvalidArgument);
  EXPECT_EQ((*gemm)->linear(nullptr, p, buf->data(), true, 1, 4, 4, nullptr).error().code,
            ErrorCode::kInvalidArgument);
}

// Creating one answers on every machine: where a GPU is usable it loads cuBLASLt (or says
// by name what it tried), and elsewhere it says why there is none, never a crash.
TEST(GemmTest, CreationLoadsCuBlasLtOrSaysWhy) {
  auto gemm = Gemm::create();
  if (probe_device(0)) {
    EXPECT_TRUE(gemm.has_value()) << gemm.error().message;
    return;
  }
  ASSERT_FALSE(gemm.has_value());
  EXPECT_EQ(gemm.error().code, ErrorCode::kUnsupported);
  EXPECT_FALSE(gemm.error().message.empty());
}

}  // namespace
}  // namespace strata::cuda
