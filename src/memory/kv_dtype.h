// Element types of KV pages, and the F16 / BF16 <-> F32 conversions that the pools, the
// attention kernels and the weight loader share.
//
// The 8-bit types (int8, fp8_e4m3) are scaled: each (token, KV head) row of head_dim
// codes carries one BF16 scale, stored inside the page's block after the codes, so that
// a block stays one self-contained run of bytes (kv_block_bytes; kv_quant.h quantizes).
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
  kInt8,     // symmetric int8 codes in [-127, 127], value = code * scale
  kFp8E4M3,  // OCP E4M3FN codes (max 448, no infinity), value = fp8(code) * scale
};

// The last enumerator (for decoders that check a stored byte).
inline constexpr KvDtype kLastKvDtype = KvDtype::kFp8E4M3;

// Whether elements are 8-bit codes with a scale per (token, KV head).
constexpr bool kv_dtype_is_scaled(KvDtype dtype) {
  return dtype == KvDtype::kInt8 || dtype == KvDtype::kFp8E4M3;
}

// Bytes per element (per code for the scaled types): 4, 2, 2, 1, 1.
constexpr size_t kv_dtype_size_bytes(KvDtype dtype) {
  return dtype == KvDtype::kF32 ? 4 : kv_dtype_is_scaled(dtype) ? 1 : 2;
}

// Bytes of one scale of a scaled type (a BF16 per token and KV head: F32's range, so no
// row is too small or too large to scale, in half F32's bytes: 64 codes and a scale are
// 1.94x fewer bytes than 64 BF16 values, 1.88x with an F32 scale).
inline constexpr size_t kKvScaleBytes = 2;

// Bytes of one block (one page's K or V in one layer): the elements, then for the
// scaled types one scale per (KV head, slot), laid out [kv_head][slot] after the codes.
// Every size of a block, a page or a pool derives from this one function.
constexpr size_t kv_block_bytes(KvDtype dtype, size_t num_kv_heads, size_t page_size,
                                size_t head_dim) {
  const size_t rows = num_kv_heads * page_size;
  return rows * head_dim * kv_dtype_size_bytes(dtype) +
         (kv_dtype_is_scaled(dtype) ? rows * kKvScaleBytes : 0);
}

// "f32", "f16", "bf16", "int8", "fp8_e4m3".
std::string_view kv_dtype_name(KvDtype dtype);

// Accepts f32/float32/fp32, f16/float16/fp16/half, bf16/bfloat16, int8, fp8_e4m3/fp8
// (vLLM's alias) (case-insensitive).
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

// Converts n elements of an unscaled `dtype` at `src` to F32 (a plain copy for F32).
// The scaled types go through kv_quant.h (checked).
void kv_to_f32_row(KvDtype dtype, const void* src, float* dst, size_t n);
// Converts n F32 values to `dtype` at `dst` (a plain copy for F32).
void f32_to_kv_row(KvDtype dtype, const float* src, void* dst, size_t n);

}  // namespace strata
