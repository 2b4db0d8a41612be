// Paged prefill ("extend") attention on tensor cores (kernels.h: extend_attention with
// ExtendKernel::kTensorCores), templated on the head size; each extend_attention_tc_d<D>.cu
// instantiates one. FlashAttention-2's loop, with the products on tensor cores through WMMA
// (BF16 in, F32 accumulate, 16x16x16 fragments):
//
// One block per (query tile, KV head), four warps, 64 (token, query head) rows a tile (token-
// major, as the CUDA-core kernel's: row r is token r / group of the tile, query head r % group
// of the KV head's group); each warp owns 16 rows. The queries sit in shared memory (BF16);
// the keys the tile sees are staged 64 at a time (K and V straight from the pages, 16-byte
// loads, zeros past the last key). Per step each warp computes S = Q K^T for its rows
// (fragments to shared memory), the online softmax there (two lanes a row: running max, sum,
// the rescale factor), P as BF16, and O = O * corr + P V with O kept in accumulator
// fragments in registers. The rescale needs to know which row each of a lane's accumulator
// elements holds, which WMMA leaves to the compiler: each lane learns it once, by loading a
// matrix whose entries are their own row numbers into an accumulator fragment.
//
// Shared memory is dynamic (80 KB at head size 128, 46 KB at 64), rows padded by 16 bytes so
// that the fragment loads of consecutive rows start in different banks. The sum of each row
// uses the BF16-rounded probabilities that the P V product multiplies, so numerator and
// denominator agree.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cfloat>

#include "cuda/cuda_common.cuh"
#include "cuda/extend_tile.cuh"
#include "cuda/kernel_launch.h"

namespace strata::cuda::detail {

inline constexpr int kTcThreads = 128;
inline constexpr int kTcWarps = kTcThreads / 32;
inline constexpr int kTcRows = 16 * kTcWarps;  // (token, query head) rows per block
inline constexpr int kTcKeys = 64;             // keys staged per step

template <int D>
struct TcLayout {
  static constexpr int kQPitch = D + 8;        // BF16 per Q, K or V row
  static constexpr int kSPitch = kTcKeys + 4;  // F32 per score row
  static constexpr int kPPitch = kTcKeys + 8;  // BF16 per probability row
  static constexpr size_t kQBytes = size_t{kTcRows} * kQPitch * 2;
  static constexpr size_t kKBytes = size_t{kTcKeys} * kQPitch * 2;
  static constexpr size_t kSBytes = size_t{kTcWarps} * 16 * kSPitch * 4;
  static constexpr size_t kPBytes = size_t{kTcWarps} * 16 * kPPitch * 2;
  static constexpr size_t kStatBytes = size_t{kTcWarps} * 16 * 3 * 4;
  static constexpr size_t kK = kQBytes;
  static constexpr size_t kV = kK + kKBytes;
  static constexpr size_t kS = kV + kKBytes;
  static constexpr size_t kP = kS + kSBytes;
  static constexpr size_t kStats = kP + kPBytes;
  static constexpr size_t kBytes = kStats + kStatBytes;
  // WMMA wants each fragment's first element 32-byte aligned: every region and every 16th row.
  static_assert(kK % 32 == 0 && kV % 32 == 0 && kS % 32 == 0 && kP % 32 == 0 && kStats % 32 == 0);
  static_assert((16 * kQPitch * 2) % 32 == 0 && (16 * kSPitch * 4) % 32 == 0 &&
                (16 * kPPitch * 2) % 32 == 0);
};

template <int D>
__global__ void __launch_bounds__(kTcThreads) extend_attention_tc_kernel(ExtendAttentionArgs a) {
  using namespace nvcuda;
  using L = TcLayout<D>;
  using bf16 = __nv_bfloat16;
  static_assert(D % 64 == 0);
  constexpr int kDBlocks = D / 16;
  constexpr int kKeyBlocks = kTcKeys / 16;
  constexpr int kChunks = D / 8;  // 16-byte pieces of a row
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem);
  bf16* k_s = reinterpret_cast<bf16*>(smem + L::kK);
  bf16* v_s = reinterpret_cast<bf16*>(smem + L::kV);
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  float* s_w = reinterpret_cast<float*>(smem + L::kS) + warp * 16 * L::kSPitch;
  bf16* p_w = reinterpret_cast<bf16*>(smem + L::kP) + warp * 16 * L::kPPitch;
  float* m_w = reinterpret_cast<float*>(smem + L::kStats) + warp * 48;  // running max
  float* l_w = m_w + 16;                                                // running sum
  float* c_w = m_w + 32;                                                // this step's rescale

  const ExtendTile<D> t(a, blockIdx.x, blockIdx.y, kTcRows);
  const int rows = t.rows;
  const int last_key = t.last_key;

  for (int i = tid; i < kTcRows * kChunks; i += kTcThreads) {
    const int r = i / kChunks;
    const int c = i % kChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < rows) {
      v = *reinterpret_cast<const uint4*>(t.query(a, r) + c * 8);
    }
    *reinterpret_cast<uint4*>(q_s + r * L::kQPitch + c * 8) = v;
  }
  // Which row of a 16x16 accumulator each of this lane's elements holds.
  for (int i = lane; i < 256; i += 32)
    s_w[(i / 16) * L::kSPitch + i % 16] = static_cast<float>(i / 16);
  __syncwarp();
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> probe;
  wmma::load_matrix_sync(probe, s_w, L::kSPitch, wmma::mem_row_major);
  int row_of[decltype(probe)::num_elements];
