// Element-wise and row kernels of the forward pass: RMSNorm, SiLU-and-multiply,
// rotary embeddings, the vectorised exponential. Each works on one row; the forward pass
// spreads rows over its thread pool. All are F32 in and out, vectorised 16 lanes wide
// (simd.h), and accept unaligned pointers.
#pragma once

#include <cstdint>
#include <vector>

#include "model/model_config.h"

namespace strata {

// y = x / sqrt(mean(x^2) + eps) * weight, as Hugging Face's LlamaRMSNorm (in F32).
// y may alias x.
void rmsnorm_row(const float* x, const float* weight, float* y, int64_t n, float eps);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + e^-g). out may alias gate or up.
void silu_mul_row(const float* gate, const float* up, float* out, int64_t n);

// y[i] = e^(x[i] - shift); returns the sum of y. y may alias x.
float exp_shift_row(const float* x, float* y, int64_t n, float shift);

// y[i] = e^x[i] (vectorised, relative error about 2e-7; -inf gives 0).
void exp_row(const float* x, float* y, int64_t n);

// y += x.
void add_row(float* y, const float* x, int64_t n);

// The rotary embedding's per-position angles: inv_freq[i] = theta^(-2i/d), adjusted by
// the config's rope_scaling (linear or Llama 3), for i in [0, head_dim / 2).
class RopeTable {
 public:
  RopeTable() = default;
  explicit RopeTable(const ModelConfig& config);

  int32_t half_dim() const { return static_cast<int32_t>(inv_freq_.size()); }
  const std::vector<double>& inv_freq() const { return inv_freq_; }

  // cos and sin of position * inv_freq[i], computed in double and rounded, into
  // cos_out[0..half_dim) and sin_out[0..half_dim).
  void angles(int64_t position, float* cos_out, float* sin_out) const;

 private:
  std::vector<double> inv_freq_;
};

// Rotates one head in place, Hugging Face's "rotate_half" convention: element i pairs
// with element i + d/2.
void rope_apply(float* head, const float* cos, const float* sin, int32_t half_dim);

}  // namespace strata
