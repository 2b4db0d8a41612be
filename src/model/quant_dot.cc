#include "model/quant_dot.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/check.h"
#include "memory/kv_dtype.h"

// GCC 12's AVX intrinsics start from _mm256_undefined_*() and trip these inside its header.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace strata {

namespace {

// Activation blocks (our own layout, never stored):
//   for Q8_0 / Q4_0 weights, 40 bytes per 32 values: f32 d; f32 d * sum(q); int8 q[32];
//   for the K-quants, 292 bytes per 256: f32 d; int16 sums of each 16 q; int8 q[256].
constexpr int64_t kActQ8_0Bytes = 40;
constexpr int64_t kActQ8KBytes = 292;

bool is_k_quant(GgmlType type) {
  return type == GgmlType::kQ4_K || type == GgmlType::kQ5_K || type == GgmlType::kQ6_K;
}

void quantize_act_q8_0(const float* x, std::byte* out, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b, x += 32, out += kActQ8_0Bytes) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 127.0f / amax : 0.0f;
    auto* q = reinterpret_cast<int8_t*>(out + 8);
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      q[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
      sum += q[j];
    }
    const float ds = d * static_cast<float>(sum);
    std::memcpy(out, &d, 4);
    std::memcpy(out + 4, &ds, 4);
  }
}

void quantize_act_q8_k(const float* x, std::byte* out, int64_t n) {
  for (int64_t b = 0; b < n / 256; ++b, x += 256, out += kActQ8KBytes) {
    float amax = 0;
    for (int j = 0; j < 256; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0 ? 127.0f / amax : 0.0f;
    auto* q = reinterpret_cast<int8_t*>(out + 36);
    for (int j = 0; j < 256; ++j) q[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
    int16_t sums[16];
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += q[16 * g + l];
      sums[g] = static_cast<int16_t>(s);
    }
    std::memcpy(out, &d, 4);
    std::memcpy(out + 4, sums, 32);
  }
}

// ---- scalar kernels: the formats' formulas over integers, one F32 step per block ----

uint16_t u16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

float f32_at(const std::byte* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

float scalar_dot_q8_0(const std::byte* w, const std::byte* a, int64_t n) {
  float total = 0;
  for (int64_t b = 0; b < n / 32; ++b) {
    const auto* q = reinterpret_cast<const int8_t*>(w + b * 34 + 2);
    const auto* x = reinterpret_cast<const int8_t*>(a + b * kActQ8_0Bytes + 8);
    int sum = 0;
    for (int j = 0; j < 32; ++j) sum += q[j] * x[j];
    total += f16_to_f32(u16(w + b * 34)) * f32_at(a + b * kActQ8_0Bytes) * static_cast<float>(sum);
  }
  return total;
}

float scalar_dot_q4_0(const std::byte* w, const std::byte* a, int64_t n) {
  float total = 0;
  for (int64_t b = 0; b < n / 32; ++b) {
    const auto* qs = reinterpret_cast<const uint8_t*>(w + b * 18 + 2);
    const auto* x = reinterpret_cast<const int8_t*>(a + b * kActQ8_0Bytes + 8);
    int sum = 0;
    for (int j = 0; j < 16; ++j) sum += ((qs[j] & 0xF) - 8) * x[j] + ((qs[j] >> 4) - 8) * x[j + 16];
    total += f16_to_f32(u16(w + b * 18)) * f32_at(a + b * kActQ8_0Bytes) * static_cast<float>(sum);
  }
  return total;
}

template <bool kFiveBits>
float scalar_dot_q45_k(const std::byte* w, const std::byte* a, int64_t n) {
  constexpr int64_t kBlockBytes = kFiveBits ? 176 : 144;
  float total = 0;
  for (int64_t b = 0; b < n / 256; ++b) {
    const std::byte* wb = w + b * kBlockBytes;
    const std::byte* ab = a + b * kActQ8KBytes;
    int16_t sums[16];
    std::memcpy(sums, ab + 4, 32);
    const auto* x = reinterpret_cast<const int8_t*>(ab + 36);
    const auto* packed = reinterpret_cast<const uint8_t*>(wb + 4);
    const auto* qh = reinterpret_cast<const uint8_t*>(wb + 16);
    const auto* qs = reinterpret_cast<const uint8_t*>(wb + (kFiveBits ? 48 : 16));
    int scaled = 0, mins = 0;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      k_scale_min(j, packed, sc, m);
      mins += m * (sums[2 * j] + sums[2 * j + 1]);
      int dot = 0;
      for (int l = 0; l < 32; ++l) {
        const int byte = qs[32 * (j / 2) + l];
        int q = j % 2 == 0 ? (byte & 0xF) : (byte >> 4);
        if (kFiveBits) q |= ((qh[l] >> j) & 1) << 4;
        dot += q * x[32 * j + l];
      }
      scaled += sc * dot;
    }
    const float ad = f32_at(ab);
    total += f16_to_f32(u16(wb)) * ad * static_cast<float>(scaled) -
             f16_to_f32(u16(wb + 2)) * ad * static_cast<float>(mins);
  }
  return total;
}

float scalar_dot_q6_k(const std::byte* w, const std::byte* a, int64_t n) {
  float total = 0;
  for (int64_t b = 0; b < n / 256; ++b) {
    const std::byte* wb = w + b * 210;
    const std::byte* ab = a + b * kActQ8KBytes;
    const auto* ql = reinterpret_cast<const uint8_t*>(wb);
    const auto* qh = reinterpret_cast<const uint8_t*>(wb + 128);
    const auto* sc = reinterpret_cast<const int8_t*>(wb + 192);
    const auto* x = reinterpret_cast<const int8_t*>(ab + 36);
    int sum = 0;
    for (int i = 0; i < 256; ++i) {
      const int h = i / 128, quarter = (i % 128) / 32, l = i % 32;
      const int byte = ql[64 * h + l + (quarter % 2 == 1 ? 32 : 0)];
      const int low = quarter < 2 ? (byte & 0xF) : (byte >> 4);
      const int high = (qh[32 * h + l] >> (2 * quarter)) & 3;
      sum += sc[i / 16] * (low + 16 * high - 32) * x[i];
    }
    total += f16_to_f32(u16(wb + 208)) * f32_at(ab) * static_cast<float>(sum);
  }
  return total;
}

}  // namespace

