#include "model/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/check.h"
#include "model/simd.h"

namespace strata {

namespace {

using simd::F32x16;
using simd::kLanes;

constexpr int32_t kTile = PagedAttention::kKeyTile;  // keys per tile
constexpr int32_t kBlock = kLanes;                   // keys per column block (one vector)
constexpr int32_t kBlocksPerTile = kTile / kBlock;
constexpr int kMicroRows = 6;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

static_assert(kTile % kBlock == 0);

// Where the keys and values of one tile are: per column block of 16 keys, the address of
// K element (dim 0, first key) — dim d of the block's 16 keys is the 16 elements at
// k[c] + d * k_stride — and of the first key's V row (the block's rows follow, head_dim
// apart).
// Scaled (8-bit) pages add the BF16 scales of the block's 16 keys, K's and V's: the
// kernels multiply codes, and apply K's scales to the 16 scores of a column block and
// V's to the 16 probabilities that weigh its rows (a per-token scale factors out of both
// products), so a page is never widened to F32.
struct TileSource {
  const std::byte* k[kBlocksPerTile];
  const std::byte* v[kBlocksPerTile];
  const uint16_t* k_scale[kBlocksPerTile];  // scaled dtypes only (BF16)
  const uint16_t* v_scale[kBlocksPerTile];  // scaled dtypes only (BF16)
  size_t k_stride;                          // elements
};

typedef int8_t I8x16 __attribute__((vector_size(16)));
typedef uint8_t U8x16 __attribute__((vector_size(16)));

// 16 int8 codes widened to F32 (exact): vpmovsxbd, vcvtdq2ps. (GCC 12 turns the generic
// vector conversion into scalar code, 3x slower than BF16 pages.)
F32x16 load_int8(const std::byte* p) {
#if defined(__AVX512F__)
  const __m512 f = _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  F32x16 v;
  std::memcpy(&v, &f, sizeof v);
  return v;
#else
  I8x16 b;
  std::memcpy(&b, p, sizeof b);
  return __builtin_convertvector(__builtin_convertvector(b, simd::I32x16), F32x16);
#endif
}

// What the F32 value of an E4M3FN code is multiplied by when load_fp8 decodes it.
constexpr float kFp8Decoded = 0x1p-8f;

// 16 E4M3FN codes decoded to F32 times kFp8Decoded (exact, NaN codes aside, which the
// quantizer never writes): the code's exponent and mantissa bits, moved into an F16's,
// are an F16 of the same significand whose exponent bias (15) is 8 more than E4M3's (7),
// subnormals included.
F32x16 load_fp8(const std::byte* p) {
#if defined(__AVX512F__)
  const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i h =
      _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7),
                      _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8));
  const __m512 f = _mm512_cvtph_ps(h);
  F32x16 v;
  std::memcpy(&v, &f, sizeof v);
  return v;
#else
  U8x16 b;
  std::memcpy(&b, p, sizeof b);
  const simd::U16x16 w = __builtin_convertvector(b, simd::U16x16);
  const simd::U16x16 h = ((w & 0x7f) << 7) | ((w & 0x80) << 8);
  uint16_t lanes[kLanes];
  std::memcpy(lanes, &h, sizeof lanes);
  float out[kLanes];
  f16_to_f32_row(lanes, out, kLanes);
  return simd::load(out);
#endif
}

template <KvDtype D>
F32x16 load_kv(const std::byte* base, size_t index) {
  if constexpr (D == KvDtype::kF32) {
    return simd::load(reinterpret_cast<const float*>(base) + index);
  } else if constexpr (D == KvDtype::kF16) {
    return simd::load_f16(reinterpret_cast<const uint16_t*>(base) + index);
  } else if constexpr (D == KvDtype::kBF16) {
    return simd::load_bf16(reinterpret_cast<const uint16_t*>(base) + index);
  } else if constexpr (D == KvDtype::kInt8) {
    return load_int8(base + index);
  } else {
    return load_fp8(base + index);
  }
}

// The factor that turns load_kv's values times a row's scale into the row's values.
template <KvDtype D>
constexpr float scale_unit() {
  return D == KvDtype::kFp8E4M3 ? 1.0f / kFp8Decoded : 1.0f;
}

