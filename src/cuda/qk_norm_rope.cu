// Q/K norm + RoPE + the K/V write into pages (kernels.h, QkNormRopeStoreArgs): one block per
// token, one warp per head. A lane holds head_dim / 32 elements, i, i + 32, ...: with
// rotate_half pairing element i with i + head_dim / 2, both halves of every pair are in the
// same lane, so the rotation needs no exchange and the norm one warp sum. F32 arithmetic,
// BF16 storage, as the CPU engine (which rounds only where it stores).
#include <cuda_runtime.h>

#include "cuda/cuda_common.cuh"
#include "cuda/kernel_launch.h"

namespace strata::cuda::detail {

namespace {

constexpr int kWarps = 8;

template <int kHeadDim>
__device__ __forceinline__ void load_head(const uint16_t* src, float (&x)[kHeadDim / 32]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < kHeadDim / 32; ++j) x[j] = bf16_bits_to_float(src[lane + 32 * j]);
}

template <int kHeadDim>
__device__ __forceinline__ void store_head(uint16_t* dst, const float (&x)[kHeadDim / 32]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < kHeadDim / 32; ++j) dst[lane + 32 * j] = float_to_bf16_bits(x[j]);
}

// RMSNorm by `weight` (if any), then the rotation by the token's angles.
template <int kHeadDim>
__device__ __forceinline__ void norm_rotate(float (&x)[kHeadDim / 32], const uint16_t* weight,
                                            const float* cos_sin, float eps) {
  constexpr int kPer = kHeadDim / 32;
  const int lane = threadIdx.x & 31;
  if (weight != nullptr) {
    float sq = 0.0f;
#pragma unroll
    for (int j = 0; j < kPer; ++j) sq += x[j] * x[j];
    const float inv = rsqrtf(warp_sum(sq) / static_cast<float>(kHeadDim) + eps);
#pragma unroll
    for (int j = 0; j < kPer; ++j) x[j] = x[j] * inv * bf16_bits_to_float(weight[lane + 32 * j]);
  }
  constexpr int kHalf = kPer / 2;  // element lane + 32 j pairs with element lane + 32 (j + kHalf)
#pragma unroll
  for (int j = 0; j < kHalf; ++j) {
    const int i = lane + 32 * j;  // < head_dim / 2
    const float c = cos_sin[i];
    const float s = cos_sin[kHeadDim / 2 + i];
    const float a = x[j];
    const float b = x[j + kHalf];
    x[j] = a * c - b * s;
    x[j + kHalf] = b * c + a * s;
  }
}

template <int kHeadDim>
__global__ void qk_norm_rope_store_kernel(QkNormRopeStoreArgs a) {
  const int token = blockIdx.x;
  const int warp = threadIdx.x >> 5;
  const int q_heads = a.num_heads;
  const int kv_heads = a.num_kv_heads;
  const size_t row = static_cast<size_t>(q_heads + 2 * kv_heads) * kHeadDim;
  uint16_t* qkv = a.qkv + static_cast<size_t>(token) * row;
  const float* cos_sin = a.cos_sin + static_cast<size_t>(token) * kHeadDim;
  const int slot = a.slots[token];
  const int page = slot >= 0 ? slot / a.page_size : 0;
  const int in_page = slot >= 0 ? slot % a.page_size : 0;
  float x[kHeadDim / 32];
  // Heads 0 .. q_heads - 1 are queries, then keys, then values; warps take them in turn.
  for (int h = warp; h < q_heads + 2 * kv_heads; h += kWarps) {
    uint16_t* head = qkv + static_cast<size_t>(h) * kHeadDim;
    load_head<kHeadDim>(head, x);
    if (h < q_heads) {
      norm_rotate<kHeadDim>(x, a.q_norm_weight, cos_sin, a.eps);
      store_head<kHeadDim>(head, x);
      continue;
    }
    const bool is_key = h < q_heads + kv_heads;
    const int kv = is_key ? h - q_heads : h - q_heads - kv_heads;
    if (is_key) {
      norm_rotate<kHeadDim>(x, a.k_norm_weight, cos_sin, a.eps);
      store_head<kHeadDim>(head, x);
    }
    if (slot < 0) continue;
    uint16_t* pages = is_key ? a.k_pages : a.v_pages;
    const size_t at =
        ((static_cast<size_t>(page) * kv_heads + kv) * a.page_size + in_page) * kHeadDim;
    store_head<kHeadDim>(pages + at, x);
  }
}

}  // namespace

int launch_qk_norm_rope_store(const QkNormRopeStoreArgs& args, StreamHandle stream) {
  if (args.num_tokens == 0) return 0;
  const auto s = static_cast<cudaStream_t>(stream);
  if (args.head_dim == 64) {
    qk_norm_rope_store_kernel<64><<<args.num_tokens, kWarps * 32, 0, s>>>(args);
  } else {
    qk_norm_rope_store_kernel<128><<<args.num_tokens, kWarps * 32, 0, s>>>(args);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace strata::cuda::detail
