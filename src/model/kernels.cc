#include "model/kernels.h"

#include <cmath>
#include <numbers>

#include "model/simd.h"

namespace strata {

using simd::F32x16;
using simd::kLanes;

void rmsnorm_row(const float* x, const float* weight, float* y, int64_t n, float eps) {
  F32x16 acc0{}, acc1{};
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    const F32x16 a = simd::load(x + i);
    const F32x16 b = simd::load(x + i + kLanes);
    acc0 += a * a;
    acc1 += b * b;
  }
  for (; i + kLanes <= n; i += kLanes) {
    const F32x16 a = simd::load(x + i);
    acc0 += a * a;
  }
  float sum = simd::reduce_add(acc0 + acc1);
  for (; i < n; ++i) sum += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
  i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    simd::store(y + i, simd::load(x + i) * inv * simd::load(weight + i));
  }
  for (; i < n; ++i) y[i] = x[i] * inv * weight[i];
}

void silu_mul_row(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const F32x16 g = simd::load(gate + i);
    const F32x16 u = simd::load(up + i);
    simd::store(out + i, g / (1.0f + simd::exp(-g)) * u);
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

float exp_shift_row(const float* x, float* y, int64_t n, float shift) {
  F32x16 acc{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const F32x16 e = simd::exp(simd::load(x + i) - shift);
    simd::store(y + i, e);
    acc += e;
  }
  float sum = simd::reduce_add(acc);
  for (; i < n; ++i) {
    y[i] = std::exp(x[i] - shift);
    sum += y[i];
  }
  return sum;
}

void exp_row(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) simd::store(y + i, simd::exp(simd::load(x + i)));
  for (; i < n; ++i) y[i] = std::exp(x[i]);
}

void add_row(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) simd::store(y + i, simd::load(y + i) + simd::load(x + i));
  for (; i < n; ++i) y[i] += x[i];
}

RopeTable::RopeTable(const ModelConfig& config) {
  const int32_t half = config.head_dim / 2;
  inv_freq_.resize(static_cast<size_t>(half));
  const RopeScaling& rs = config.rope_scaling;
  for (int32_t i = 0; i < half; ++i) {
    double f = std::pow(config.rope_theta,
                        -2.0 * static_cast<double>(i) / static_cast<double>(config.head_dim));
    switch (rs.type) {
      case RopeScalingType::kNone:
        break;
      case RopeScalingType::kLinear:
        f /= rs.factor;
        break;
      case RopeScalingType::kLlama3: {
        // transformers' _compute_llama3_parameters.
        const double old_context = static_cast<double>(rs.original_max_position_embeddings);
        const double low_freq_wavelen = old_context / rs.low_freq_factor;
        const double high_freq_wavelen = old_context / rs.high_freq_factor;
        const double wavelen = 2.0 * std::numbers::pi / f;
        if (wavelen > low_freq_wavelen) {
          f /= rs.factor;
        } else if (wavelen >= high_freq_wavelen) {
          const double smooth = (old_context / wavelen - rs.low_freq_factor) /
                                (rs.high_freq_factor - rs.low_freq_factor);
          f = (1.0 - smooth) * f / rs.factor + smooth * f;
        }
        break;
      }
    }
    inv_freq_[static_cast<size_t>(i)] = f;
  }
}

void RopeTable::angles(int64_t position, float* cos_out, float* sin_out) const {
  const double p = static_cast<double>(position);
  for (size_t i = 0; i < inv_freq_.size(); ++i) {
    const double a = p * inv_freq_[i];
    cos_out[i] = static_cast<float>(std::cos(a));
    sin_out[i] = static_cast<float>(std::sin(a));
  }
}

void rope_apply(float* head, const float* cos, const float* sin, int32_t half_dim) {
  float* x1 = head;
  float* x2 = head + half_dim;
  int32_t i = 0;
  for (; i + kLanes <= half_dim; i += kLanes) {
    const F32x16 a = simd::load(x1 + i);
    const F32x16 b = simd::load(x2 + i);
    const F32x16 c = simd::load(cos + i);
    const F32x16 s = simd::load(sin + i);
    simd::store(x1 + i, a * c - b * s);
    simd::store(x2 + i, b * c + a * s);
  }
  for (; i < half_dim; ++i) {
    const float a = x1[i];
    const float b = x2[i];
    x1[i] = a * cos[i] - b * sin[i];
    x2[i] = b * cos[i] + a * sin[i];
  }
}

}  // namespace strata
