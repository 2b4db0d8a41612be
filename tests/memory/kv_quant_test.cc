#include "memory/kv_quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "memory/kv_dtype.h"
#include "memory/kv_pool.h"

namespace strata {
namespace {

// ---- references, written independently of kv_quant.cc ----

// The E4M3FN code nearest to x by exhaustive search over the finite codes (ties to the
// even code), saturating.
uint8_t fp8_reference(float x) {
  const double a = std::fabs(static_cast<double>(x));
  uint8_t best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7e; ++c) {
    const int e = c >> 3, m = c & 7;
    const double v = e == 0 ? m * std::ldexp(1.0, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
    const double err = std::fabs(v - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}

int8_t int8_reference(float x, float scale) {
  if (scale == 0.0f || std::isnan(x)) return 0;
  const float r = x / scale;
  float q = std::floor(r);
  const float frac = r - q;
  if (frac > 0.5f || (frac == 0.5f && std::fmod(q, 2.0f) != 0.0f)) q += 1.0f;
  return static_cast<int8_t>(std::clamp(q, -127.0f, 127.0f));
}

struct Quantized {
  std::vector<uint8_t> codes;
  float scale;
};

// The smallest BF16 value >= x >= 0, by stepping through BF16 values from x's truncation.
float bf16_at_least(float x) {
  float t = bf16_to_f32(static_cast<uint16_t>(std::bit_cast<uint32_t>(x) >> 16));
  while (t < x) t = bf16_to_f32(static_cast<uint16_t>((std::bit_cast<uint32_t>(t) >> 16) + 1));
  return t;
}

Quantized reference_quantize(KvDtype dtype, const std::vector<float>& x) {
  float amax = 0.0f;
  for (float v : x) {
    if (std::isfinite(v)) amax = std::max(amax, std::fabs(v));
  }
  Quantized q;
  q.scale = bf16_at_least(amax / (dtype == KvDtype::kInt8 ? 127.0f : 448.0f));
  for (float v : x) {
    if (dtype == KvDtype::kInt8) {
      q.codes.push_back(static_cast<uint8_t>(int8_reference(v, q.scale)));
    } else {
      q.codes.push_back(std::isnan(v) || q.scale == 0.0f ? 0 : fp8_reference(v / q.scale));
    }
  }
  return q;
}

constexpr KvDtype kScaled[] = {KvDtype::kInt8, KvDtype::kFp8E4M3};

TEST(Fp8E4M3Test, EveryCodeDecodesAndEncodesBack) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), 0x1p-9f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), 0x1p-6f);
  EXPECT_EQ(fp8_e4m3_to_f32(0xb8), -1.0f);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xff)));
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    const float v = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
    EXPECT_EQ(f32_to_fp8_e4m3(v), c) << c;
  }
}

TEST(Fp8E4M3Test, RoundsToNearestEvenAndSaturates) {
  // Every midpoint between neighbouring codes, and points just either side of it.
  for (int c = 0; c < 0x7e; ++c) {
    const float lo = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
    const float hi = fp8_e4m3_to_f32(static_cast<uint8_t>(c + 1));
    const float mid = (lo + hi) / 2;
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), -mid}) {
      ASSERT_EQ(f32_to_fp8_e4m3(x), fp8_reference(x)) << x;
    }
  }
  EXPECT_EQ(f32_to_fp8_e4m3(464.0f), 0x7e);  // the midpoint to 480 (NaN's place) saturates
  EXPECT_EQ(f32_to_fp8_e4m3(1e6f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(f32_to_fp8_e4m3(0x1p-10f), 0x00);      // ties to even: 0
  EXPECT_EQ(f32_to_fp8_e4m3(3 * 0x1p-10f), 0x02);  // ties to even: 2
  EXPECT_EQ(f32_to_fp8_e4m3(1e-30f), 0x00);
  EXPECT_EQ(f32_to_fp8_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_fp8_e4m3(std::nanf("")) & 0x7f, 0x7f);
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> exponent(-12.0f, 9.5f);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::exp2(exponent(gen)) * ((gen() & 1) != 0 ? -1.0f : 1.0f);
    ASSERT_EQ(f32_to_fp8_e4m3(x), fp8_reference(x)) << x;
  }
}

