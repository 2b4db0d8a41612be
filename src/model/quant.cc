#include "model/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "common/check.h"
#include "memory/kv_dtype.h"

namespace strata {

namespace {

uint16_t load_u16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

void store_u16(std::byte* p, uint16_t v) {
  std::memcpy(p, &v, sizeof v);
}

const uint8_t* u8(const std::byte* p) {
  return reinterpret_cast<const uint8_t*>(p);
}

uint8_t* u8(std::byte* p) {
  return reinterpret_cast<uint8_t*>(p);
}

int nearest(float x) {
  return static_cast<int>(std::lrintf(x));
}

// ---- dequantizers, one block ----

void dequant_q8_0(const std::byte* b, float* y) {
  const float d = f16_to_f32(load_u16(b));
  const auto* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q[j]) * d;
}

void dequant_q4_0(const std::byte* b, float* y) {
  const float d = f16_to_f32(load_u16(b));
  const uint8_t* qs = u8(b + 2);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0xF) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void dequant_q4_k(const std::byte* b, float* y) {
  const float d = f16_to_f32(load_u16(b));
  const float dmin = f16_to_f32(load_u16(b + 2));
  const uint8_t* scales = u8(b + 4);
  const uint8_t* q = u8(b + 16);
  for (int i = 0; i < 4; ++i, q += 32, y += 64) {
    uint8_t sc, m;
    k_scale_min(2 * i, scales, sc, m);
    const float d1 = d * sc, m1 = dmin * m;
    k_scale_min(2 * i + 1, scales, sc, m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) y[l] = d1 * static_cast<float>(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) y[l + 32] = d2 * static_cast<float>(q[l] >> 4) - m2;
  }
}

void dequant_q5_k(const std::byte* b, float* y) {
  const float d = f16_to_f32(load_u16(b));
  const float dmin = f16_to_f32(load_u16(b + 2));
  const uint8_t* scales = u8(b + 4);
  const uint8_t* qh = u8(b + 16);
  const uint8_t* ql = u8(b + 48);
  for (int i = 0; i < 4; ++i, ql += 32, y += 64) {
    uint8_t sc, m;
    k_scale_min(2 * i, scales, sc, m);
    const float d1 = d * sc, m1 = dmin * m;
    k_scale_min(2 * i + 1, scales, sc, m);
    const float d2 = d * sc, m2 = dmin * m;
    const int lo_bit = 2 * i, hi_bit = 2 * i + 1;
    for (int l = 0; l < 32; ++l) {
      y[l] = d1 * static_cast<float>((ql[l] & 0xF) | (((qh[l] >> lo_bit) & 1) << 4)) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      y[l + 32] = d2 * static_cast<float>((ql[l] >> 4) | (((qh[l] >> hi_bit) & 1) << 4)) - m2;
    }
  }
}

void dequant_q6_k(const std::byte* b, float* y) {
  const uint8_t* ql = u8(b);
  const uint8_t* qh = u8(b + 128);
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = f16_to_f32(load_u16(b + 208));
  for (int h = 0; h < 2; ++h, ql += 64, qh += 32, sc += 8, y += 128) {
    for (int l = 0; l < 32; ++l) {
      const int g = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * sc[g] * static_cast<float>(q1);
      y[l + 32] = d * sc[g + 2] * static_cast<float>(q2);
      y[l + 64] = d * sc[g + 4] * static_cast<float>(q3);
      y[l + 96] = d * sc[g + 6] * static_cast<float>(q4);
    }
  }
}

// ---- quantizers, one block ----

void quant_q8_0(const float* x, std::byte* b) {
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  store_u16(b, f32_to_f16(d));
  auto* q = reinterpret_cast<int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j)
    q[j] = static_cast<int8_t>(std::clamp(nearest(x[j] * id), -127, 127));
}