#pragma unroll
  for (int i = 0; i < decltype(probe)::num_elements; ++i) row_of[i] = static_cast<int>(probe.x[i]);
  if (lane < 16) {
    m_w[lane] = -FLT_MAX;
    l_w[lane] = 0.0f;
  }
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> o[kDBlocks];
#pragma unroll
  for (int db = 0; db < kDBlocks; ++db) wmma::fill_fragment(o[db], 0.0f);
  const bool active = warp * 16 < rows;  // warp-uniform: a warp of padding rows only idles
  __syncthreads();

  for (int k0 = 0; k0 <= last_key; k0 += kTcKeys) {
    const int n = min(kTcKeys, last_key + 1 - k0);
    for (int i = tid; i < kTcKeys * kChunks; i += kTcThreads) {
      const int j = i / kChunks;
      const int c = i % kChunks;
      uint4 kv = make_uint4(0, 0, 0, 0);
      uint4 vv = kv;
      if (j < n) {
        const size_t at = t.key_offset(k0 + j) + c * 8;
        kv = *reinterpret_cast<const uint4*>(t.k_base + at);
        vv = *reinterpret_cast<const uint4*>(t.v_base + at);
      }
      *reinterpret_cast<uint4*>(k_s + j * L::kQPitch + c * 8) = kv;
      *reinterpret_cast<uint4*>(v_s + j * L::kQPitch + c * 8) = vv;
    }
    __syncthreads();
    if (active) {
      // S = Q K^T: the warp's 16 rows against the step's keys, 16 at a time.
#pragma unroll
      for (int nb = 0; nb < kKeyBlocks; ++nb) {
        if (nb * 16 >= n) break;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> s;
        wmma::fill_fragment(s, 0.0f);
#pragma unroll
        for (int db = 0; db < kDBlocks; ++db) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> qa;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> kb;
          wmma::load_matrix_sync(qa, q_s + warp * 16 * L::kQPitch + db * 16, L::kQPitch);
          wmma::load_matrix_sync(kb, k_s + nb * 16 * L::kQPitch + db * 16, L::kQPitch);
          wmma::mma_sync(s, qa, kb, s);
        }
        wmma::store_matrix_sync(s_w + nb * 16, s, L::kSPitch, wmma::mem_row_major);
      }
      __syncwarp();
      {
        // The online softmax: lanes 2r and 2r + 1 take row r, each half of the keys.
        constexpr int kHalf = kTcKeys / 2;
        const int r = lane >> 1;
        const int j0 = (lane & 1) * kHalf;
        const int row = warp * 16 + r;
        const int pos_q = t.position(row);
        const bool live = row < rows;
        const float* srow = s_w + r * L::kSPitch;
        float mx = -FLT_MAX;
#pragma unroll 8
        for (int j = j0; j < j0 + kHalf; ++j) {
          if (live && j < n && k0 + j <= pos_q) mx = fmaxf(mx, srow[j] * a.scale);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        const float m_old = m_w[r];
        const float m_new = fmaxf(m_old, mx);
        float sum = 0.0f;
        bf16* prow = p_w + r * L::kPPitch;
#pragma unroll 8
        for (int j = j0; j < j0 + kHalf; ++j) {
          const bool ok = live && j < n && k0 + j <= pos_q;
          const bf16 p = __float2bfloat16(ok ? __expf(srow[j] * a.scale - m_new) : 0.0f);
          prow[j] = p;
          sum += __bfloat162float(p);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        const float corr = m_old == -FLT_MAX ? 0.0f : __expf(m_old - m_new);
        if ((lane & 1) == 0) {
          m_w[r] = m_new;
          l_w[r] = l_w[r] * corr + sum;
          c_w[r] = corr;
        }
      }
      __syncwarp();
      // O = O * corr + P V.
#pragma unroll
      for (int db = 0; db < kDBlocks; ++db) {
#pragma unroll
        for (int i = 0; i < decltype(probe)::num_elements; ++i) o[db].x[i] *= c_w[row_of[i]];
#pragma unroll
        for (int kb = 0; kb < kKeyBlocks; ++kb) {
          if (kb * 16 >= n) break;
          wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> pa;
          wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> vb;
          wmma::load_matrix_sync(pa, p_w + kb * 16, L::kPPitch);
          wmma::load_matrix_sync(vb, v_s + kb * 16 * L::kQPitch + db * 16, L::kQPitch);
          wmma::mma_sync(o[db], pa, vb, o[db]);
        }
      }
    }
    __syncthreads();  // before the next step's keys overwrite these
  }

  if (!active) return;
    // Normalize and write the rows, 16 dimensions at a time through the score scratch.
#pragma unroll
  for (int db = 0; db < kDBlocks; ++db) {
    wmma::store_matrix_sync(s_w, o[db], L::kSPitch, wmma::mem_row_major);
    __syncwarp();
    for (int i = lane; i < 256; i += 32) {
      const int r = i / 16;
      const int c = i % 16;
      const int row = warp * 16 + r;
      if (row >= rows) continue;
      const float l = l_w[r];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      a.out[t.out_offset(a, row) + db * 16 + c] = float_to_bf16_bits(s_w[r * L::kSPitch + c] * inv);
    }
    __syncwarp();
  }
}

template <int D>
int launch_extend_attention_tc(const ExtendAttentionArgs& a, StreamHandle stream) {
  constexpr size_t kBytes = TcLayout<D>::kBytes;
  // Above 48 KB of dynamic shared memory a kernel must ask for it (once per process).
  static const cudaError_t raised =
      cudaFuncSetAttribute(extend_attention_tc_kernel<D>,
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kBytes));
  if (raised != cudaSuccess) return static_cast<int>(raised);
  const dim3 grid(a.num_tiles, a.num_kv_heads);
  extend_attention_tc_kernel<D><<<grid, kTcThreads, kBytes, static_cast<cudaStream_t>(stream)>>>(a);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace strata::cuda::detail
