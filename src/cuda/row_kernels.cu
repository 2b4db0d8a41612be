// The row kernels: fused residual add + RMSNorm, RMSNorm, SiLU x mul, row gathers and bias
// adds (kernels.h). One block per row; F32 arithmetic, BF16 storage.
#include <cuda_runtime.h>

#include "cuda/cuda_common.cuh"
#include "cuda/kernel_launch.h"

namespace strata::cuda::detail {

namespace {

constexpr int kRowThreads = 256;

__global__ void fused_add_rms_norm_kernel(uint16_t* __restrict__ x, float* __restrict__ residual,
                                          const uint16_t* __restrict__ weight, int dim, float eps) {
  const size_t row = blockIdx.x;
  uint16_t* xr = x + row * dim;
  float* rr = residual + row * dim;
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = rr[i] + bf16_bits_to_float(xr[i]);
    rr[i] = v;
    sum_sq += v * v;
  }
  const float inv = rsqrtf(block_sum(sum_sq) / static_cast<float>(dim) + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    xr[i] = float_to_bf16_bits(rr[i] * inv * bf16_bits_to_float(weight[i]));
  }
}

__global__ void rms_norm_kernel(const uint16_t* x, uint16_t* y, const uint16_t* __restrict__ weight,
                                int dim, float eps) {
  const size_t row = blockIdx.x;
  const uint16_t* xr = x + row * dim;
  uint16_t* yr = y + row * dim;
  float sum_sq = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = bf16_bits_to_float(xr[i]);
    sum_sq += v * v;
  }
  const float inv = rsqrtf(block_sum(sum_sq) / static_cast<float>(dim) + eps);
  // Every thread has read its x before any writes y (block_sum synchronizes), so y may be x.
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    yr[i] = float_to_bf16_bits(bf16_bits_to_float(xr[i]) * inv * bf16_bits_to_float(weight[i]));
  }
}

__global__ void silu_mul_kernel(const uint16_t* __restrict__ gate_up, uint16_t* __restrict__ out,
                                int inter) {
  const size_t row = blockIdx.x;
  const uint16_t* gate = gate_up + row * 2 * inter;
  const uint16_t* up = gate + inter;
  uint16_t* o = out + row * inter;
  for (int i = threadIdx.x; i < inter; i += blockDim.x) {
    const float g = bf16_bits_to_float(gate[i]);
    o[i] = float_to_bf16_bits(g / (1.0f + __expf(-g)) * bf16_bits_to_float(up[i]));
  }
}

__global__ void gather_rows_kernel(const uint16_t* __restrict__ src,
                                   const int32_t* __restrict__ index, uint16_t* __restrict__ dst,
                                   int cols) {
  const size_t row = blockIdx.x;
  const uint16_t* from = src + static_cast<size_t>(index[row]) * cols;
  uint16_t* to = dst + row * cols;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) to[i] = from[i];
}

__global__ void add_bias_kernel(uint16_t* __restrict__ x, const float* __restrict__ bias,
                                int cols) {
  uint16_t* xr = x + static_cast<size_t>(blockIdx.x) * cols;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) {
    xr[i] = float_to_bf16_bits(bf16_bits_to_float(xr[i]) + bias[i]);
  }
}

}  // namespace

int launch_fused_add_rms_norm(uint16_t* x, float* residual, const uint16_t* weight, int32_t rows,
                              int32_t dim, float eps, StreamHandle stream) {
  fused_add_rms_norm_kernel<<<rows, kRowThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, residual, weight, dim, eps);
  return static_cast<int>(cudaGetLastError());
}

int launch_rms_norm(const uint16_t* x, uint16_t* y, const uint16_t* weight, int32_t rows,
                    int32_t dim, float eps, StreamHandle stream) {
  rms_norm_kernel<<<rows, kRowThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, y, weight, dim,
                                                                               eps);
  return static_cast<int>(cudaGetLastError());
}

int launch_silu_mul(const uint16_t* gate_up, uint16_t* out, int32_t rows, int32_t inter,
                    StreamHandle stream) {
  silu_mul_kernel<<<rows, kRowThreads, 0, static_cast<cudaStream_t>(stream)>>>(gate_up, out, inter);
  return static_cast<int>(cudaGetLastError());
}

int launch_gather_rows(const uint16_t* src, const int32_t* index, uint16_t* dst, int32_t rows,
                       int32_t cols, StreamHandle stream) {
  gather_rows_kernel<<<rows, kRowThreads, 0, static_cast<cudaStream_t>(stream)>>>(src, index, dst,
                                                                                  cols);
  return static_cast<int>(cudaGetLastError());
}

int launch_add_bias(uint16_t* x, const float* bias, int32_t rows, int32_t cols,
                    StreamHandle stream) {
  add_bias_kernel<<<rows, kRowThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, bias, cols);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace strata::cuda::detail