// scores[r][16 c ..] = q[r] . K[block c] for ROWS rows and NB column blocks.
template <KvDtype D, int ROWS, int NB>
void score_block(const float* q, int32_t head_dim, const TileSource& src, float* scores) {
  F32x16 acc[ROWS][NB];
  for (int r = 0; r < ROWS; ++r) {
    for (int c = 0; c < NB; ++c) acc[r][c] = F32x16{};
  }
  for (int32_t d = 0; d < head_dim; ++d) {
    F32x16 k[NB];
    for (int c = 0; c < NB; ++c) k[c] = load_kv<D>(src.k[c], static_cast<size_t>(d) * src.k_stride);
    for (int r = 0; r < ROWS; ++r) {
      const F32x16 qv = simd::splat(q[r * head_dim + d]);
      for (int c = 0; c < NB; ++c) acc[r][c] += qv * k[c];
    }
  }
  if constexpr (kv_dtype_is_scaled(D)) {
    for (int c = 0; c < NB; ++c) {
      const F32x16 scale = simd::load_bf16(src.k_scale[c]) * scale_unit<D>();
      for (int r = 0; r < ROWS; ++r) acc[r][c] *= scale;
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    for (int c = 0; c < NB; ++c) simd::store(scores + r * kTile + c * kBlock, acc[r][c]);
  }
}

template <KvDtype D, int NB>
void score_rows_nb(const float* q, int32_t rows, int32_t head_dim, const TileSource& src,
                   float* scores) {
  int32_t r = 0;
  for (; r + kMicroRows <= rows; r += kMicroRows) {
    score_block<D, kMicroRows, NB>(q + r * head_dim, head_dim, src, scores + r * kTile);
  }
  const float* qr = q + r * head_dim;
  float* sr = scores + r * kTile;
  switch (rows - r) {
    case 1:
      return score_block<D, 1, NB>(qr, head_dim, src, sr);
    case 2:
      return score_block<D, 2, NB>(qr, head_dim, src, sr);
    case 3:
      return score_block<D, 3, NB>(qr, head_dim, src, sr);
    case 4:
      return score_block<D, 4, NB>(qr, head_dim, src, sr);
    case 5:
      return score_block<D, 5, NB>(qr, head_dim, src, sr);
    default:
      return;
  }
}

template <KvDtype D>
void score_rows(const float* q, int32_t rows, int32_t head_dim, const TileSource& src,
                int32_t blocks, float* scores) {
  switch (blocks) {
    case 1:
      return score_rows_nb<D, 1>(q, rows, head_dim, src, scores);
    case 2:
      return score_rows_nb<D, 2>(q, rows, head_dim, src, scores);
    case 3:
      return score_rows_nb<D, 3>(q, rows, head_dim, src, scores);
    default:
      return score_rows_nb<D, 4>(q, rows, head_dim, src, scores);
  }
}

// acc[r][c0 .. c0 + 16 NV) += sum over the tile's first num_keys keys of p[r][j] V[j].
template <KvDtype D, int ROWS, int NV>
void pv_block(const float* p, const TileSource& src, int32_t head_dim, int32_t num_keys, float* acc,
              int32_t c0) {
  F32x16 a[ROWS][NV];
  for (int r = 0; r < ROWS; ++r) {
    for (int n = 0; n < NV; ++n) a[r][n] = simd::load(acc + r * head_dim + c0 + n * kLanes);
  }
  for (int32_t c = 0; c * kBlock < num_keys; ++c) {
    const int32_t keys = std::min(kBlock, num_keys - c * kBlock);
    const std::byte* base = src.v[c];
    for (int32_t j = 0; j < keys; ++j) {
      const size_t row =
          static_cast<size_t>(j) * static_cast<size_t>(head_dim) + static_cast<size_t>(c0);
      F32x16 v[NV];
      for (int n = 0; n < NV; ++n) v[n] = load_kv<D>(base, row + static_cast<size_t>(n * kLanes));
      for (int r = 0; r < ROWS; ++r) {
        const F32x16 pv = simd::splat(p[r * kTile + c * kBlock + j]);
        for (int n = 0; n < NV; ++n) a[r][n] += pv * v[n];
      }
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    for (int n = 0; n < NV; ++n) simd::store(acc + r * head_dim + c0 + n * kLanes, a[r][n]);
  }
}

template <KvDtype D, int ROWS>
void pv_rows_fixed(const float* p, const TileSource& src, int32_t head_dim, int32_t num_keys,
                   float* acc) {
  for (int32_t c0 = 0; c0 < head_dim; c0 += 4 * kLanes) {
    switch (std::min<int32_t>(4, (head_dim - c0) / kLanes)) {
      case 4:
        pv_block<D, ROWS, 4>(p, src, head_dim, num_keys, acc, c0);
        break;
      case 3:
        pv_block<D, ROWS, 3>(p, src, head_dim, num_keys, acc, c0);
        break;
      case 2:
        pv_block<D, ROWS, 2>(p, src, head_dim, num_keys, acc, c0);
        break;
      default:
        pv_block<D, ROWS, 1>(p, src, head_dim, num_keys, acc, c0);
        break;
    }
  }
}

// Scaled dtypes: P's columns times V's per-key scales (and the decode unit), in place,
// before pv_rows multiplies them by V's codes. Only pv_rows reads P afterwards (the
// softmax has already summed it).
template <KvDtype D>
void scale_probabilities(float* p, int32_t rows, const TileSource& src, int32_t blocks) {
  for (int32_t c = 0; c < blocks; ++c) {
    const F32x16 scale = simd::load_bf16(src.v_scale[c]) * scale_unit<D>();
    for (int32_t r = 0; r < rows; ++r) {
      float* pr = p + r * kTile + c * kBlock;
      simd::store(pr, simd::load(pr) * scale);
    }
  }
}

// Prefill over 8-bit pages: the tile's codes (its 16-key column blocks of one KV head)
// widened once, times their scales, into the F32 tile scratch in the F32 page order (K
// dimension-major, kTile apart; V token-major), so that the rows' micro blocks multiply
// F32 instead of each widening the same codes again. Decode rows (one micro block) read
// the codes themselves.
template <KvDtype D>
void widen_tile(const TileSource& src, int32_t blocks, int32_t head_dim, float* k, float* v) {
  for (int32_t c = 0; c < blocks; ++c) {
    const F32x16 ks = simd::load_bf16(src.k_scale[c]) * scale_unit<D>();
    for (int32_t d = 0; d < head_dim; ++d) {
      simd::store(k + static_cast<size_t>(d) * kTile + static_cast<size_t>(c) * kBlock,
                  load_kv<D>(src.k[c], static_cast<size_t>(d) * src.k_stride) * ks);
    }
    float vs[kBlock];
    simd::store(vs, simd::load_bf16(src.v_scale[c]) * scale_unit<D>());
    for (int32_t j = 0; j < kBlock; ++j) {
      const F32x16 scale = simd::splat(vs[j]);
      const size_t row = static_cast<size_t>(j) * static_cast<size_t>(head_dim);
      float* out = v + (static_cast<size_t>(c) * kBlock + static_cast<size_t>(j)) *
                           static_cast<size_t>(head_dim);
      for (int32_t d = 0; d < head_dim; d += kLanes) {
        simd::store(out + d, load_kv<D>(src.v[c], row + static_cast<size_t>(d)) * scale);
      }
    }
  }
}

template <KvDtype D>
void pv_rows(const float* p, int32_t rows, const TileSource& src, int32_t head_dim,
             int32_t num_keys, float* acc) {
  int32_t r = 0;
  for (; r + kMicroRows <= rows; r += kMicroRows) {
    pv_rows_fixed<D, kMicroRows>(p + r * kTile, src, head_dim, num_keys, acc + r * head_dim);
  }
  const float* pr = p + r * kTile;
  float* ar = acc + r * head_dim;
  switch (rows - r) {
    case 1:
      return pv_rows_fixed<D, 1>(pr, src, head_dim, num_keys, ar);
    case 2:
      return pv_rows_fixed<D, 2>(pr, src, head_dim, num_keys, ar);
    case 3:
      return pv_rows_fixed<D, 3>(pr, src, head_dim, num_keys, ar);
    case 4:
      return pv_rows_fixed<D, 4>(pr, src, head_dim, num_keys, ar);
    case 5:
      return pv_rows_fixed<D, 5>(pr, src, head_dim, num_keys, ar);
    default:
      return;
  }
}

// ---- paired BF16 pages (kv_pool.h): both products on vdpbf16ps ----
// q (rounded to BF16, [rows][head_dim]) times K in dimension pairs: for pair p, the 16
// keys of column block c are 32 BF16 values at k[c] + p * 2 * page_size.
template <int ROWS, int NB>
void score_block_paired(const uint16_t* q, int32_t head_dim, const TileSource& src, float* scores) {
  F32x16 acc[ROWS][NB];
  for (int r = 0; r < ROWS; ++r) {
    for (int c = 0; c < NB; ++c) acc[r][c] = F32x16{};
  }
  const size_t pair_stride = 2 * src.k_stride;
  for (int32_t p = 0; p < head_dim / 2; ++p) {
    simd::U32x16 k[NB];
    for (int c = 0; c < NB; ++c) {
      k[c] = simd::load_u32(reinterpret_cast<const uint16_t*>(src.k[c]) +
                            static_cast<size_t>(p) * pair_stride);
    }
    for (int r = 0; r < ROWS; ++r) {
      const simd::U32x16 qv = simd::broadcast_pair(q + r * head_dim + 2 * p);
      for (int c = 0; c < NB; ++c) acc[r][c] = simd::dot_pairs(acc[r][c], qv, k[c]);
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    for (int c = 0; c < NB; ++c) simd::store(scores + r * kTile + c * kBlock, acc[r][c]);
  }
}

template <int NB>
void score_rows_paired_nb(const uint16_t* q, int32_t rows, int32_t head_dim, const TileSource& src,
                          float* scores) {
  int32_t r = 0;
  for (; r + kMicroRows <= rows; r += kMicroRows) {
    score_block_paired<kMicroRows, NB>(q + r * head_dim, head_dim, src, scores + r * kTile);
  }
  const uint16_t* qr = q + r * head_dim;
  float* sr = scores + r * kTile;
  switch (rows - r) {
    case 1:
      return score_block_paired<1, NB>(qr, head_dim, src, sr);
    case 2:
      return score_block_paired<2, NB>(qr, head_dim, src, sr);
    case 3:
      return score_block_paired<3, NB>(qr, head_dim, src, sr);
    case 4:
      return score_block_paired<4, NB>(qr, head_dim, src, sr);
    case 5:
      return score_block_paired<5, NB>(qr, head_dim, src, sr);
    default:
      return;
  }
}

void score_rows_paired(const uint16_t* q, int32_t rows, int32_t head_dim, const TileSource& src,
                       int32_t blocks, float* scores) {
  switch (blocks) {
    case 1:
      return score_rows_paired_nb<1>(q, rows, head_dim, src, scores);
    case 2:
      return score_rows_paired_nb<2>(q, rows, head_dim, src, scores);
    case 3:
      return score_rows_paired_nb<3>(q, rows, head_dim, src, scores);
    default:
      return score_rows_paired_nb<4>(q, rows, head_dim, src, scores);
  }
}

// acc[r][c0 ..] += P (rounded to BF16, [rows][kTile]) times V in slot pairs: for the key
// pair (2q, 2q + 1) of column block c, dims c0.. are 32 BF16 values at
// v[c] + (q * head_dim + c0) * 2.
template <int ROWS, int NV>
void pv_block_paired(const uint16_t* p, const TileSource& src, int32_t head_dim, int32_t num_keys,
                     float* acc, int32_t c0) {
  F32x16 a[ROWS][NV];
  for (int r = 0; r < ROWS; ++r) {
    for (int n = 0; n < NV; ++n) a[r][n] = simd::load(acc + r * head_dim + c0 + n * kLanes);
  }
  for (int32_t c = 0; c * kBlock < num_keys; ++c) {
    const int32_t pairs = (std::min(kBlock, num_keys - c * kBlock) + 1) / 2;
    const uint16_t* base = reinterpret_cast<const uint16_t*>(src.v[c]);
    for (int32_t q = 0; q < pairs; ++q) {
      const uint16_t* row = base + (static_cast<size_t>(q) * head_dim + c0) * 2;
      simd::U32x16 v[NV];
      for (int n = 0; n < NV; ++n) v[n] = simd::load_u32(row + n * 2 * kLanes);
      for (int r = 0; r < ROWS; ++r) {
        const simd::U32x16 pv = simd::broadcast_pair(p + r * kTile + c * kBlock + 2 * q);
        for (int n = 0; n < NV; ++n) a[r][n] = simd::dot_pairs(a[r][n], pv, v[n]);
      }
    }
  }
  for (int r = 0; r < ROWS; ++r) {
    for (int n = 0; n < NV; ++n) simd::store(acc + r * head_dim + c0 + n * kLanes, a[r][n]);
  }
}

template <int ROWS>
void pv_rows_paired_fixed(const uint16_t* p, const TileSource& src, int32_t head_dim,
                          int32_t num_keys, float* acc) {
  for (int32_t c0 = 0; c0 < head_dim; c0 += 4 * kLanes) {
    switch (std::min<int32_t>(4, (head_dim - c0) / kLanes)) {
      case 4:
        pv_block_paired<ROWS, 4>(p, src, head_dim, num_keys, acc, c0);
        break;
      case 3:
        pv_block_paired<ROWS, 3>(p, src, head_dim, num_keys, acc, c0);
        break;
      case 2:
        pv_block_paired<ROWS, 2>(p, src, head_dim, num_keys, acc, c0);
        break;
      default:
        pv_block_paired<ROWS, 1>(p, src, head_dim, num_keys, acc, c0);
        break;
    }
  }
}

void pv_rows_paired(const uint16_t* p, int32_t rows, const TileSource& src, int32_t head_dim,
                    int32_t num_keys, float* acc) {
  int32_t r = 0;
  for (; r + kMicroRows <= rows; r += kMicroRows) {
    pv_rows_paired_fixed<kMicroRows>(p + r * kTile, src, head_dim, num_keys, acc + r * head_dim);
  }
  const uint16_t* pr = p + r * kTile;
  float* ar = acc + r * head_dim;
  switch (rows - r) {
    case 1:
      return pv_rows_paired_fixed<1>(pr, src, head_dim, num_keys, ar);
    case 2:
      return pv_rows_paired_fixed<2>(pr, src, head_dim, num_keys, ar);
    case 3:
      return pv_rows_paired_fixed<3>(pr, src, head_dim, num_keys, ar);
    case 4:
      return pv_rows_paired_fixed<4>(pr, src, head_dim, num_keys, ar);
    case 5:
      return pv_rows_paired_fixed<5>(pr, src, head_dim, num_keys, ar);
    default:
      return;
  }
}

// Scalar forms for head_dim not a multiple of 16 (F32 tiles only: the gather path).
void score_rows_scalar(const float* q, int32_t rows, int32_t head_dim, const TileSource& src,
                       int32_t num_keys, float* scores) {
  for (int32_t r = 0; r < rows; ++r) {
    for (int32_t j = 0; j < num_keys; ++j) {
      const float* k = reinterpret_cast<const float*>(src.k[j / kBlock]) + j % kBlock;
      float sum = 0.0f;
      for (int32_t d = 0; d < head_dim; ++d) sum += q[r * head_dim + d] * k[d * src.k_stride];
      scores[r * kTile + j] = sum;
    }
  }
}

void pv_rows_scalar(const float* p, int32_t rows, const TileSource& src, int32_t head_dim,
                    int32_t num_keys, float* acc) {
  for (int32_t r = 0; r < rows; ++r) {
    for (int32_t j = 0; j < num_keys; ++j) {
      const float w = p[r * kTile + j];
      if (w == 0.0f) continue;
      const float* v = reinterpret_cast<const float*>(src.v[j / kBlock]) + (j % kBlock) * head_dim;
      for (int32_t d = 0; d < head_dim; ++d) acc[r * head_dim + d] += w * v[d];
    }
  }
}

// One row of the online softmax over a tile: masks keys outside [lo, hi), turns the
// row's scores into probabilities relative to the new running max, and rescales the
// row's accumulator. `blocks` column blocks hold the scores.
void softmax_row(float* s, int32_t blocks, int32_t lo, int32_t hi, float& row_max, float& row_sum,
                 float* acc, int32_t head_dim) {
  F32x16 v[kBlocksPerTile];
  const bool full = lo <= 0 && hi >= blocks * kBlock;
  F32x16 mx = simd::splat(kNegInf);
  for (int32_t c = 0; c < blocks; ++c) {
    v[c] = simd::load(s + c * kBlock);
    if (!full) {
      F32x16 idx;
      for (int i = 0; i < kLanes; ++i) idx[i] = static_cast<float>(c * kBlock + i);
      const auto keep = (idx >= static_cast<float>(lo)) & (idx < static_cast<float>(hi));
      v[c] = keep ? v[c] : simd::splat(kNegInf);
    }
    mx = simd::max(mx, v[c]);
  }
  const float tile_max = simd::reduce_max(mx);
  if (tile_max == kNegInf) {  // no visible key in this tile for this row
    for (int32_t c = 0; c < blocks; ++c) simd::store(s + c * kBlock, F32x16{});
    return;
  }
  const float m_new = std::max(row_max, tile_max);
  const float alpha = std::exp(row_max - m_new);  // 0 on the first tile (row_max = -inf)
  F32x16 sum{};
  const F32x16 shift = simd::splat(m_new);
  for (int32_t c = 0; c < blocks; ++c) {
    const F32x16 e = simd::exp(v[c] - shift);
    simd::store(s + c * kBlock, e);
    sum += e;
  }
  row_sum = row_sum * alpha + simd::reduce_add(sum);
  if (alpha != 1.0f) {
    int32_t d = 0;
    const F32x16 av = simd::splat(alpha);
    for (; d + kLanes <= head_dim; d += kLanes) simd::store(acc + d, simd::load(acc + d) * av);
    for (; d < head_dim; ++d) acc[d] *= alpha;
  }
  row_max = m_new;
}

}  // namespace

PagedAttention::PagedAttention(const AttentionShape& shape, int num_threads) : shape_(shape) {
  STRATA_CHECK(shape.num_heads > 0 && shape.num_kv_heads > 0 && shape.head_dim > 0);
  STRATA_CHECK(shape.num_heads % shape.num_kv_heads == 0);
  STRATA_CHECK(num_threads >= 1);
  group_size_ = shape.num_heads / shape.num_kv_heads;
  tokens_per_task_ = std::max<int32_t>(1, kRowTarget / group_size_);
  const size_t rows = static_cast<size_t>(tokens_per_task_) * static_cast<size_t>(group_size_);
  const size_t hd = static_cast<size_t>(shape.head_dim);
  workspaces_.resize(static_cast<size_t>(num_threads));
  for (Workspace& ws : workspaces_) {
    ws.q.resize(rows * hd * sizeof(float));
    ws.k.resize(hd * kTile * sizeof(float));
    ws.v.resize(hd * kTile * sizeof(float));
    ws.scores.resize(rows * kTile * sizeof(float));
    ws.q_bf16.resize(rows * hd * sizeof(uint16_t));
    ws.p_bf16.resize(rows * kTile * sizeof(uint16_t));
    ws.acc.resize(rows * hd * sizeof(float));
    ws.row_max.resize(rows);
    ws.row_sum.resize(rows);
    ws.row_position.resize(rows);
    ws.row_low.resize(rows);
  }
}

void PagedAttention::run(ThreadPool& pool, std::span<const AttentionSequence> sequences,
                         const float* q, int64_t q_stride, const KvPool& kv, int32_t layer,
                         float* out, int64_t out_stride) {
  STRATA_CHECK(static_cast<size_t>(pool.num_threads()) <= workspaces_.size());
  STRATA_CHECK(kv.head_dim() == shape_.head_dim && kv.num_kv_heads() == shape_.num_kv_heads);
  tasks_.clear();
  for (size_t s = 0; s < sequences.size(); ++s) {
    const AttentionSequence& seq = sequences[s];
    for (int32_t tb = 0; tb < seq.num_tokens; tb += tokens_per_task_) {
      const int32_t te = std::min(seq.num_tokens, tb + tokens_per_task_);
      int64_t keys = seq.start_position + te;
      if (shape_.sliding_window > 0) keys = std::min(keys, shape_.sliding_window + (te - tb));
      for (int32_t h = 0; h < shape_.num_kv_heads; ++h) {
        tasks_.push_back(Task{static_cast<int32_t>(s), h, tb, te, keys * (te - tb)});
      }
    }
  }
  std::stable_sort(tasks_.begin(), tasks_.end(),
                   [](const Task& a, const Task& b) { return a.cost > b.cost; });
  pool.run(static_cast<int64_t>(tasks_.size()), [&](int64_t i, int thread) {
    run_task(tasks_[static_cast<size_t>(i)], sequences, q, q_stride, kv, layer, out, out_stride,
             workspaces_[static_cast<size_t>(thread)]);
  });
}

void PagedAttention::run_task(const Task& task, std::span<const AttentionSequence> sequences,
                              const float* q, int64_t q_stride, const KvPool& kv, int32_t layer,
                              float* out, int64_t out_stride, Workspace& ws) const {
  const AttentionSequence& seq = sequences[static_cast<size_t>(task.sequence)];
  const int32_t hd = shape_.head_dim;
  const int32_t group = group_size_;
  const int32_t num_tokens = task.token_end - task.token_begin;
  const int32_t rows = num_tokens * group;
  const int32_t page_size = kv.page_size();
  const KvDtype dtype = kv.dtype();
  const size_t elem = kv.element_size_bytes();

  float* qs = ws.q.as<float>();
  float* acc = ws.acc.as<float>();
  float* scores = ws.scores.as<float>();
  for (int32_t t = 0; t < num_tokens; ++t) {
    const int64_t position = seq.start_position + task.token_begin + t;
    const int64_t low =
        shape_.sliding_window > 0 ? std::max<int64_t>(0, position - shape_.sliding_window + 1) : 0;
    for (int32_t g = 0; g < group; ++g) {
      const int32_t r = t * group + g;
      const float* src = q + (seq.first_row + task.token_begin + t) * q_stride +
                         static_cast<int64_t>(task.kv_head * group + g) * hd;
      float* dst = qs + r * hd;
      int32_t d = 0;
      for (; d + kLanes <= hd; d += kLanes)
        simd::store(dst + d, simd::load(src + d) * shape_.scale);
      for (; d < hd; ++d) dst[d] = src[d] * shape_.scale;
      ws.row_position[static_cast<size_t>(r)] = position;
      ws.row_low[static_cast<size_t>(r)] = low;
      ws.row_max[static_cast<size_t>(r)] = kNegInf;
      ws.row_sum[static_cast<size_t>(r)] = 0.0f;
    }
  }
  std::fill(acc, acc + static_cast<size_t>(rows) * static_cast<size_t>(hd), 0.0f);

  // Rows are ordered by position, so the first row sees the lowest key and the last
  // row the highest. Tiles start at multiples of 16 so that, with a page size that is a
  // multiple of 16, each 16-key column block lies inside one page.
  const int64_t key_begin = ws.row_low[0] / kBlock * kBlock;
  const int64_t key_end = ws.row_position[static_cast<size_t>(rows - 1)] + 1;
  const bool direct = page_size % kBlock == 0 && hd % kLanes == 0;
  const bool vector_pv = hd % kLanes == 0;
  // Paired BF16 pages: q and p rounded to BF16, both products on vdpbf16ps.
  const bool paired = direct && kv.paired_bf16();
  const bool scaled = kv_dtype_is_scaled(dtype);
  uint16_t* q_bf16 = ws.q_bf16.as<uint16_t>();
  uint16_t* p_bf16 = ws.p_bf16.as<uint16_t>();
  if (paired) f32_to_bf16_row(qs, q_bf16, static_cast<size_t>(rows) * static_cast<size_t>(hd));

  float* kbuf = ws.k.as<float>();
  float* vbuf = ws.v.as<float>();
  float token_k[1024];  // head_dim <= 1024 (validated with the config)
  float token_v[1024];

  for (int64_t k0 = key_begin; k0 < key_end; k0 += kTile) {
    const int32_t kn = static_cast<int32_t>(std::min<int64_t>(kTile, key_end - k0));
    const int32_t blocks = (kn + kBlock - 1) / kBlock;
    TileSource src{};
    KvDtype tile_dtype = dtype;
    if (direct) {
      for (int32_t c = 0; c < blocks; ++c) {
        const int64_t first = k0 + c * kBlock;
        const PageId page = seq.page_table[static_cast<size_t>(first / page_size)];
        const int32_t slot = static_cast<int32_t>(first % page_size);
        src.k[c] = kv.k_block(layer, page) + kv.k_index(task.kv_head, slot, 0) * elem;
        src.v[c] = kv.v_block(layer, page) + kv.v_index(task.kv_head, slot, 0) * elem;
        if (scaled) {
          const size_t scale = kv.scale_offset_bytes(task.kv_head, slot);
          src.k_scale[c] = reinterpret_cast<const uint16_t*>(kv.k_block(layer, page) + scale);
          src.v_scale[c] = reinterpret_cast<const uint16_t*>(kv.v_block(layer, page) + scale);
        }
      }
      src.k_stride = static_cast<size_t>(page_size);
      if (scaled && rows > kMicroRows) {
        if (dtype == KvDtype::kInt8) {
          widen_tile<KvDtype::kInt8>(src, blocks, hd, kbuf, vbuf);
        } else {
          widen_tile<KvDtype::kFp8E4M3>(src, blocks, hd, kbuf, vbuf);
        }
        for (int32_t c = 0; c < blocks; ++c) {
          src.k[c] = reinterpret_cast<const std::byte*>(kbuf + c * kBlock);
          src.v[c] =
              reinterpret_cast<const std::byte*>(vbuf + static_cast<int64_t>(c) * kBlock * hd);
        }
        src.k_stride = kTile;
        tile_dtype = KvDtype::kF32;
      }
    } else {
      // Gather the tile into F32 scratch laid out like one 64-key page.
      tile_dtype = KvDtype::kF32;
      for (int32_t j = 0; j < blocks * kBlock; ++j) {
        const int64_t position = k0 + j;
        if (position < key_end) {
          const PageId page = seq.page_table[static_cast<size_t>(position / page_size)];
          kv.read_head(layer, page, static_cast<int32_t>(position % page_size), task.kv_head,
                       token_k, token_v);
        } else {
          std::fill(token_k, token_k + hd, 0.0f);
          std::fill(token_v, token_v + hd, 0.0f);
        }
        for (int32_t d = 0; d < hd; ++d) kbuf[d * kTile + j] = token_k[d];
        std::copy(token_v, token_v + hd, vbuf + static_cast<int64_t>(j) * hd);
      }
      for (int32_t c = 0; c < blocks; ++c) {
        src.k[c] = reinterpret_cast<const std::byte*>(kbuf + c * kBlock);
        src.v[c] = reinterpret_cast<const std::byte*>(vbuf + static_cast<int64_t>(c) * kBlock * hd);
      }
      src.k_stride = kTile;
    }

    // ---- scores ----
    if (paired) {
      score_rows_paired(q_bf16, rows, hd, src, blocks, scores);
    } else if (!vector_pv) {
      score_rows_scalar(qs, rows, hd, src, kn, scores);
    } else if (tile_dtype == KvDtype::kF32) {
      score_rows<KvDtype::kF32>(qs, rows, hd, src, blocks, scores);
    } else if (tile_dtype == KvDtype::kF16) {
      score_rows<KvDtype::kF16>(qs, rows, hd, src, blocks, scores);
    } else if (tile_dtype == KvDtype::kBF16) {
      score_rows<KvDtype::kBF16>(qs, rows, hd, src, blocks, scores);
    } else if (tile_dtype == KvDtype::kInt8) {
      score_rows<KvDtype::kInt8>(qs, rows, hd, src, blocks, scores);
    } else {
      score_rows<KvDtype::kFp8E4M3>(qs, rows, hd, src, blocks, scores);
    }
    // ---- online softmax ----
    for (int32_t r = 0; r < rows; ++r) {
      const int64_t lo = ws.row_low[static_cast<size_t>(r)] - k0;
      const int64_t hi = std::min<int64_t>(ws.row_position[static_cast<size_t>(r)] + 1 - k0, kn);
      softmax_row(scores + r * kTile, blocks, static_cast<int32_t>(std::max<int64_t>(lo, -1)),
                  static_cast<int32_t>(std::max<int64_t>(hi, 0)),
                  ws.row_max[static_cast<size_t>(r)], ws.row_sum[static_cast<size_t>(r)],
                  acc + r * hd, hd);
    }
    // ---- acc += P V ----
    if (paired) {
      for (int32_t r = 0; r < rows; ++r) {
        f32_to_bf16_row(scores + r * kTile, p_bf16 + r * kTile,
                        static_cast<size_t>(blocks * kBlock));
      }
      pv_rows_paired(p_bf16, rows, src, hd, kn, acc);
    } else if (!vector_pv) {
      pv_rows_scalar(scores, rows, src, hd, kn, acc);
    } else if (tile_dtype == KvDtype::kF32) {
      pv_rows<KvDtype::kF32>(scores, rows, src, hd, kn, acc);
    } else if (tile_dtype == KvDtype::kF16) {
      pv_rows<KvDtype::kF16>(scores, rows, src, hd, kn, acc);
    } else if (tile_dtype == KvDtype::kBF16) {
      pv_rows<KvDtype::kBF16>(scores, rows, src, hd, kn, acc);
    } else if (tile_dtype == KvDtype::kInt8) {
      scale_probabilities<KvDtype::kInt8>(scores, rows, src, blocks);
      pv_rows<KvDtype::kInt8>(scores, rows, src, hd, kn, acc);
    } else {
      scale_probabilities<KvDtype::kFp8E4M3>(scores, rows, src, blocks);
      pv_rows<KvDtype::kFp8E4M3>(scores, rows, src, hd, kn, acc);
    }
  }
  // ---- normalise and write ----
  for (int32_t t = 0; t < num_tokens; ++t) {
    for (int32_t g = 0; g < group; ++g) {
      const int32_t r = t * group + g;
      const float inv = 1.0f / ws.row_sum[static_cast<size_t>(r)];
      float* dst = out + (seq.first_row + task.token_begin + t) * out_stride +
                   static_cast<int64_t>(task.kv_head * group + g) * hd;
      const float* a = acc + r * hd;
      int32_t d = 0;
      for (; d + kLanes <= hd; d += kLanes) simd::store(dst + d, simd::load(a + d) * inv);
      for (; d < hd; ++d) dst[d] = a[d] * inv;
    }
  }
}

}  // namespace strata
