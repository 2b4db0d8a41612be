#include "model/matmul.h"

#include <cblas.h>

#include <algorithm>

#include "common/check.h"
#include "memory/kv_dtype.h"
#include "model/simd.h"

namespace strata {

namespace {

using simd::F32x16;
using simd::kLanes;
using simd::U32x16;

// Rows of W per task of the small-m kernel: enough work to amortise handing out the
// task, small enough that two threads share a 512-row matrix evenly.
constexpr int64_t kSmallTaskRows = 32;

// c[i][n + j] (+)= a[i] . w[n + j] for i < MR, j < NR (F32 weights, row-major).
template <int NR, int MR>
void dot_block(const float* a, int64_t lda, const float* w, int64_t n, int64_t k, float* c,
               int64_t ldc, bool accumulate) {
  F32x16 acc[NR][MR];
  for (int j = 0; j < NR; ++j) {
    for (int i = 0; i < MR; ++i) acc[j][i] = F32x16{};
  }
  int64_t kk = 0;
  for (; kk + kLanes <= k; kk += kLanes) {
    F32x16 wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = simd::load(w + (n + j) * k + kk);
    for (int i = 0; i < MR; ++i) {
      const F32x16 av = simd::load(a + i * lda + kk);
      for (int j = 0; j < NR; ++j) acc[j][i] += wv[j] * av;
    }
  }
  for (int j = 0; j < NR; ++j) {
    for (int i = 0; i < MR; ++i) {
      float sum = simd::reduce_add(acc[j][i]);
      for (int64_t t = kk; t < k; ++t) sum += a[i * lda + t] * w[(n + j) * k + t];
      float& out = c[i * ldc + n + j];
      out = accumulate ? out + sum : sum;
    }
  }
}

template <int NR>
void dot_rows(const float* a, int64_t m, int64_t lda, const float* w, int64_t n, int64_t k,
              float* c, int64_t ldc, bool accumulate) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) {
    dot_block<NR, 4>(a + i * lda, lda, w, n, k, c + i * ldc, ldc, accumulate);
  }
  const float* ai = a + i * lda;
  float* ci = c + i * ldc;
  switch (m - i) {
    case 1:
      dot_block<NR, 1>(ai, lda, w, n, k, ci, ldc, accumulate);
      break;
    case 2:
      dot_block<NR, 2>(ai, lda, w, n, k, ci, ldc, accumulate);
      break;
    case 3:
      dot_block<NR, 3>(ai, lda, w, n, k, ci, ldc, accumulate);
      break;
    default:
      break;
  }
}

void small_range(const float* a, int64_t m, int64_t lda, const float* w, int64_t n_begin,
                 int64_t n_end, int64_t k, float* c, int64_t ldc, bool accumulate) {
  int64_t n = n_begin;
  for (; n + 4 <= n_end; n += 4) dot_rows<4>(a, m, lda, w, n, k, c, ldc, accumulate);
  for (; n < n_end; ++n) dot_rows<1>(a, m, lda, w, n, k, c, ldc, accumulate);
}

// ---- BF16: packed weights (weights.h), activations rounded to BF16 ----

// acc + a_even * b_even + a_odd * b_odd per lane, where each 32-bit lane of a and b holds
// two BF16 values (the pair of columns 2p, 2p + 1). One vdpbf16ps where the CPU has it.
STRATA_SIMD_INLINE F32x16 dot_pairs(F32x16 acc, U32x16 a, U32x16 b) {
#if defined(__AVX512BF16__)
  __m512 accv;
  __m512bh av, bv;
  std::memcpy(&accv, &acc, sizeof accv);
  std::memcpy(&av, &a, sizeof av);
  std::memcpy(&bv, &b, sizeof bv);
  accv = _mm512_dpbf16_ps(accv, av, bv);
  std::memcpy(&acc, &accv, sizeof acc);
  return acc;
#else
  const U32x16 a_even = a << 16, a_odd = a & 0xffff0000u;
  const U32x16 b_even = b << 16, b_odd = b & 0xffff0000u;
  F32x16 ae, ao, be, bo;
  std::memcpy(&ae, &a_even, sizeof ae);
  std::memcpy(&ao, &a_odd, sizeof ao);
  std::memcpy(&be, &b_even, sizeof be);
  std::memcpy(&bo, &b_odd, sizeof bo);
  return acc + ae * be + ao * bo;
#endif
}

