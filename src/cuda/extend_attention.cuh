// Paged prefill ("extend") attention (kernels.h: extend_attention), templated on the head
// size; each extend_attention_d<D>.cu instantiates one.
//
// One block per (query tile, KV head), four warps. The tile's rows are (token, query head)
// pairs, token-major: row r is token r / group of the tile and query head r % group of the
// KV head's group, at most kExtendRows of them; their queries sit in shared memory (BF16,
// rows padded by one word so that lanes reading one dimension of different rows hit
// different banks). The keys the tile sees — from 0 to its last token's position — are
// staged 32 at a time (K and V in shared memory, straight from the pages), and each warp
// takes rows warp, warp + 4, ...: lane j scores key j of the step (masked beyond the row's
// own position: causal), the warp updates the row's online softmax (running max and sum in
// registers), and each lane rescales and accumulates its dimensions (lane, lane + 32, ...)
// of the row's output, kept in shared memory in F32. The rows are then normalized and
// written as BF16.
//
// Correctness first, on CUDA cores in F32: tensor cores (mma) and wider tiles come with
// the GPU benchmarks (docs/cuda.md).
#pragma once

#include <cuda_runtime.h>

#include <cfloat>

#include "cuda/cuda_common.cuh"
#include "cuda/extend_tile.cuh"
#include "cuda/kernel_launch.h"

namespace strata::cuda::detail {

inline constexpr int kExtendThreads = 128;
inline constexpr int kExtendWarps = kExtendThreads / 32;
inline constexpr int kExtendRows = 32;  // (token, query head) rows per block
inline constexpr int kExtendKeys = 32;  // keys staged per step: one per lane when scoring
inline constexpr int kExtendRowsPerWarp = kExtendRows / kExtendWarps;

template <int D>
__global__ void __launch_bounds__(kExtendThreads) extend_attention_kernel(ExtendAttentionArgs a) {
  static_assert(D % 64 == 0);
  constexpr int kPitch = D + 2;     // BF16 per staged row: one word of padding
  constexpr int kPerLane = D / 32;  // output dimensions per lane
  __shared__ __align__(16) uint16_t q_s[kExtendRows][kPitch];
  __shared__ __align__(16) uint16_t k_s[kExtendKeys][kPitch];
  __shared__ __align__(16) uint16_t v_s[kExtendKeys][D];
  __shared__ float acc_s[kExtendRows][D];

  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const ExtendTile<D> t(a, blockIdx.x, blockIdx.y, kExtendRows);
  const int rows = t.rows;
  const int last_key = t.last_key;

  for (int i = tid; i < kExtendRows * D; i += kExtendThreads) {
    const int r = i / D;
    const int d = i % D;
    q_s[r][d] = r < rows ? t.query(a, r)[d] : uint16_t{0};
    acc_s[r][d] = 0.0f;
  }
  float m[kExtendRowsPerWarp];
  float l[kExtendRowsPerWarp];
#pragma unroll
  for (int k = 0; k < kExtendRowsPerWarp; ++k) {
    m[k] = -FLT_MAX;
    l[k] = 0.0f;
  }
  __syncthreads();

  for (int k0 = 0; k0 <= last_key; k0 += kExtendKeys) {
    const int n = min(kExtendKeys, last_key + 1 - k0);
    for (int i = tid; i < kExtendKeys * D; i += kExtendThreads) {
      const int j = i / D;
      const int d = i % D;
      if (j < n) {
        const size_t at = t.key_offset(k0 + j) + d;
        k_s[j][d] = t.k_base[at];
        v_s[j][d] = t.v_base[at];
      }
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kExtendRowsPerWarp; ++k) {
      const int r = warp + k * kExtendWarps;
      if (r >= rows) continue;  // the whole warp
      const int pos_q = t.position(r);
      float s = -FLT_MAX;
      if (lane < n && k0 + lane <= pos_q) {
        const auto* qw = reinterpret_cast<const uint32_t*>(&q_s[r][0]);
        const auto* kw = reinterpret_cast<const uint32_t*>(&k_s[lane][0]);
        float dot = 0.0f;
#pragma unroll 8
        for (int d2 = 0; d2 < D / 2; ++d2) {
          const float2 qv = bf16x2_to_float2(qw[d2]);
          const float2 kv = bf16x2_to_float2(kw[d2]);
          dot += qv.x * kv.x + qv.y * kv.y;
        }
        s = dot * a.scale;
      }
      const float m_new = fmaxf(m[k], warp_max(s));
      if (m_new == -FLT_MAX) continue;  // nothing visible yet (the whole warp)
      const float p = s == -FLT_MAX ? 0.0f : __expf(s - m_new);
      const float corr = m[k] == -FLT_MAX ? 0.0f : __expf(m[k] - m_new);
      l[k] = l[k] * corr + warp_sum(p);
      m[k] = m_new;
      float o[kPerLane];
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) o[c] = acc_s[r][lane + 32 * c] * corr;
      for (int j = 0; j < n; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
        for (int c = 0; c < kPerLane; ++c) o[c] += pj * bf16_bits_to_float(v_s[j][lane + 32 * c]);
      }
#pragma unroll
      for (int c = 0; c < kPerLane; ++c) acc_s[r][lane + 32 * c] = o[c];
    }
    __syncthreads();
  }

#pragma unroll
  for (int k = 0; k < kExtendRowsPerWarp; ++k) {
    const int r = warp + k * kExtendWarps;
    if (r >= rows) continue;
    const float inv = l[k] > 0.0f ? 1.0f / l[k] : 0.0f;
    uint16_t* out = a.out + t.out_offset(a, r);
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) {
      out[lane + 32 * c] = float_to_bf16_bits(acc_s[r][lane + 32 * c] * inv);
    }
  }
}

template <int D>
int launch_extend_attention(const ExtendAttentionArgs& a, StreamHandle stream) {
  const dim3 grid(a.num_tiles, a.num_kv_heads);
  extend_attention_kernel<D><<<grid, kExtendThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace strata::cuda::detail
