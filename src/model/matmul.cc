#include "model/matmul.h"

#include <cblas.h>

#include <algorithm>

#include "common/check.h"
#include "memory/kv_dtype.h"
#include "model/quant_dot.h"
#include "model/simd.h"

namespace strata {

namespace {

using simd::F32x16;
using simd::kLanes;
using simd::U32x16;

// c[i][n] (+)= a[i] . w[n] for i < MR and one row n of F32 weights. W is read one row
// at a time, a single sequential stream per thread: interleaving several rows measured
// 1.7x slower from DRAM (more streams for the prefetcher). U accumulators per row of A
// hide the FMA latency when W comes from cache.
template <int MR, int U>
void dot_row(const float* a, int64_t lda, const float* w, int64_t k, float* c, int64_t ldc,
             bool accumulate) {
  F32x16 acc[MR][U];
  for (int i = 0; i < MR; ++i) {
    for (int u = 0; u < U; ++u) acc[i][u] = F32x16{};
  }
  int64_t kk = 0;
  for (; kk + U * kLanes <= k; kk += U * kLanes) {
    F32x16 wv[U];
    for (int u = 0; u < U; ++u) wv[u] = simd::load(w + kk + u * kLanes);
    for (int i = 0; i < MR; ++i) {
      for (int u = 0; u < U; ++u) acc[i][u] += wv[u] * simd::load(a + i * lda + kk + u * kLanes);
    }
  }
  for (; kk + kLanes <= k; kk += kLanes) {
    const F32x16 wv = simd::load(w + kk);
    for (int i = 0; i < MR; ++i) acc[i][0] += wv * simd::load(a + i * lda + kk);
  }
  for (int i = 0; i < MR; ++i) {
    F32x16 total = acc[i][0];
    for (int u = 1; u < U; ++u) total += acc[i][u];
    float sum = simd::reduce_add(total);
    for (int64_t t = kk; t < k; ++t) sum += a[i * lda + t] * w[t];
    float& out = c[i * ldc];
    out = accumulate ? out + sum : sum;
  }
}

// c[i][n + j] (+)= a[i] . w[n + j] for i < MR and 4 rows of W: 4 x MR dot products per
// step from registers, half the loads per FMA of dot_row. Used from 4 rows of A on,
// where arithmetic matters more than the streaming pattern of W.
template <int MR>
void dot_block4(const float* a, int64_t lda, const float* w, int64_t k, float* c, int64_t ldc,
                bool accumulate) {
  F32x16 acc[4][MR];
  for (int j = 0; j < 4; ++j) {
    for (int i = 0; i < MR; ++i) acc[j][i] = F32x16{};
  }
  int64_t kk = 0;
  for (; kk + kLanes <= k; kk += kLanes) {
    F32x16 wv[4];
    for (int j = 0; j < 4; ++j) wv[j] = simd::load(w + j * k + kk);
    for (int i = 0; i < MR; ++i) {
      const F32x16 av = simd::load(a + i * lda + kk);
      for (int j = 0; j < 4; ++j) acc[j][i] += wv[j] * av;
    }
  }
  for (int j = 0; j < 4; ++j) {
    for (int i = 0; i < MR; ++i) {
      float sum = simd::reduce_add(acc[j][i]);
      for (int64_t t = kk; t < k; ++t) sum += a[i * lda + t] * w[j * k + t];
      float& out = c[i * ldc + j];
      out = accumulate ? out + sum : sum;
    }
  }
}

void row_streaming(const float* a, int64_t m, int64_t lda, const float* wr, int64_t k, float* c,
                   int64_t ldc, bool accumulate) {
  switch (m) {
    case 1:
      return dot_row<1, 4>(a, lda, wr, k, c, ldc, accumulate);
    case 2:
      return dot_row<2, 2>(a, lda, wr, k, c, ldc, accumulate);
    case 3:
      return dot_row<3, 2>(a, lda, wr, k, c, ldc, accumulate);
    default:
      return dot_row<4, 2>(a, lda, wr, k, c, ldc, accumulate);
  }
}

// Rows [n_begin, n_end) of W against all m rows of A (m < blas_min_rows).
void small_range(const float* a, int64_t m, int64_t lda, const float* w, int64_t n_begin,
                 int64_t n_end, int64_t k, float* c, int64_t ldc, bool accumulate) {
  if (m < 4) {
    for (int64_t n = n_begin; n < n_end; ++n) {
      row_streaming(a, m, lda, w + n * k, k, c + n, ldc, accumulate);
    }
    return;
  }
  int64_t n = n_begin;
  for (; n + 4 <= n_end; n += 4) {
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) {
      dot_block4<4>(a + i * lda, lda, w + n * k, k, c + i * ldc + n, ldc, accumulate);
    }
    for (; i < m; ++i)
      dot_block4<1>(a + i * lda, lda, w + n * k, k, c + i * ldc + n, ldc, accumulate);
  }
  for (; n < n_end; ++n) {
    for (int64_t i = 0; i < m; i += 4) {
      row_streaming(a + i * lda, std::min<int64_t>(4, m - i), lda, w + n * k, k, c + i * ldc + n,
                    ldc, accumulate);
    }
  }
}

// ---- BF16: packed weights (weights.h), activations rounded to BF16 ----

// c[r][0 .. columns) (+)= a[r] . panel column for MR rows of a (BF16, row stride lda,
// `pairs` column pairs) and one packed panel of 32 weight rows.
template <int MR>
void bf16_tile(const uint16_t* a, int64_t lda, const uint16_t* panel, int64_t pairs, float* c,
               int64_t ldc, int64_t columns, bool accumulate) {
  F32x16 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = F32x16{};
  for (int64_t p = 0; p < pairs; ++p) {
    const U32x16 b0 = simd::load_u32(panel + p * 64);
    const U32x16 b1 = simd::load_u32(panel + p * 64 + 32);
    for (int r = 0; r < MR; ++r) {
      const U32x16 av = simd::broadcast_pair(a + r * lda + 2 * p);
      acc[r][0] = simd::dot_pairs(acc[r][0], av, b0);
      acc[r][1] = simd::dot_pairs(acc[r][1], av, b1);
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
  case n:                   \
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

Matmul::Matmul(int num_threads, int64_t blas_min_rows)
    : blas_min_rows_(blas_min_rows),
      panel_f32_(static_cast<size_t>(num_threads)),
      panel_bf16_(static_cast<size_t>(num_threads)) {
  STRATA_CHECK(num_threads >= 1);
  use_single_threaded_blas();
}

void Matmul::run(ThreadPool& pool, const float* a, int64_t m, int64_t lda, const WeightMatrix& w,
                 float* c, int64_t ldc, bool accumulate) {
  if (m <= 0 || w.rows() == 0) return;
  STRATA_CHECK(lda >= w.cols() && ldc >= w.rows());
  if (is_quantized(w.dtype())) {
    if (m < kQuantGemvMaxRows) {
      quant_gemv(pool, a, m, lda, w, c, ldc, accumulate);
    } else {
      quant_gemm(pool, a, m, lda, w, c, ldc, accumulate);
    }
  } else if (w.dtype() == WeightDtype::kBF16) {
    bf16(pool, a, m, lda, w, c, ldc, accumulate);
  } else if (m >= blas_min_rows_) {
    blas(pool, a, m, lda, w, c, ldc, accumulate);
  } else {
    small(pool, a, m, lda, w, c, ldc, accumulate);
  }
}

void Matmul::small(ThreadPool& pool, const float* a, int64_t m, int64_t lda, const WeightMatrix& w,
                   float* c, int64_t ldc, bool accumulate) {
  const int64_t n = w.rows();
  const int64_t k = w.cols();
  // Long contiguous runs of rows per task (up to 256 rows, 512 KB at k = 512) keep each
  // thread's stream sequential; at least 4 tasks per thread balance the load.
  const int64_t rows_per_task = std::clamp<int64_t>(n / (4 * pool.num_threads()), 32, 256);
  const int64_t num_tasks = (n + rows_per_task - 1) / rows_per_task;
  pool.run(num_tasks, [&](int64_t task, int) {
    const int64_t n0 = task * rows_per_task;
    const int64_t n1 = std::min(n, n0 + rows_per_task);
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

const uint16_t* Matmul::round_to_bf16(ThreadPool& pool, const float* a, int64_t m, int64_t lda,
                                      int64_t k, int64_t kp) {
  // Rows padded to an even length with zeros.
  a_bf16_.reserve(static_cast<size_t>(m * kp) * sizeof(uint16_t));
  uint16_t* ab = a_bf16_.as<uint16_t>();
  const int64_t convert_tasks =
      m * k >= (1 << 16) ? std::min<int64_t>(m, 4 * pool.num_threads()) : 1;
  const int64_t rows_per_task = (m + convert_tasks - 1) / convert_tasks;
  pool.run(convert_tasks, [&](int64_t task, int) {
    const int64_t end = std::min(m, (task + 1) * rows_per_task);
    for (int64_t r = task * rows_per_task; r < end; ++r) {
      f32_to_bf16_row(a + r * lda, ab + r * kp, static_cast<size_t>(k));
      if (kp != k) ab[r * kp + k] = 0;
    }
  });
  return ab;
}

void Matmul::bf16(ThreadPool& pool, const float* a, int64_t m, int64_t lda, const WeightMatrix& w,
                  float* c, int64_t ldc, bool accumulate) {
  const int64_t k = w.cols();
  const int64_t kp = w.padded_cols();
  const int64_t pairs = kp / 2;
  const uint16_t* ab = round_to_bf16(pool, a, m, lda, k, kp);
  // Tasks: groups of panels (32 weight rows each). Inside a task, rows of A in blocks
  // that stay in L2 while every panel of the group passes over them.
  const int64_t panels = w.num_panels();
  const int64_t panels_per_task = std::clamp<int64_t>(panels / (4 * pool.num_threads()), 1, 8);
  const int64_t num_tasks = (panels + panels_per_task - 1) / panels_per_task;
  const int64_t a_block_rows =
      std::max<int64_t>(kBf16TileRows, (256 * 1024) / (kp * 2) / kBf16TileRows * kBf16TileRows);
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

void Matmul::quant_gemv(ThreadPool& pool, const float* a, int64_t m, int64_t lda,
                        const WeightMatrix& w, float* c, int64_t ldc, bool accumulate) {
  const GgmlType type = weight_dtype_ggml_type(w.dtype());
  const QuantKernels kernels = quant_kernels(type);
  const int64_t n = w.rows();
  const int64_t k = w.cols();
  const int64_t a_bytes = quant_activation_bytes(type, k);
  a_quant_.reserve(static_cast<size_t>(m * a_bytes));
  std::byte* aq = a_quant_.as<std::byte>();
  for (int64_t i = 0; i < m; ++i) kernels.quantize(a + i * lda, aq + i * a_bytes, k);
  // Long contiguous runs of rows per task keep each thread's stream sequential; at least
  // 4 tasks per thread balance the load.
  const int64_t rows_per_task = std::clamp<int64_t>(n / (4 * pool.num_threads()), 16, 256);
  const int64_t num_tasks = (n + rows_per_task - 1) / rows_per_task;
  pool.run(num_tasks, [&](int64_t task, int) {
    const int64_t n0 = task * rows_per_task;
    const int64_t n1 = std::min(n, n0 + rows_per_task);
    for (int64_t r = n0; r < n1; ++r) {
      const std::byte* wr = w.quant_row(r);
      for (int64_t i = 0; i < m; ++i) {
        const float v = kernels.dot(wr, aq + i * a_bytes, k);
        float& out = c[i * ldc + r];
        out = accumulate ? out + v : v;
      }
    }
  });
}

void Matmul::quant_gemm(ThreadPool& pool, const float* a, int64_t m, int64_t lda,
                        const WeightMatrix& w, float* c, int64_t ldc, bool accumulate) {
  constexpr int64_t kPanelRows = WeightMatrix::kPanelRows;
  const int64_t n = w.rows();
  const int64_t k = w.cols();
  const int64_t kp = w.padded_cols();
  const int64_t pairs = kp / 2;
  const uint16_t* ab = round_to_bf16(pool, a, m, lda, k, kp);
  const int64_t panels = (n + kPanelRows - 1) / kPanelRows;
  const int64_t panels_per_task = std::clamp<int64_t>(panels / (4 * pool.num_threads()), 1, 8);
  const int64_t num_tasks = (panels + panels_per_task - 1) / panels_per_task;
  const int64_t a_block_rows =
      std::max<int64_t>(kBf16TileRows, (256 * 1024) / (kp * 2) / kBf16TileRows * kBf16TileRows);
  for (size_t t = 0; t < panel_f32_.size(); ++t) {
    panel_f32_[t].reserve(static_cast<size_t>(kPanelRows * k) * sizeof(float));
    panel_bf16_[t].reserve(static_cast<size_t>(kPanelRows * kp) * sizeof(uint16_t));
  }
  pool.run(num_tasks, [&](int64_t task, int thread) {
    float* rows = panel_f32_[static_cast<size_t>(thread)].as<float>();
    uint16_t* panel = panel_bf16_[static_cast<size_t>(thread)].as<uint16_t>();
    const int64_t p_begin = task * panels_per_task;
    const int64_t p_end = std::min(panels, p_begin + panels_per_task);
    for (int64_t p = p_begin; p < p_end; ++p) {
      const int64_t n0 = p * kPanelRows;
      const int64_t columns = std::min<int64_t>(kPanelRows, n - n0);
      w.rows_to_f32(n0, columns, rows);
      // The packed BF16 layout of weights.h: for each column pair, the 32 rows' pairs.
      for (int64_t lane = 0; lane < kPanelRows; ++lane) {
        uint16_t* dst = panel + (lane / 16) * 32 + (lane % 16) * 2;
        if (lane >= columns) {
          for (int64_t q = 0; q < pairs; ++q) dst[q * 64] = dst[q * 64 + 1] = 0;
          continue;
        }
        const float* src = rows + lane * k;
        for (int64_t q = 0; q < pairs; ++q) {
          dst[q * 64] = f32_to_bf16(src[2 * q]);
          dst[q * 64 + 1] = 2 * q + 1 < k ? f32_to_bf16(src[2 * q + 1]) : 0;
        }
      }
      for (int64_t m0 = 0; m0 < m; m0 += a_block_rows) {
        const int64_t block = std::min(a_block_rows, m - m0);
        bf16_rows(ab + m0 * kp, block, kp, panel, pairs, c + m0 * ldc + n0, ldc, columns,
                  accumulate);
      }
    }
  });
}

}  // namespace strata
