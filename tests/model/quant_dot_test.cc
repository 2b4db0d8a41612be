// The quantized dot products against F32 products of the dequantized weights, within the
// activation's 8-bit rounding, in every implementation this processor runs.
#include "model/quant_dot.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "memory/kv_dtype.h"

namespace strata {
namespace {

std::vector<std::byte> random_weights(GgmlType type, int64_t n, std::mt19937& rng) {
  std::vector<std::byte> w(static_cast<size_t>(ggml_row_bytes(type, n)));
  if (type == GgmlType::kQ5_K) {
    // No quantizer: random bits with sane scales.
    for (std::byte& b : w) b = static_cast<std::byte>(rng());
    std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
    for (int64_t b = 0; b < n / 256; ++b) {
      for (int k = 0; k < 2; ++k) {
        const uint16_t h = f32_to_f16(scale(rng));
        std::memcpy(w.data() + b * 176 + 2 * k, &h, 2);
      }
    }
    return w;
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = normal(rng);
  quantize_row(type, x.data(), w.data(), n);
  return w;
}

class QuantDotTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(QuantDotTest, MatchesTheDequantizedProduct) {
  const GgmlType type = GetParam();
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t n : {256, 512, 1280}) {
    for (int trial = 0; trial < 20; ++trial) {
      const std::vector<std::byte> w = random_weights(type, n, rng);
      std::vector<float> wf(static_cast<size_t>(n)), x(static_cast<size_t>(n));
      dequantize_row(type, w.data(), wf.data(), n);
      for (float& v : x) v = normal(rng) * (trial % 5 == 0 ? 1000.0f : 1.0f);
      if (trial == 1) std::fill(x.begin(), x.begin() + 256, 0.0f);  // zero blocks
      double want = 0, bound = 0, magnitude = 0;
      const int64_t block = type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0 ? 32 : 256;
      for (int64_t b = 0; b < n / block; ++b) {
        float amax = 0;
        for (int64_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(x[b * block + i]));
        for (int64_t i = b * block; i < (b + 1) * block; ++i) {
          want += static_cast<double>(wf[i]) * x[i];
          bound += std::fabs(wf[i]) * amax / 254.0;
          magnitude += std::fabs(wf[i] * x[i]);
        }
      }
      bound = bound * 1.01 + 1e-5 * magnitude + 1e-6;
      std::vector<float> results;
      for (QuantIsa isa : {QuantIsa::kScalar, QuantIsa::kAvx2, QuantIsa::kAvx512Vnni}) {
        if (!quant_isa_supported(isa)) continue;
        const QuantKernels k = quant_kernels(type, isa);
        std::vector<std::byte> a(static_cast<size_t>(quant_activation_bytes(type, n)));
        k.quantize(x.data(), a.data(), n);
        const float got = k.dot(w.data(), a.data(), n);
        EXPECT_NEAR(got, want, bound) << quant_isa_name(isa) << " n " << n << " trial " << trial;
        results.push_back(got);
      }
      // The implementations sum the same integers: they differ by float rounding only.
      for (float r : results) EXPECT_NEAR(r, results[0], 1e-5 * magnitude + 1e-6);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, QuantDotTest,
                         ::testing::Values(GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_K,
                                           GgmlType::kQ5_K, GgmlType::kQ6_K),
                         [](const auto& info) {
                           return std::string(
                               ggml_type_info(static_cast<uint32_t>(info.param))->name);
                         });

TEST(QuantIsaTest, TheBestIsSupported) {
  EXPECT_TRUE(quant_isa_supported(QuantIsa::kScalar));
  EXPECT_TRUE(quant_isa_supported(quant_isa_best()));
  std::printf("quantized kernels: %s\n", std::string(quant_isa_name(quant_isa_best())).c_str());
}

}  // namespace
}  // namespace strata