void quant_q4_0(const float* x, std::byte* b) {
  // The value of largest magnitude, with its sign, maps to level 0 (-8 d).
  float amax = 0, extreme = 0;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      extreme = x[j];
    }
  }
  const float d = extreme / -8.0f;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  store_u16(b, f32_to_f16(d));
  uint8_t* qs = u8(b + 2);
  for (int j = 0; j < 16; ++j) {
    const int lo = std::clamp(nearest(x[j] * id) + 8, 0, 15);
    const int hi = std::clamp(nearest(x[j + 16] * id) + 8, 0, 15);
    qs[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

void quant_q4_k(const float* x, std::byte* b) {
  // Each sub-block: x ~ s * q - m with m = -min(x, 0), s = (max - min) / 15.
  float s[8], m[8];
  float max_s = 0, max_m = 0;
  for (int j = 0; j < 8; ++j) {
    const float* v = x + 32 * j;
    float lo = v[0], hi = v[0];
    for (int l = 1; l < 32; ++l) {
      lo = std::min(lo, v[l]);
      hi = std::max(hi, v[l]);
    }
    lo = std::min(lo, 0.0f);
    s[j] = (hi - lo) / 15.0f;
    m[j] = -lo;
    max_s = std::max(max_s, s[j]);
    max_m = std::max(max_m, m[j]);
  }
  const uint16_t d_bits = f32_to_f16(max_s / 63.0f);
  const uint16_t dmin_bits = f32_to_f16(max_m / 63.0f);
  const float d = f16_to_f32(d_bits), dmin = f16_to_f32(dmin_bits);
  store_u16(b, d_bits);
  store_u16(b + 2, dmin_bits);
  uint8_t sc[8], mn[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(d > 0 ? std::clamp(nearest(s[j] / d), 0, 63) : 0);
    mn[j] = static_cast<uint8_t>(dmin > 0 ? std::clamp(nearest(m[j] / dmin), 0, 63) : 0);
  }
  uint8_t* scales = u8(b + 4);
  std::memset(scales, 0, 12);
  for (int j = 0; j < 4; ++j) {
    scales[j] = sc[j];
    scales[j + 4] = mn[j];
  }
  for (int j = 4; j < 8; ++j) {
    scales[j + 4] = static_cast<uint8_t>((sc[j] & 0xF) | ((mn[j] & 0xF) << 4));
    scales[j - 4] = static_cast<uint8_t>(scales[j - 4] | ((sc[j] >> 4) << 6));
    scales[j] = static_cast<uint8_t>(scales[j] | ((mn[j] >> 4) << 6));
  }
  uint8_t levels[256];
  for (int j = 0; j < 8; ++j) {
    const float dj = d * sc[j], mj = dmin * mn[j];
    for (int l = 0; l < 32; ++l) {
      levels[32 * j + l] =
          static_cast<uint8_t>(dj > 0 ? std::clamp(nearest((x[32 * j + l] + mj) / dj), 0, 15) : 0);
    }
  }
  uint8_t* qs = u8(b + 16);
  for (int i = 0; i < 4; ++i) {
    for (int l = 0; l < 32; ++l) {
      qs[32 * i + l] = static_cast<uint8_t>(levels[64 * i + l] | (levels[64 * i + 32 + l] << 4));
    }
  }
}

void quant_q6_k(const float* x, std::byte* b) {
  // Each group of 16: x ~ s * q, q in [-32, 31], s = amax / 31 (signed by the extreme).
  float s[16];
  float max_abs_s = 0;
  for (int g = 0; g < 16; ++g) {
    float amax = 0;
    for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(x[16 * g + l]));
    s[g] = amax / 31.0f;
    max_abs_s = std::max(max_abs_s, s[g]);
  }
  const uint16_t d_bits = f32_to_f16(max_abs_s / 127.0f);
  const float d = f16_to_f32(d_bits);
  int8_t sc[16];
  for (int g = 0; g < 16; ++g) {
    sc[g] = static_cast<int8_t>(d > 0 ? std::clamp(nearest(s[g] / d), -128, 127) : 0);
  }
  uint8_t levels[256];
  for (int i = 0; i < 256; ++i) {
    const float dg = d * sc[i / 16];
    levels[i] = static_cast<uint8_t>((dg != 0 ? std::clamp(nearest(x[i] / dg), -32, 31) : 0) + 32);
  }
  uint8_t* ql = u8(b);
  uint8_t* qh = u8(b + 128);
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t* v = levels + 128 * h + l;
      ql[64 * h + l] = static_cast<uint8_t>((v[0] & 0xF) | ((v[64] & 0xF) << 4));
      ql[64 * h + l + 32] = static_cast<uint8_t>((v[32] & 0xF) | ((v[96] & 0xF) << 4));
      qh[32 * h + l] = static_cast<uint8_t>((v[0] >> 4) | ((v[32] >> 4) << 2) |
                                            ((v[64] >> 4) << 4) | ((v[96] >> 4) << 6));
    }
  }
  std::memcpy(b + 192, sc, 16);
  store_u16(b + 208, d_bits);
}

}  // namespace

