// Quantization of KV rows to the scaled 8-bit dtypes (kv_dtype.h), and back.
//
// A row is one token's head_dim values of one KV head. It is stored as head_dim codes and
// one BF16 scale (per token and KV head, for K and V alike; docs/model.md gives the
// measured errors behind choosing per-token scales for K over per-channel ones):
//
//   int8      scale = up(amax / 127), code = clamp(round_half_even(x / scale), -127, 127);
//             value = code * scale. -128 is never written.
//   fp8_e4m3  scale = up(amax / 448), code = fp8_e4m3(x / scale) (OCP E4M3FN: 1 sign, 4
//             exponent bits biased by 7, 3 mantissa bits, subnormals, max 448, no
//             infinity; rounded to nearest even, saturating at +-448); value =
//             fp8_to_f32(code) * scale.
//
// up() rounds up to a BF16 value (the scale is stored as BF16; rounding up keeps
// amax / scale within the largest code, so only +-inf ever saturates); it costs at most
// 2^-8 of the code range. amax is the largest |x| over the row's finite values. An all-zero row (or
// one with no finite value) has scale 0 and decodes to zeros. Non-finite inputs are not
// representable: NaN stores code 0, +-inf saturates to the largest code of its sign (so decodes to
// +-amax of the row's finite values). Every scale written is finite and >= 0.
//
// Everything here is a pure function of its inputs; the scalar code is the reference that
// the pools and the attention kernels are tested against.
#pragma once

#include <cstddef>
#include <cstdint>

#include "memory/kv_dtype.h"

namespace strata {

inline constexpr float kInt8MaxCode = 127.0f;
inline constexpr float kFp8E4M3Max = 448.0f;

// One E4M3FN value, rounded to nearest even and saturated to +-448 (inf included); NaN
// gives 0x7f (E4M3FN's NaN, with the input's sign).
uint8_t f32_to_fp8_e4m3(float value);
// Exact; 0x7f and 0xff decode to NaN.
float fp8_e4m3_to_f32(uint8_t code);

// Quantizes n values of `src` to `dtype` (int8 or fp8_e4m3, checked): codes[i * stride]
// for i in [0, n), and returns the row's scale (a BF16 value, exactly).
float quantize_kv_row(KvDtype dtype, const float* src, size_t n, uint8_t* codes, size_t stride = 1);
// Decodes n codes (codes[i * stride]) with `scale` into dst.
void dequantize_kv_row(KvDtype dtype, const uint8_t* codes, float scale, float* dst, size_t n,
                       size_t stride = 1);

}  // namespace strata
