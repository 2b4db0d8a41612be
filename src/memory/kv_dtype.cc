#include "memory/kv_dtype.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "common/check.h"

#if defined(__F16C__) || defined(__AVX512F__)
#include <immintrin.h>
// GCC 12's AVX-512 conversion intrinsics start from _mm512_undefined_*() and trip
// -Wmaybe-uninitialized inside the compiler's own header.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace strata {

namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace

std::string_view kv_dtype_name(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return "f32";
    case KvDtype::kF16:
      return "f16";
    case KvDtype::kBF16:
      return "bf16";
    case KvDtype::kInt8:
      return "int8";
    case KvDtype::kFp8E4M3:
      return "fp8_e4m3";
  }
  return "unknown";
}

Result<KvDtype> parse_kv_dtype(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "f32" || lower == "float32" || lower == "fp32") return KvDtype::kF32;
  if (lower == "f16" || lower == "float16" || lower == "fp16" || lower == "half") {
    return KvDtype::kF16;
  }
  if (lower == "bf16" || lower == "bfloat16") return KvDtype::kBF16;
  if (lower == "int8") return KvDtype::kInt8;
  if (lower == "fp8_e4m3" || lower == "fp8") return KvDtype::kFp8E4M3;
  std::string message = "unknown KV dtype '";
  message.append(name).append("' (expected f32, f16, bf16, int8, fp8_e4m3 or fp8)");
  return make_error(ErrorCode::kInvalidArgument, message);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in binary32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return bits_float(float_bits(magnitude) | sign);
  }
  if (exponent == 31) {
    return bits_float(sign | 0x7f800000u | (mantissa << 13));
  }
  return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t f32_to_f16(float value) {
  // Round to nearest even (after F. Giesen's float_to_half_fast3_rtne).
  constexpr uint32_t kF32Infinity = 255u << 23;
  constexpr uint32_t kF16Overflow = (127u + 16u) << 23;  // 65536.0f: rounds to infinity
  constexpr uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t u = float_bits(value);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint32_t out;
  if (u >= kF16Overflow) {
    out = u > kF32Infinity ? 0x7e00u : 0x7c00u;
  } else if (u < (113u << 23)) {
    // The result is an F16 subnormal or zero: let the FPU round by adding a magic
    // number whose exponent puts the F16 subnormal unit at the last mantissa bit.
    const float rounded = bits_float(u) + bits_float(kDenormMagic);
    out = float_bits(rounded) - kDenormMagic;
  } else {
    const uint32_t mantissa_odd = (u >> 13) & 1u;
    u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu;
    u += mantissa_odd;
    out = u >> 13;
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

void f16_to_f32_row(const uint16_t* src, float* dst, size_t n) {
  size_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
  }
#elif defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

void f32_to_f16_row(const float* src, uint16_t* dst, size_t n) {
  size_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
  }
#elif defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
#endif
  for (; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

void bf16_to_f32_row(const uint16_t* src, float* dst, size_t n) {
  // Plain integer code: the compiler vectorises it.
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &u, sizeof u);
  }
}

void f32_to_bf16_row(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

void kv_to_f32_row(KvDtype dtype, const void* src, float* dst, size_t n) {
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case KvDtype::kF16:
      f16_to_f32_row(static_cast<const uint16_t*>(src), dst, n);
      return;
    case KvDtype::kBF16:
      bf16_to_f32_row(static_cast<const uint16_t*>(src), dst, n);
      return;
    case KvDtype::kInt8:
    case KvDtype::kFp8E4M3:
      break;
  }
  STRATA_CHECK_MSG(false, "kv_to_f32_row on a scaled KV dtype (use kv_quant.h)");
}

void f32_to_kv_row(KvDtype dtype, const float* src, void* dst, size_t n) {
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(dst, src, n * sizeof(float));
      return;
    case KvDtype::kF16:
      f32_to_f16_row(src, static_cast<uint16_t*>(dst), n);
      return;
    case KvDtype::kBF16:
      f32_to_bf16_row(src, static_cast<uint16_t*>(dst), n);
      return;
    case KvDtype::kInt8:
    case KvDtype::kFp8E4M3:
      break;
  }
  STRATA_CHECK_MSG(false, "f32_to_kv_row on a scaled KV dtype (use kv_quant.h)");
}

}  // namespace strata