TEST(KvQuantTest, RowsMatchTheReferenceOnRandomRows) {
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (KvDtype dtype : kScaled) {
    for (size_t n : {size_t{1}, size_t{7}, size_t{64}, size_t{128}}) {
      for (int trial = 0; trial < 50; ++trial) {
        std::vector<float> x(n);
        for (float& v : x) v = normal(gen);
        const Quantized want = reference_quantize(dtype, x);
        std::vector<uint8_t> codes(n * 3, 0xaa);
        const float scale = quantize_kv_row(dtype, x.data(), n, codes.data(), 3);
        ASSERT_EQ(scale, want.scale);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(codes[i * 3], want.codes[i]) << kv_dtype_name(dtype) << " " << x[i];
          ASSERT_EQ(codes[i * 3 + 1], 0xaa);  // the stride is kept
        }
        std::vector<float> back(n);
        dequantize_kv_row(dtype, codes.data(), scale, back.data(), n, 3);
        const float amax = scale * (dtype == KvDtype::kInt8 ? 127.0f : 448.0f);
        for (size_t i = 0; i < n; ++i) {
          // int8: half a step of amax / 127; fp8: 2^-4 relative (3 mantissa bits), or half
          // the smallest subnormal step.
          const float bound = dtype == KvDtype::kInt8
                                  ? amax / 254.0f * 1.005f
                                  : std::max(std::fabs(x[i]) / 16.0f, scale * 0x1p-10f) * 1.0001f;
          ASSERT_LE(std::fabs(back[i] - x[i]), bound) << kv_dtype_name(dtype) << " " << x[i];
        }
      }
    }
  }
}

TEST(KvQuantTest, EdgesZerosOutliersAndNonFinite) {
  for (KvDtype dtype : kScaled) {
    const float max_code = dtype == KvDtype::kInt8 ? 127.0f : 448.0f;
    std::vector<uint8_t> codes(8);
    std::vector<float> back(8);
    // All zeros: scale 0, decoded zeros (never NaN).
    std::vector<float> zeros(8, 0.0f);
    EXPECT_EQ(quantize_kv_row(dtype, zeros.data(), 8, codes.data()), 0.0f);
    dequantize_kv_row(dtype, codes.data(), 0.0f, back.data(), 8);
    for (float v : back) EXPECT_EQ(v, 0.0f);
    // An outlier 1000x the rest: it is kept to the format's precision, the rest lose
    // what a shared scale costs (all within amax / 254 for int8).
    std::vector<float> outlier = {0.5f, -0.25f, 1000.0f, 0.75f, -1.0f, 0.0f, 0.125f, -0.5f};
    const float scale = quantize_kv_row(dtype, outlier.data(), 8, codes.data());
    EXPECT_EQ(scale, bf16_at_least(1000.0f / max_code));
    EXPECT_EQ(scale, bf16_to_f32(f32_to_bf16(scale)));  // a BF16 value
    EXPECT_LE(1000.0f / max_code, scale);
    EXPECT_LE(scale, 1000.0f / max_code * (1.0f + 0x1p-7f));
    EXPECT_EQ(codes, reference_quantize(dtype, outlier).codes);
    dequantize_kv_row(dtype, codes.data(), scale, back.data(), 8);
    // Kept to the format's precision (the scale's rounding up moves amax off the top code).
    EXPECT_NEAR(back[2], 1000.0f, dtype == KvDtype::kInt8 ? scale / 2 : 1000.0f / 16);
    for (size_t i = 0; i < 8; ++i) EXPECT_LE(std::fabs(back[i] - outlier[i]), 1000.0f / 250.0f);
    // NaN stores 0; +-inf saturate to the row's finite amax.
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<float> odd = {std::nanf(""), inf, -inf, 2.0f, -1.0f, 0.0f, 0.5f, 1.0f};
    const float s2 = quantize_kv_row(dtype, odd.data(), 8, codes.data());
    EXPECT_EQ(s2, bf16_at_least(2.0f / max_code));
    dequantize_kv_row(dtype, codes.data(), s2, back.data(), 8);
    EXPECT_EQ(back[0], 0.0f);
    // +-inf take the largest code: max_code * scale, a hair above amax.
    EXPECT_EQ(back[1], max_code * s2);
    EXPECT_EQ(back[2], -max_code * s2);
    EXPECT_NEAR(back[3], 2.0f, dtype == KvDtype::kInt8 ? s2 / 2 : 2.0f / 16);
    // Only non-finite values: scale 0, all decode to 0.
    std::vector<float> none = {inf, -inf, std::nanf(""), inf, inf, inf, inf, inf};
    EXPECT_EQ(quantize_kv_row(dtype, none.data(), 8, codes.data()), 0.0f);
  }
}

