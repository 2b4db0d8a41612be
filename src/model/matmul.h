// Matrix products with the model's weights: C = A W^T (+ C), A [m][k] activations in
// F32, W [n][k] a WeightMatrix.
//
// F32 weights:
// - m >= blas_min_rows: OpenBLAS cblas_sgemm, the columns of C split into one contiguous
//   range per thread of our pool, each calling single-threaded OpenBLAS (the model sets
//   OpenBLAS to one thread, so its own workers never compete with ours).
// - m < blas_min_rows (decode, batched decode, short prefills such as a full prefix hit's
//   last partial page): our kernel, bound by reading W once from memory; it streams W one
//   row at a time (one sequential stream per thread) against up to 4 rows of A held in
//   cache, or 4 rows of W at a time against every row of A from 4 rows of A on. BLAS's
//   GEMM packs W before multiplying, which for one row costs more than the product itself.
//   The crossover depends on the vector width. With AVX-512 (32 vector registers hold
//   the 4x4 block of accumulators) our kernel measured 2-2.6x faster than BLAS for every
//   m from 8 to 64 (docs/full-hit.md). With AVX2 (16 registers: the block spills) its cost
//   grows with every row of A and BLAS is 3-12x faster from 4 rows on (docs/model.md,
//   "Small products"), so there BLAS takes over at 4 rows.
// BF16 weights (packed, weights.h), any m: A is rounded to BF16 once, then our kernel
// multiplies 12-row tiles of A by 32-row panels of W with vdpbf16ps (two products per
// lane and instruction: twice the F32 FMA rate) where the CPU has AVX512-BF16, and an
// exact F32 emulation elsewhere. Debian's OpenBLAS does not export cblas_sbgemm.
// Quantized weights (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K; weights.h):
// - m < kQuantGemvMaxRows (decode, batched decode): each row of A is quantized once to
//   8-bit blocks, then model/quant_dot.h's kernels (AVX-512 VNNI, AVX2 or scalar, chosen
//   at run time) stream W's packed rows, each row of W against every row of A while it
//   is in L1. Bound by reading W: its bytes are the file's.
// - larger m (prefill): each task dequantizes 32-row panels of W into the packed BF16
//   layout in a scratch of its own and runs the BF16 kernel over every row of A (A
//   rounded to BF16 once): the dequantization is paid once per panel for all m rows.
#pragma once

#include <cstdint>
#include <vector>

#include "model/aligned_buffer.h"
#include "model/thread_pool.h"
#include "model/weights.h"

namespace strata {

class Matmul {
 public:
#if defined(__AVX512F__)
  static constexpr int64_t kDefaultBlasMinRows = 64;
#else
  static constexpr int64_t kDefaultBlasMinRows = 4;
#endif
  // Quantized weights: products with fewer rows of A use the quantized dot products.
  static constexpr int64_t kQuantGemvMaxRows = 16;

  // F32 products with fewer than blas_min_rows rows of A use our kernel.
  explicit Matmul(int num_threads, int64_t blas_min_rows = kDefaultBlasMinRows);

  // c[i * ldc + j] (+)= sum_k a[i * lda + k] * w[j][k] for i < m, j < w.rows().
  // With `accumulate` the product is added to c (the residual stream), else it
  // replaces it. a and c must not overlap.
  void run(ThreadPool& pool, const float* a, int64_t m, int64_t lda, const WeightMatrix& w,
           float* c, int64_t ldc, bool accumulate);

  // Sets OpenBLAS to one thread (process-wide); the constructor calls it.
  static void use_single_threaded_blas();

 private:
  void blas(ThreadPool& pool, const float* a, int64_t m, int64_t lda, const WeightMatrix& w,
            float* c, int64_t ldc, bool accumulate);
  void small(ThreadPool& pool, const float* a, int64_t m, int64_t lda, const WeightMatrix& w,
             float* c, int64_t ldc, bool accumulate);
  void bf16(ThreadPool& pool, const float* a, int64_t m, int64_t lda, const WeightMatrix& w,
            float* c, int64_t ldc, bool accumulate);
  void quant_gemv(ThreadPool& pool, const float* a, int64_t m, int64_t lda, const WeightMatrix& w,
                  float* c, int64_t ldc, bool accumulate);
  void quant_gemm(ThreadPool& pool, const float* a, int64_t m, int64_t lda, const WeightMatrix& w,
                  float* c, int64_t ldc, bool accumulate);
  // A rounded to BF16 into a_bf16_, rows of kp (k rounded up to even) values.
  const uint16_t* round_to_bf16(ThreadPool& pool, const float* a, int64_t m, int64_t lda, int64_t k,
                                int64_t kp);

  int64_t blas_min_rows_;
  AlignedBuffer a_bf16_;   // activations rounded to BF16 for the current product
  AlignedBuffer a_quant_;  // activations quantized for the current product
  // Per thread of the pool: a panel of W dequantized (F32, then packed BF16).
  std::vector<AlignedBuffer> panel_f32_;
  std::vector<AlignedBuffer> panel_bf16_;
};

}  // namespace strata