STRATA_SIMD_INLINE U32x16 load_u32(const uint16_t* p) {
  U32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

STRATA_SIMD_INLINE U32x16 broadcast_pair(const uint16_t* p) {
  uint32_t x;
  std::memcpy(&x, p, sizeof x);
  return U32x16{} + x;
}

// c[r][0 .. columns) (+)= a[r] . panel column for MR rows of a (BF16, row stride lda,
// `pairs` column pairs) and one packed panel of 32 weight rows.
template <int MR>
void bf16_tile(const uint16_t* a, int64_t lda, const uint16_t* panel, int64_t pairs, float* c,
               int64_t ldc, int64_t columns, bool accumulate) {
  F32x16 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = F32x16{};
  for (int64_t p = 0; p < pairs; ++p) {
    const U32x16 b0 = load_u32(panel + p * 64);
    const U32x16 b1 = load_u32(panel + p * 64 + 32);
    for (int r = 0; r < MR; ++r) {
      const U32x16 av = broadcast_pair(a + r * lda + 2 * p);
      acc[r][0] = dot_pairs(acc[r][0], av, b0);
      acc[r][1] = dot_pairs(acc[r][1], av, b1);
    }
  }
  for (int r = 0; r < MR; ++r) {
    float* out = c + r * ldc;
    if (columns == 2 * kLanes) {
      if (accumulate) {
        simd::store(out, simd::load(out) + acc[r][0]);
        simd::store(out + kLanes, simd::load(out + kLanes) + acc[r][1]);
      } else {
        simd::store(out, acc[r][0]);
        simd::store(out + kLanes, acc[r][1]);
      }
    } else {
      float lanes[2 * kLanes];
      simd::store(lanes, acc[r][0]);
      simd::store(lanes + kLanes, acc[r][1]);
      for (int64_t j = 0; j < columns; ++j) out[j] = accumulate ? out[j] + lanes[j] : lanes[j];
    }
  }
}

constexpr int kBf16TileRows = 12;

void bf16_rows(const uint16_t* a, int64_t m, int64_t lda, const uint16_t* panel, int64_t pairs,
               float* c, int64_t ldc, int64_t columns, bool accumulate) {
  int64_t r = 0;
  for (; r + kBf16TileRows <= m; r += kBf16TileRows) {
    bf16_tile<kBf16TileRows>(a + r * lda, lda, panel, pairs, c + r * ldc, ldc, columns, accumulate);
  }
  const uint16_t* ar = a + r * lda;
  float* cr = c + r * ldc;
  switch (m - r) {
#define STRATA_BF16_CASE(n) \
  case n:                  \
    return bf16_tile<n>(ar, lda, panel, pairs, cr, ldc, columns, accumulate);
    STRATA_BF16_CASE(1)
    STRATA_BF16_CASE(2)
    STRATA_BF16_CASE(3)
    STRATA_BF16_CASE(4)
    STRATA_BF16_CASE(5)
    STRATA_BF16_CASE(6)
    STRATA_BF16_CASE(7)
    STRATA_BF16_CASE(8)
    STRATA_BF16_CASE(9)
    STRATA_BF16_CASE(10)
    STRATA_BF16_CASE(11)
#undef STRATA_BF16_CASE
    default:
      return;
  }
}

}  // namespace

void Matmul::use_single_threaded_blas() {
  openblas_set_num_threads(1);
}

Matmul::Matmul(int num_threads) {
  STRATA_CHECK(num_threads >= 1);
  use_single_threaded_blas();
}

void Matmul::run(ThreadPool& pool, const float* a, int64_t m, int64_t lda, const WeightMatrix& w,
                 float* c, int64_t ldc, bool accumulate) {
  if (m <= 0 || w.rows() == 0) return;
  STRATA_CHECK(lda >= w.cols() && ldc >= w.rows());
  if (w.dtype() == WeightDtype::kBF16) {
    bf16(pool, a, m, lda, w, c, ldc, accumulate);
  } else if (m >= kBlasMinRows) {
    blas(pool, a, m, lda, w, c, ldc, accumulate);
  } else {
    small(pool, a, m, lda, w, c, ldc, accumulate);
  }
}

