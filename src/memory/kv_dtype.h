// Element types of KV pages, and the F16 / BF16 <-> F32 conversions that the pools, the
// attention kernels and the weight loader share.
//
// F16 is IEEE 754 binary16; BF16 is the top half of an IEEE binary32. Conversions to
// F32 are exact; conversions from F32 round to nearest, ties to even (NaN stays NaN).
// The row functions are vectorised when the build targets F16C / AVX-512 and give the
// same bits as the scalar ones (NaN payloads aside).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "common/result.h"

namespace strata {

enum class KvDtype : uint8_t {
  kF32,
  kF16,
  kBF16,
};

// Bytes per element: 4, 2, 2.
constexpr size_t kv_dtype_size_bytes(KvDtype dtype) {
  return dtype == KvDtype::kF32 ? 4 : 2;
}

// "f32", "f16", "bf16".
std::string_view kv_dtype_name(KvDtype dtype);

// Accepts f32/float32/fp32, f16/float16/fp16/half, bf16/bfloat16 (case-insensitive).
Result<KvDtype> parse_kv_dtype(std::string_view name);

// ---- scalar conversions ----

inline float bf16_to_f32(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t f32_to_bf16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN, keeps the sign
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);

// ---- row conversions (n elements; src and dst must not overlap) ----

void f16_to_f32_row(const uint16_t* src, float* dst, size_t n);
void f32_to_f16_row(const float* src, uint16_t* dst, size_t n);
void bf16_to_f32_row(const uint16_t* src, float* dst, size_t n);
void f32_to_bf16_row(const float* src, uint16_t* dst, size_t n);

// Converts n elements of `dtype` at `src` to F32 (a plain copy for F32).
void kv_to_f32_row(KvDtype dtype, const void* src, float* dst, size_t n);
// Converts n F32 values to `dtype` at `dst` (a plain copy for F32).
void f32_to_kv_row(KvDtype dtype, const float* src, void* dst, size_t n);

}  // namespace strata
