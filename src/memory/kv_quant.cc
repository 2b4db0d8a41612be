#include "memory/kv_quant.h"

#include <array>
#include <cmath>
#include <cstring>

#include "common/check.h"

namespace strata {

namespace {

float amax_finite(const float* src, size_t n) {
  float amax = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    const float a = std::fabs(src[i]);
    if (std::isfinite(a) && a > amax) amax = a;
  }
  return amax;
}

// The smallest BF16 value >= x (x finite, >= 0).
float round_up_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0xffffu) != 0)
    u = (u & 0xffff0000u) + 0x10000u;
  else
    u &= 0xffff0000u;
  float out;
  std::memcpy(&out, &u, sizeof out);
  return out;
}

uint8_t int8_code(float x, float scale) {
  if (std::isnan(x) || scale == 0.0f) return 0;
  float q = std::nearbyint(x / scale);  // the default rounding mode: nearest, ties to even
  q = q > kInt8MaxCode ? kInt8MaxCode : q < -kInt8MaxCode ? -kInt8MaxCode : q;
  return static_cast<uint8_t>(static_cast<int8_t>(q));
}

}  // namespace

uint8_t f32_to_fp8_e4m3(float value) {
  uint32_t u;
  std::memcpy(&u, &value, sizeof u);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if (std::isnan(value)) return sign | 0x7f;
  const float a = std::fabs(value);
  if (a >= kFp8E4M3Max) return sign | 0x7e;  // saturate (infinity included)
  if (a < 0x1p-6f) {
    // Subnormal (and zero): m * 2^-9 for m in [0, 8]; 8 is the smallest normal, whose
    // code is 0x08 too.
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  // Normal: keep 3 mantissa bits, rounding to nearest even in the F32 bits; a carry
  // moves into the exponent as it should. F32's exponent bias is 127, E4M3's 7.
  uint32_t b;
  std::memcpy(&b, &a, sizeof b);
  b += 0x7ffffu + ((b >> 20) & 1u);
  const uint32_t code = (b >> 20) - (120u << 3);
  return sign | static_cast<uint8_t>(code > 0x7eu ? 0x7eu : code);
}

namespace {

float decode_fp8_e4m3(uint8_t code) {
  const uint32_t exponent = (code >> 3) & 0xfu;
  const uint32_t mantissa = code & 0x7u;
  float magnitude;
  if (exponent == 15 && mantissa == 7) {
    magnitude = std::nanf("");
  } else if (exponent == 0) {
    magnitude = static_cast<float>(mantissa) * 0x1p-9f;
  } else {
    magnitude =
        std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, static_cast<int>(exponent) - 7);
  }
  return (code & 0x80) != 0 ? -magnitude : magnitude;
}

}  // namespace

float fp8_e4m3_to_f32(uint8_t code) {
  static const std::array<float, 256> kTable = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c)
      t[static_cast<size_t>(c)] = decode_fp8_e4m3(static_cast<uint8_t>(c));
    return t;
  }();
  return kTable[code];
}

float quantize_kv_row(KvDtype dtype, const float* src, size_t n, uint8_t* codes, size_t stride) {
  STRATA_CHECK_MSG(kv_dtype_is_scaled(dtype), "quantize_kv_row on an unscaled KV dtype");
  const float amax = amax_finite(src, n);
  if (dtype == KvDtype::kInt8) {
    const float scale = round_up_bf16(amax / kInt8MaxCode);
    for (size_t i = 0; i < n; ++i) codes[i * stride] = int8_code(src[i], scale);
    return scale;
  }
  const float scale = round_up_bf16(amax / kFp8E4M3Max);
  for (size_t i = 0; i < n; ++i) {
    const float x = src[i];
    codes[i * stride] = std::isnan(x) || scale == 0.0f ? uint8_t{0} : f32_to_fp8_e4m3(x / scale);
  }
  return scale;
}

void dequantize_kv_row(KvDtype dtype, const uint8_t* codes, float scale, float* dst, size_t n,
                       size_t stride) {
  STRATA_CHECK_MSG(kv_dtype_is_scaled(dtype), "dequantize_kv_row on an unscaled KV dtype");
  if (dtype == KvDtype::kInt8) {
    for (size_t i = 0; i < n; ++i) {
      dst[i] = static_cast<float>(static_cast<int8_t>(codes[i * stride])) * scale;
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) dst[i] = fp8_e4m3_to_f32(codes[i * stride]) * scale;
}

}  // namespace strata