std::optional<GgmlTypeInfo> ggml_type_info(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::kF32:
      return GgmlTypeInfo{"F32", 1, 4, true};
    case GgmlType::kF16:
      return GgmlTypeInfo{"F16", 1, 2, true};
    case GgmlType::kBF16:
      return GgmlTypeInfo{"BF16", 1, 2, true};
    case GgmlType::kQ4_0:
      return GgmlTypeInfo{"Q4_0", 32, 18, true};
    case GgmlType::kQ4_1:
      return GgmlTypeInfo{"Q4_1", 32, 20, false};
    case GgmlType::kQ5_0:
      return GgmlTypeInfo{"Q5_0", 32, 22, false};
    case GgmlType::kQ5_1:
      return GgmlTypeInfo{"Q5_1", 32, 24, false};
    case GgmlType::kQ8_0:
      return GgmlTypeInfo{"Q8_0", 32, 34, true};
    case GgmlType::kQ8_1:
      return GgmlTypeInfo{"Q8_1", 32, 36, false};
    case GgmlType::kQ2_K:
      return GgmlTypeInfo{"Q2_K", 256, 84, false};
    case GgmlType::kQ3_K:
      return GgmlTypeInfo{"Q3_K", 256, 110, false};
    case GgmlType::kQ4_K:
      return GgmlTypeInfo{"Q4_K", 256, 144, true};
    case GgmlType::kQ5_K:
      return GgmlTypeInfo{"Q5_K", 256, 176, true};
    case GgmlType::kQ6_K:
      return GgmlTypeInfo{"Q6_K", 256, 210, true};
    case GgmlType::kQ8_K:
      return GgmlTypeInfo{"Q8_K", 256, 292, false};
    case GgmlType::kI8:
      return GgmlTypeInfo{"I8", 1, 1, false};
    case GgmlType::kI16:
      return GgmlTypeInfo{"I16", 1, 2, false};
    case GgmlType::kI32:
      return GgmlTypeInfo{"I32", 1, 4, false};
    case GgmlType::kI64:
      return GgmlTypeInfo{"I64", 1, 8, false};
    case GgmlType::kF64:
      return GgmlTypeInfo{"F64", 1, 8, false};
  }
  return std::nullopt;
}

std::string ggml_type_name(uint32_t type) {
  auto info = ggml_type_info(type);
  if (info) return std::string(info->name);
  return "type " + std::to_string(type);
}

std::optional<GgmlType> parse_ggml_type(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (GgmlType t : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                     GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    std::string n(ggml_type_info(static_cast<uint32_t>(t))->name);
    for (char& c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (n == lower) return t;
  }
  return std::nullopt;
}

int64_t ggml_row_bytes(GgmlType type, int64_t n) {
  const auto info = ggml_type_info(static_cast<uint32_t>(type));
  STRATA_CHECK(info && n % info->block_values == 0);
  return n / info->block_values * info->block_bytes;
}

void dequantize_row(GgmlType type, const std::byte* src, float* dst, int64_t n) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load_u16(src + 2 * i));
      return;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
      return;
    case GgmlType::kQ8_0:
      for (int64_t b = 0; b < n / 32; ++b) dequant_q8_0(src + 34 * b, dst + 32 * b);
      return;
    case GgmlType::kQ4_0:
      for (int64_t b = 0; b < n / 32; ++b) dequant_q4_0(src + 18 * b, dst + 32 * b);
      return;
    case GgmlType::kQ4_K:
      for (int64_t b = 0; b < n / 256; ++b) dequant_q4_k(src + 144 * b, dst + 256 * b);
      return;
    case GgmlType::kQ5_K:
      for (int64_t b = 0; b < n / 256; ++b) dequant_q5_k(src + 176 * b, dst + 256 * b);
      return;
    case GgmlType::kQ6_K:
      for (int64_t b = 0; b < n / 256; ++b) dequant_q6_k(src + 210 * b, dst + 256 * b);
      return;
    default:
      STRATA_CHECK(false && "dequantize_row: unsupported type");
  }
}

bool can_quantize(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
    case GgmlType::kF16:
    case GgmlType::kBF16:
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
    case GgmlType::kQ4_K:
    case GgmlType::kQ6_K:
      return true;
    default:
      return false;
  }
}

void quantize_row(GgmlType type, const float* src, std::byte* dst, int64_t n) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) store_u16(dst + 2 * i, f32_to_f16(src[i]));
      return;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) store_u16(dst + 2 * i, f32_to_bf16(src[i]));
      return;
    case GgmlType::kQ8_0:
      for (int64_t b = 0; b < n / 32; ++b) quant_q8_0(src + 32 * b, dst + 34 * b);
      return;
    case GgmlType::kQ4_0:
      for (int64_t b = 0; b < n / 32; ++b) quant_q4_0(src + 32 * b, dst + 18 * b);
      return;
    case GgmlType::kQ4_K:
      for (int64_t b = 0; b < n / 256; ++b) quant_q4_k(src + 256 * b, dst + 144 * b);
      return;
    case GgmlType::kQ6_K:
      for (int64_t b = 0; b < n / 256; ++b) quant_q6_k(src + 256 * b, dst + 210 * b);
      return;
    default:
      STRATA_CHECK(false && "quantize_row: unsupported type");
  }
}

}  // namespace strata
