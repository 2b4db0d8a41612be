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

  int64_t blas_min_rows_;
  AlignedBuffer a_bf16_;  // activations rounded to BF16 for the current product
};

}  // namespace strata
