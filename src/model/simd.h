// Portable 16-lane float vectors (GCC vector extensions) for the kernels. With
// -march=native on an AVX-512 machine each is one zmm register; elsewhere the compiler
// splits it into narrower registers, so the same code runs (and is tested) everywhere.
//
// Internal to src/model: include only from .cc files.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX512BF16__)
#include <immintrin.h>
// GCC 12's AVX-512 conversion and reduction intrinsics start from _mm512_undefined_*()
// and trip these warnings inside the compiler's own header.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "memory/kv_dtype.h"

// Passing 64-byte vectors by value changes the ABI when AVX-512 is off; every function
// here is inline, so no ABI boundary is crossed.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace strata::simd {

constexpr int kLanes = 16;

typedef float F32x16 __attribute__((vector_size(64)));
typedef int32_t I32x16 __attribute__((vector_size(64)));
typedef uint32_t U32x16 __attribute__((vector_size(64)));
typedef uint16_t U16x16 __attribute__((vector_size(32)));

#define STRATA_SIMD_INLINE inline __attribute__((always_inline))

STRATA_SIMD_INLINE F32x16 load(const float* p) {
  F32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

STRATA_SIMD_INLINE void store(float* p, F32x16 v) {
  std::memcpy(p, &v, sizeof v);
}

// All lanes x. (Not "F32x16{} + x": adding +0.0 is not an identity for -0.0, so the
// compiler would have to keep the addition.)
STRATA_SIMD_INLINE F32x16 splat(float x) {
  return F32x16{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
}

// 16 BF16 values widened to F32 (exact).
STRATA_SIMD_INLINE F32x16 load_bf16(const uint16_t* p) {
  U16x16 h;
  std::memcpy(&h, p, sizeof h);
  const U32x16 wide = __builtin_convertvector(h, U32x16) << 16;
  F32x16 v;
  std::memcpy(&v, &wide, sizeof v);
  return v;
}

// 16 F16 values widened to F32 (exact).
STRATA_SIMD_INLINE F32x16 load_f16(const uint16_t* p) {
#if defined(__AVX512F__)
  const __m512 w = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  F32x16 v;
  std::memcpy(&v, &w, sizeof v);
  return v;
#else
  float lanes[kLanes];
  f16_to_f32_row(p, lanes, kLanes);
  return load(lanes);
#endif
}

STRATA_SIMD_INLINE float reduce_add(F32x16 v) {
#if defined(__AVX512F__)
  __m512 w;
  std::memcpy(&w, &v, sizeof w);
  return _mm512_reduce_add_ps(w);
#else
  // Pairwise halving: the compiler turns it into shuffles.
  float lanes[kLanes];
  std::memcpy(lanes, &v, sizeof lanes);
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int i = 0; i < width; ++i) lanes[i] += lanes[i + width];
  }
  return lanes[0];
#endif
}

STRATA_SIMD_INLINE float reduce_max(F32x16 v) {
#if defined(__AVX512F__)
  __m512 w;
  std::memcpy(&w, &v, sizeof w);
  return _mm512_reduce_max_ps(w);
#else
  float lanes[kLanes];
  std::memcpy(lanes, &v, sizeof lanes);
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int i = 0; i < width; ++i)
      lanes[i] = lanes[i] > lanes[i + width] ? lanes[i] : lanes[i + width];
  }
  return lanes[0];
#endif
}

STRATA_SIMD_INLINE F32x16 max(F32x16 a, F32x16 b) {
  return a > b ? a : b;
}

// e^x for every lane, relative error about 2e-7 (Cephes' expf polynomial). Lanes
// below about -87.3 (including -inf) give 0 (or an F32 subnormal); lanes above 88 give
// e^88 (finite), which only ever divides (SiLU) or is never produced (softmax subtracts
// the row maximum).
STRATA_SIMD_INLINE F32x16 exp(F32x16 x) {
  // n = round(x / ln 2) via the 1.5 * 2^23 trick (exact for |n| < 2^22), r = x - n ln 2
  // in two parts, e^r by Cephes' polynomial, then e^x = 2^n e^r.
  const F32x16 kMagic = splat(12582912.0f);
#if defined(__AVX512F__)
  // vscalefps computes p * 2^n with the exponent range handled in hardware (0 below
  // the smallest subnormal, infinity above the largest float), so only -inf (whose
  // reduction would be NaN) needs a clamp; -110 gives exactly 0.
  x = x > -110.0f ? x : splat(-110.0f);
  x = x < 88.0f ? x : splat(88.0f);
#else
  const F32x16 kMin = splat(-87.3365447504019f);
  const I32x16 underflow = x < kMin;
  x = x > 88.0f ? splat(88.0f) : x;
  x = x < kMin ? kMin : x;
#endif
  F32x16 n = x * 1.44269504088896341f + kMagic;
  n = n - kMagic;
  F32x16 r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  const F32x16 r2 = r * r;
  F32x16 p = splat(1.9875691500E-4f);
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  p = p * r2 + r + 1.0f;
#if defined(__AVX512F__)
  __m512 pv, nv;
  std::memcpy(&pv, &p, sizeof pv);
  std::memcpy(&nv, &n, sizeof nv);
  const __m512 result = _mm512_scalef_ps(pv, nv);
  F32x16 out;
  std::memcpy(&out, &result, sizeof out);
  return out;
#else
  const I32x16 bits = (__builtin_convertvector(n, I32x16) + 127) << 23;
  F32x16 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  const F32x16 result = p * scale;
  return underflow ? splat(0.0f) : result;
#endif
}

// acc + a_even * b_even + a_odd * b_odd per lane, where each 32-bit lane of a and b holds
// two BF16 values (the pair of columns 2p, 2p + 1). One vdpbf16ps where the CPU has it.
STRATA_SIMD_INLINE F32x16 dot_pairs(F32x16 acc, U32x16 a, U32x16 b) {
#if defined(__AVX512BF16__)
  __m512 accv;
  __m512bh av, bv;
  std::memcpy(&accv, &acc, sizeof accv);
  std::memcpy(&av, &a, sizeof av);
  std::memcpy(&bv, &b, sizeof bv);
  accv = _mm512_dpbf16_ps(accv, av, bv);
  std::memcpy(&acc, &accv, sizeof acc);
  return acc;
#else
  const U32x16 a_even = a << 16, a_odd = a & 0xffff0000u;
  const U32x16 b_even = b << 16, b_odd = b & 0xffff0000u;
  F32x16 ae, ao, be, bo;
  std::memcpy(&ae, &a_even, sizeof ae);
  std::memcpy(&ao, &a_odd, sizeof ao);
  std::memcpy(&be, &b_even, sizeof be);
  std::memcpy(&bo, &b_odd, sizeof bo);
  return acc + ae * be + ao * bo;
#endif
}

STRATA_SIMD_INLINE U32x16 load_u32(const uint16_t* p) {
  U32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

STRATA_SIMD_INLINE U32x16 broadcast_pair(const uint16_t* p) {
  uint32_t x;
  std::memcpy(&x, p, sizeof x);
  return U32x16{} + x;
}

}  // namespace strata::simd