void Matmul::small(ThreadPool& pool, const float* a, int64_t m, int64_t lda, const WeightMatrix& w,
                   float* c, int64_t ldc, bool accumulate) {
  const int64_t n = w.rows();
  const int64_t k = w.cols();
  const int64_t num_tasks = (n + kSmallTaskRows - 1) / kSmallTaskRows;
  pool.run(num_tasks, [&](int64_t task, int) {
    const int64_t n0 = task * kSmallTaskRows;
    const int64_t n1 = std::min(n, n0 + kSmallTaskRows);
    small_range(a, m, lda, w.f32(), n0, n1, k, c, ldc, accumulate);
  });
}

void Matmul::blas(ThreadPool& pool, const float* a, int64_t m, int64_t lda, const WeightMatrix& w,
                  float* c, int64_t ldc, bool accumulate) {
  const int64_t n = w.rows();
  const int64_t k = w.cols();
  const int threads = pool.num_threads();
  // Contiguous column ranges, multiples of 16 columns, one per part.
  int64_t per_part = (n + threads - 1) / threads;
  per_part = (per_part + 15) / 16 * 16;
  const float beta = accumulate ? 1.0f : 0.0f;
  pool.run_on_all([&](int part) {
    const int64_t n0 = static_cast<int64_t>(part) * per_part;
    const int64_t n1 = std::min(n, n0 + per_part);
    if (n0 >= n1) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m),
                static_cast<blasint>(n1 - n0), static_cast<blasint>(k), 1.0f, a,
                static_cast<blasint>(lda), w.f32() + n0 * k, static_cast<blasint>(k), beta, c + n0,
                static_cast<blasint>(ldc));
  });
}

void Matmul::bf16(ThreadPool& pool, const float* a, int64_t m, int64_t lda, const WeightMatrix& w,
                  float* c, int64_t ldc, bool accumulate) {
  const int64_t k = w.cols();
  const int64_t kp = w.padded_cols();
  const int64_t pairs = kp / 2;
  // Activations rounded to BF16 once, rows padded to an even length with zeros.
  a_bf16_.reserve(static_cast<size_t>(m * kp) * sizeof(uint16_t));
  uint16_t* ab = a_bf16_.as<uint16_t>();
  const int64_t convert_tasks = m * k >= (1 << 16) ? std::min<int64_t>(m, 4 * pool.num_threads()) : 1;
  const int64_t rows_per_task = (m + convert_tasks - 1) / convert_tasks;
  pool.run(convert_tasks, [&](int64_t task, int) {
    const int64_t end = std::min(m, (task + 1) * rows_per_task);
    for (int64_t r = task * rows_per_task; r < end; ++r) {
      f32_to_bf16_row(a + r * lda, ab + r * kp, static_cast<size_t>(k));
      if (kp != k) ab[r * kp + k] = 0;
    }
  });
  // Tasks: groups of panels (32 weight rows each). Inside a task, rows of A in blocks
  // that stay in L2 while every panel of the group passes over them.
  const int64_t panels = w.num_panels();
  const int64_t panels_per_task =
      std::clamp<int64_t>(panels / (4 * pool.num_threads()), 1, 8);
  const int64_t num_tasks = (panels + panels_per_task - 1) / panels_per_task;
  const int64_t a_block_rows = std::max<int64_t>(
      kBf16TileRows, (256 * 1024) / (kp * 2) / kBf16TileRows * kBf16TileRows);
  const int64_t n = w.rows();
  pool.run(num_tasks, [&](int64_t task, int) {
    const int64_t p_begin = task * panels_per_task;
    const int64_t p_end = std::min(panels, p_begin + panels_per_task);
    for (int64_t m0 = 0; m0 < m; m0 += a_block_rows) {
      const int64_t rows = std::min(a_block_rows, m - m0);
      for (int64_t p = p_begin; p < p_end; ++p) {
        const int64_t n0 = p * WeightMatrix::kPanelRows;
        const int64_t columns = std::min<int64_t>(WeightMatrix::kPanelRows, n - n0);
        bf16_rows(ab + m0 * kp, rows, kp, w.packed_bf16() + p * w.panel_elements(), pairs,
                  c + m0 * ldc + n0, ldc, columns, accumulate);
      }
    }
  });
}

}  // namespace strata