// ---- AVX2 ----
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
namespace {

inline __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
inline __m256i scales2(int a, int b) {
  return _mm256_setr_m128i(_mm_set1_epi16(static_cast<int16_t>(a)),
                           _mm_set1_epi16(static_cast<int16_t>(b)));
}
inline __m256i dot_u8s8_scaled(__m256i u, __m256i s, __m256i scales) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scales);
}

#include "model/quant_dot_simd.inc"

}  // namespace
}  // namespace avx2
#pragma GCC pop_options

// ---- AVX-512 VNNI (256-bit vectors) ----
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
namespace vnni {
namespace {

inline __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}
// Scaled sums as AVX2 forms them (vpmaddwd applies the int16 scales for free; vpdpbusd
// would need a vpmulld, two micro-ops of 10 cycles' latency).
inline __m256i scales2(int a, int b) {
  return _mm256_setr_m128i(_mm_set1_epi16(static_cast<int16_t>(a)),
                           _mm_set1_epi16(static_cast<int16_t>(b)));
}
inline __m256i dot_u8s8_scaled(__m256i u, __m256i s, __m256i scales) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scales);
}

#include "model/quant_dot_simd.inc"

}  // namespace
}  // namespace vnni
#pragma GCC pop_options

std::string_view quant_isa_name(QuantIsa isa) {
  switch (isa) {
    case QuantIsa::kScalar:
      return "scalar";
    case QuantIsa::kAvx2:
      return "avx2";
    case QuantIsa::kAvx512Vnni:
      return "avx512-vnni";
  }
  return "?";
}

bool quant_isa_supported(QuantIsa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case QuantIsa::kScalar:
      return true;
    case QuantIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case QuantIsa::kAvx512Vnni:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  }
  return false;
}

QuantIsa quant_isa_best() {
  static const QuantIsa best = quant_isa_supported(QuantIsa::kAvx512Vnni) ? QuantIsa::kAvx512Vnni
                               : quant_isa_supported(QuantIsa::kAvx2)     ? QuantIsa::kAvx2
                                                                          : QuantIsa::kScalar;
  return best;
}

bool has_quant_dot(GgmlType type) {
  return type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0 || is_k_quant(type);
}

int64_t quant_activation_bytes(GgmlType type, int64_t n) {
  return is_k_quant(type) ? n / 256 * kActQ8KBytes : n / 32 * kActQ8_0Bytes;
}

QuantKernels quant_kernels(GgmlType type, QuantIsa isa) {
  STRATA_CHECK(has_quant_dot(type) && quant_isa_supported(isa));
  QuantKernels k{};
  k.quantize = is_k_quant(type) ? quantize_act_q8_k : quantize_act_q8_0;
  switch (type) {
    case GgmlType::kQ8_0:
      k.dot = isa == QuantIsa::kAvx512Vnni ? vnni::dot_q8_0
              : isa == QuantIsa::kAvx2     ? avx2::dot_q8_0
                                           : scalar_dot_q8_0;
      break;
    case GgmlType::kQ4_0:
      k.dot = isa == QuantIsa::kAvx512Vnni ? vnni::dot_q4_0
              : isa == QuantIsa::kAvx2     ? avx2::dot_q4_0
                                           : scalar_dot_q4_0;
      break;
    case GgmlType::kQ4_K:
      k.dot = isa == QuantIsa::kAvx512Vnni ? vnni::dot_q4_k
              : isa == QuantIsa::kAvx2     ? avx2::dot_q4_k
                                           : scalar_dot_q45_k<false>;
      break;
    case GgmlType::kQ5_K:
      k.dot = isa == QuantIsa::kAvx512Vnni ? vnni::dot_q5_k
              : isa == QuantIsa::kAvx2     ? avx2::dot_q5_k
                                           : scalar_dot_q45_k<true>;
      break;
    case GgmlType::kQ6_K:
      k.dot = isa == QuantIsa::kAvx512Vnni ? vnni::dot_q6_k
              : isa == QuantIsa::kAvx2     ? avx2::dot_q6_k
                                           : scalar_dot_q6_k;
      break;
    default:
      break;
  }
  return k;
}

}  // namespace strata
