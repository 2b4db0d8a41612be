// Paged decode attention (kernels.h: decode_attention), templated on the head size; each
// decode_attention_d<D>.cu instantiates one.
//
// Phase 1, one block per (sequence, KV head, key range): the block's query heads (the KV
// head's group, at most 8) are held in shared memory, scaled. The range's keys are visited
// in tiles of 32, each tile's K and V first staged in shared memory with 16-byte loads (a
// key's head_dim values are contiguous in its page: the loads of a warp cover whole rows),
// K rows padded by one word so that the lanes scoring 32 keys at one dimension hit 32
// banks: scores for every (query head, key) pair of the tile, then one warp per query head
// updates its online softmax (running max m, sum l; a tile's 32 keys are one per lane), then
// each thread rescales and accumulates its (query head, dimension) outputs over the tile's
// values. The unnormalized output, m and l go to the workspace. Every K and V byte crosses
// from device memory once a block, in whole rows.
// Phase 2, one block per (sequence, query head), one thread per dimension: the ranges merge
// as out = sum_r acc_r e^(m_r - M) / sum_r l_r e^(m_r - M), M = max_r m_r; a range with no
// keys has l = 0 and counts for nothing.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>

#include "cuda/cuda_common.cuh"
#include "cuda/kernel_launch.h"