TEST(KvQuantTest, PoolPagesHoldTheReferenceCodesAndScales) {
  // 2 layers, 3 KV heads, head_dim 16, page size 16, with heads of every kind: random,
  // all zero, and one with an outlier; the page only partly filled.
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (KvDtype dtype : kScaled) {
    KvPool pool(2, 3, 16, 4, 16, dtype);
    const int32_t filled = 11;
    std::vector<std::vector<float>> ks, vs;
    for (int32_t layer = 0; layer < 2; ++layer) {
      for (int32_t slot = 0; slot < filled; ++slot) {
        std::vector<float> k(48), v(48);
        for (float& x : k) x = normal(gen);
        for (float& x : v) x = normal(gen);
        std::fill(k.begin() + 16, k.begin() + 32, 0.0f);  // head 1 all zero
        std::fill(v.begin() + 16, v.begin() + 32, 0.0f);
        k[40] *= 1000.0f;  // head 2 with an outlier
        v[47] = 1000.0f;
        pool.write_token(layer, make_page_id(2), slot, k.data(), v.data());
        ks.push_back(k);
        vs.push_back(v);
      }
    }
    size_t i = 0;
    for (int32_t layer = 0; layer < 2; ++layer) {
      const auto* kb = reinterpret_cast<const uint8_t*>(pool.k_block(layer, make_page_id(2)));
      const auto* vb = reinterpret_cast<const uint8_t*>(pool.v_block(layer, make_page_id(2)));
      for (int32_t slot = 0; slot < filled; ++slot, ++i) {
        std::vector<float> k(48), v(48);
        pool.read_token(layer, make_page_id(2), slot, k.data(), v.data());
        for (int32_t h = 0; h < 3; ++h) {
          const std::vector<float> kh(ks[i].begin() + h * 16, ks[i].begin() + h * 16 + 16);
          const std::vector<float> vh(vs[i].begin() + h * 16, vs[i].begin() + h * 16 + 16);
          const Quantized kq = reference_quantize(dtype, kh), vq = reference_quantize(dtype, vh);
          uint16_t k_scale, v_scale;
          std::memcpy(&k_scale, kb + pool.scale_offset_bytes(h, slot), 2);
          std::memcpy(&v_scale, vb + pool.scale_offset_bytes(h, slot), 2);
          ASSERT_EQ(bf16_to_f32(k_scale), kq.scale);
          ASSERT_EQ(bf16_to_f32(v_scale), vq.scale);
          for (int32_t d = 0; d < 16; ++d) {
            ASSERT_EQ(kb[pool.k_index(h, slot, d)], kq.codes[static_cast<size_t>(d)]);
            ASSERT_EQ(vb[pool.v_index(h, slot, d)], vq.codes[static_cast<size_t>(d)]);
            std::vector<float> one(1);
            dequantize_kv_row(dtype, &kq.codes[static_cast<size_t>(d)], kq.scale, one.data(), 1);
            ASSERT_EQ(k[static_cast<size_t>(h * 16 + d)], one[0]);
            dequantize_kv_row(dtype, &vq.codes[static_cast<size_t>(d)], vq.scale, one.data(), 1);
            ASSERT_EQ(v[static_cast<size_t>(h * 16 + d)], one[0]);
          }
          if (h == 1) {
            for (int32_t d = 0; d < 16; ++d) ASSERT_EQ(k[static_cast<size_t>(16 + d)], 0.0f);
          }
        }
      }
      // The slots not written read back as zeros.
      std::vector<float> k(48), v(48);
      pool.read_token(layer, make_page_id(2), filled, k.data(), v.data());
      for (size_t j = 0; j < 48; ++j) ASSERT_EQ(k[j] + v[j], 0.0f);
    }
  }
}

}  // namespace
}  // namespace strata
