// Matmul over quantized weights (decode's GEMV through the quantized dot products,
// prefill's GEMM through BF16 panels) against F32 products of the dequantized weights.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "model/matmul.h"
#include "model/thread_pool.h"
#include "model/weights.h"

namespace strata {
namespace {

class QuantMatmulTest : public ::testing::TestWithParam<WeightDtype> {};

TEST_P(QuantMatmulTest, MatchesTheDequantizedProduct) {
  const WeightDtype dtype = GetParam();
  const int64_t n = 45, k = 512;  // a partial last panel of 32 rows
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  WeightMatrix w(n, k, dtype);
  std::vector<float> row(k);
  for (int64_t r = 0; r < n; ++r) {
    for (float& v : row) v = normal(rng);
    w.set_row(r, row.data());
  }
  std::vector<float> wf(static_cast<size_t>(n * k));
  w.rows_to_f32(0, n, wf.data());
  ThreadPool pool(2);
  Matmul matmul(2);
  for (int64_t m : {1, 3, 15, 16, 40}) {
    const int64_t lda = k + 8, ldc = n + 3;
    std::vector<float> a(static_cast<size_t>(m * lda));
    for (float& v : a) v = normal(rng);
    for (bool accumulate : {false, true}) {
      std::vector<float> c(static_cast<size_t>(m * ldc), 0.5f);
      matmul.run(pool, a.data(), m, lda, w, c.data(), ldc, accumulate);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double want = accumulate ? 0.5 : 0.0, magnitude = 0;
          for (int64_t t = 0; t < k; ++t) {
            want += static_cast<double>(a[i * lda + t]) * wf[j * k + t];
            magnitude += std::fabs(a[i * lda + t] * wf[j * k + t]);
          }
          // 8-bit activations (decode) or BF16 rounding of both sides (prefill): a few
          // parts in a thousand of the products' magnitude.
          ASSERT_NEAR(c[i * ldc + j], want, 0.01 * magnitude)
              << weight_dtype_name(dtype) << " m " << m << " row " << i << " col " << j;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, QuantMatmulTest,
                         ::testing::Values(WeightDtype::kQ8_0, WeightDtype::kQ4_0,
                                           WeightDtype::kQ4_K, WeightDtype::kQ6_K),
                         [](const auto& info) {
                           return std::string(weight_dtype_name(info.param));
                         });

TEST(QuantWeightsTest, NamesAndFallbacks) {
  EXPECT_EQ(parse_weight_dtype("q4_k"), WeightDtype::kQ4_K);
  EXPECT_FALSE(parse_weight_dtype("q3_k"));
  EXPECT_EQ(weight_dtype_of_ggml(GgmlType::kQ6_K), WeightDtype::kQ6_K);
  EXPECT_FALSE(weight_dtype_of_ggml(GgmlType::kF16));
  WeightMatrix w(2, 256, WeightDtype::kQ4_K);
  EXPECT_EQ(w.size_bytes(), 288u);
  EXPECT_EQ(w.row_bytes(), 144);
}

}  // namespace
}  // namespace strata