namespace strata::cuda::detail {

inline constexpr int kDecodeThreads = 128;
inline constexpr int kDecodeTile = 32;  // keys per tile: one per lane in the softmax update
inline constexpr int kDecodeMaxGroup = 8;

// The workspace row of one (sequence, query head, key range): its partial output (D floats),
// then its running max and sum.
template <int D>
__device__ __forceinline__ float* partial_row(const DecodeAttentionArgs& a, int seq, size_t head,
                                              int split) {
  return a.workspace +
         ((static_cast<size_t>(seq) * a.num_heads + head) * a.num_splits + split) * (D + 2);
}

template <int D>
__global__ void __launch_bounds__(kDecodeThreads)
    decode_attention_split_kernel(DecodeAttentionArgs a) {
  static_assert(D % 32 == 0 && (kDecodeMaxGroup * D) % kDecodeThreads == 0);
  constexpr int kAccPerThread = kDecodeMaxGroup * D / kDecodeThreads;
  __shared__ float q_s[kDecodeMaxGroup][D];
  __shared__ __align__(16) uint16_t k_s[kDecodeTile][D + 2];  // one word of padding a row
  __shared__ __align__(16) uint16_t v_s[kDecodeTile][D];
  __shared__ float p_s[kDecodeMaxGroup][kDecodeTile];
  __shared__ float m_s[kDecodeMaxGroup];
  __shared__ float l_s[kDecodeMaxGroup];
  __shared__ float corr_s[kDecodeMaxGroup];

  const int seq = blockIdx.x;
  const int kv_head = blockIdx.y;
  const int split = blockIdx.z;
  const int tid = threadIdx.x;
  const int group = a.num_heads / a.num_kv_heads;
  const int len = a.seq_lens[seq];
  const int chunk = (len + a.num_splits - 1) / a.num_splits;
  const int begin = min(len, split * chunk);
  const int end = min(len, begin + chunk);
  const int32_t* pages = a.page_table + static_cast<size_t>(seq) * a.page_table_stride;
  const size_t head_stride = static_cast<size_t>(a.page_size) * D;  // one head's page block
  const size_t page_stride = head_stride * a.num_kv_heads;          // one page
  const uint16_t* k_base = a.k_pages + static_cast<size_t>(kv_head) * head_stride;
  const uint16_t* v_base = a.v_pages + static_cast<size_t>(kv_head) * head_stride;

  for (int i = tid; i < group * D; i += kDecodeThreads) {
    const int g = i / D;
    const int d = i % D;
    const size_t h = static_cast<size_t>(kv_head) * group + g;
    const size_t q_stride = a.q_stride > 0 ? a.q_stride : static_cast<size_t>(a.num_heads) * D;
    q_s[g][d] = bf16_bits_to_float(a.q[static_cast<size_t>(seq) * q_stride + h * D + d]) * a.scale;
  }
  if (tid < kDecodeMaxGroup) {
    m_s[tid] = -FLT_MAX;
    l_s[tid] = 0.0f;
  }
  float acc[kAccPerThread];
#pragma unroll
  for (int j = 0; j < kAccPerThread; ++j) acc[j] = 0.0f;
  __syncthreads();

  for (int t0 = begin; t0 < end; t0 += kDecodeTile) {
    const int n = min(kDecodeTile, end - t0);
    // The tile's keys and values, 16 bytes a thread at a time (K as four words: its rows are
    // padded by one).
    constexpr int kChunks = D / 8;
    for (int i = tid; i < n * kChunks; i += kDecodeThreads) {
      const int t = i / kChunks;
      const int c = i % kChunks;
      const int pos = t0 + t;
      const size_t at = static_cast<size_t>(pages[pos / a.page_size]) * page_stride +
                        static_cast<size_t>(pos % a.page_size) * D + c * 8;
      const uint4 kv = *reinterpret_cast<const uint4*>(k_base + at);
      auto* kw = reinterpret_cast<uint32_t*>(&k_s[t][c * 8]);
      kw[0] = kv.x;
      kw[1] = kv.y;
      kw[2] = kv.z;
      kw[3] = kv.w;
      *reinterpret_cast<uint4*>(&v_s[t][c * 8]) = *reinterpret_cast<const uint4*>(v_base + at);
    }
    __syncthreads();
    // Scores of the tile: (query head, key) pairs over the threads.
    for (int i = tid; i < group * kDecodeTile; i += kDecodeThreads) {
      const int g = i / kDecodeTile;
      const int t = i % kDecodeTile;
      float s = -FLT_MAX;
      if (t < n) {
        const auto* kw = reinterpret_cast<const uint32_t*>(&k_s[t][0]);
        float dot = 0.0f;
#pragma unroll 8
        for (int d2 = 0; d2 < D / 2; ++d2) {
          const float2 k2 = bf16x2_to_float2(kw[d2]);
          dot += q_s[g][2 * d2] * k2.x + q_s[g][2 * d2 + 1] * k2.y;
        }
        s = dot;
      }
      p_s[g][t] = s;
    }
    __syncthreads();
    // Online softmax: one warp per query head, one key per lane.
    const int warp = tid >> 5;
    const int lane = tid & 31;
    for (int g = warp; g < group; g += kDecodeThreads / 32) {
      const float s = p_s[g][lane];
      const float m_old = m_s[g];
      const float m_new = fmaxf(m_old, warp_max(lane < n ? s : -FLT_MAX));
      const float p = lane < n ? __expf(s - m_new) : 0.0f;
      const float sum = warp_sum(p);
      p_s[g][lane] = p;
      if (lane == 0) {
        const float corr = m_old == -FLT_MAX ? 0.0f : __expf(m_old - m_new);
        corr_s[g] = corr;
        l_s[g] = l_s[g] * corr + sum;
        m_s[g] = m_new;
      }
    }
    __syncthreads();
    // Outputs: each thread's (query head, dimension) pairs, rescaled, plus the tile's values.
#pragma unroll
    for (int j = 0; j < kAccPerThread; ++j) {
      const int i = tid + j * kDecodeThreads;
      const int g = i / D;
      const int d = i % D;
      if (g < group) {
        float o = acc[j] * corr_s[g];
        for (int t = 0; t < n; ++t) o += p_s[g][t] * bf16_bits_to_float(v_s[t][d]);
        acc[j] = o;
      }
    }
    __syncthreads();
  }

  // The range's partial result: [seq][head][split][D + 2] = acc..., m, l.
#pragma unroll
  for (int j = 0; j < kAccPerThread; ++j) {
    const int i = tid + j * kDecodeThreads;
    const int g = i / D;
    if (g < group)
      partial_row<D>(a, seq, static_cast<size_t>(kv_head) * group + g, split)[i % D] = acc[j];
  }
  if (tid < group) {
    float* out = partial_row<D>(a, seq, static_cast<size_t>(kv_head) * group + tid, split);
    out[D] = m_s[tid];
    out[D + 1] = l_s[tid];
  }
}

template <int D>
__global__ void __launch_bounds__(D) decode_attention_merge_kernel(DecodeAttentionArgs a) {
  const int seq = blockIdx.x;
  const int h = blockIdx.y;
  const int d = threadIdx.x;
  const size_t row = static_cast<size_t>(D) + 2;
  const float* parts = partial_row<D>(a, seq, static_cast<size_t>(h), 0);  // its ranges in a row
  float m_max = -FLT_MAX;
  for (int r = 0; r < a.num_splits; ++r) {
    if (parts[r * row + D + 1] > 0.0f) m_max = fmaxf(m_max, parts[r * row + D]);
  }
  float sum = 0.0f;
  float o = 0.0f;
  for (int r = 0; r < a.num_splits; ++r) {
    const float l = parts[r * row + D + 1];
    if (l > 0.0f) {
      const float w = __expf(parts[r * row + D] - m_max);
      sum += l * w;
      o += parts[r * row + d] * w;
    }
  }
  a.out[(static_cast<size_t>(seq) * a.num_heads + h) * D + d] =
      float_to_bf16_bits(sum > 0.0f ? o / sum : 0.0f);
}

template <int D>
int launch_decode_attention(const DecodeAttentionArgs& a, StreamHandle stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 split_grid(a.num_seqs, a.num_kv_heads, a.num_splits);
  decode_attention_split_kernel<D><<<split_grid, kDecodeThreads, 0, s>>>(a);
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return static_cast<int>(e);
  const dim3 merge_grid(a.num_seqs, a.num_heads);
  decode_attention_merge_kernel<D><<<merge_grid, D, 0, s>>>(a);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace strata::cuda::detail
