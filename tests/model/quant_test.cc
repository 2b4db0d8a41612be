// Dequantization of ggml's block formats, exact against references written element by
// element from the formats' specification (model/quant.h), and the round-to-nearest
// quantizers within their step.
#include "model/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "memory/kv_dtype.h"

namespace strata {
namespace {

uint16_t u16_at(const std::vector<uint8_t>& b, size_t at) {
  return static_cast<uint16_t>(b[at] | (b[at + 1] << 8));
}

// The value of element i of one block, computed from its bit positions.
float reference_value(GgmlType type, const std::vector<uint8_t>& b, int i) {
  switch (type) {
    case GgmlType::kQ8_0: {
      const float d = f16_to_f32(u16_at(b, 0));
      return static_cast<float>(static_cast<int8_t>(b[2 + i])) * d;
    }
    case GgmlType::kQ4_0: {
      const float d = f16_to_f32(u16_at(b, 0));
      const int byte = b[2 + i % 16];
      const int q = i < 16 ? (byte & 15) : (byte >> 4);
      return static_cast<float>(q - 8) * d;
    }
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K: {
      const float d = f16_to_f32(u16_at(b, 0));
      const float dmin = f16_to_f32(u16_at(b, 2));
      const int j = i / 32;  // sub-block
      // 6-bit scale and min: sub-blocks 0-3 in the low 6 bits of bytes j and j + 4;
      // 4-7 in the nibbles of byte j + 4, their top 2 bits in the top of bytes j - 4, j.
      const uint8_t* s = b.data() + 4;
      int sc, m;
      if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
      } else {
        sc = (s[j + 4] & 15) + ((s[j - 4] >> 6) * 16);
        m = (s[j + 4] >> 4) + ((s[j] >> 6) * 16);
      }
      const bool k5 = type == GgmlType::kQ5_K;
      const size_t qs = k5 ? 48 : 16;
      const int chunk = i / 64, within = i % 64;
      const int byte = b[qs + 32 * chunk + within % 32];
      int q = within < 32 ? (byte & 15) : (byte >> 4);
      if (k5) {
        const int bit = 2 * chunk + (within < 32 ? 0 : 1);
        q += ((b[16 + within % 32] >> bit) & 1) * 16;
      }
      const float d1 = d * static_cast<float>(sc);
      const float m1 = dmin * static_cast<float>(m);
      return d1 * static_cast<float>(q) - m1;
    }
    case GgmlType::kQ6_K: {
      const float d = f16_to_f32(u16_at(b, 208));
      const int h = i / 128, w = i % 128, quarter = w / 32, l = w % 32;
      const int ql_byte = b[64 * h + l + (quarter % 2 == 1 ? 32 : 0)];
      const int low = quarter < 2 ? (ql_byte & 15) : (ql_byte >> 4);
      const int high = (b[128 + 32 * h + l] >> (2 * quarter)) & 3;
      const int q = low + 16 * high - 32;
      const auto sc = static_cast<int8_t>(b[192 + i / 16]);
      return d * static_cast<float>(sc) * static_cast<float>(q);
    }
    default:
      return 0;
  }
}

// A random block whose f16 scales are finite (extreme ones when `extreme`).
std::vector<uint8_t> random_block(GgmlType type, std::mt19937& rng, bool extreme) {
  const auto info = *ggml_type_info(static_cast<uint32_t>(type));
  std::vector<uint8_t> b(static_cast<size_t>(info.block_bytes));
  for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(-2.0f, 2.0f);
  auto f16 = [&] {
    return extreme ? f32_to_f16(rng() % 2 ? 65504.0f : 6.0e-8f) : f32_to_f16(scale(rng));
  };
  auto set16 = [&](size_t at, uint16_t v) {
    b[at] = static_cast<uint8_t>(v);
    b[at + 1] = static_cast<uint8_t>(v >> 8);
  };
  switch (type) {
    case GgmlType::kQ8_0:
    case GgmlType::kQ4_0:
      set16(0, f16());
      break;
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
      set16(0, f16());
      set16(2, f16());
      break;
    case GgmlType::kQ6_K:
      set16(208, f16());
      break;
    default:
      break;
  }
  return b;
}

class DequantTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(DequantTest, ExactAgainstTheSpecification) {
  const GgmlType type = GetParam();
  const auto info = *ggml_type_info(static_cast<uint32_t>(type));
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const bool extreme = trial % 10 == 9;
    const int blocks = 1 + trial % 3;
    std::vector<uint8_t> row;
    for (int k = 0; k < blocks; ++k) {
      auto b = random_block(type, rng, extreme);
      if (trial == 0) std::fill(b.begin(), b.end(), 0);  // an all-zero block
      row.insert(row.end(), b.begin(), b.end());
    }
    const int64_t n = blocks * info.block_values;
    std::vector<float> out(static_cast<size_t>(n));
    dequantize_row(type, reinterpret_cast<const std::byte*>(row.data()), out.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = i / info.block_values;
      const std::vector<uint8_t> block(row.begin() + k * info.block_bytes,
                                       row.begin() + (k + 1) * info.block_bytes);
      const float want = reference_value(type, block, static_cast<int>(i % info.block_values));
      ASSERT_EQ(std::memcmp(&want, &out[static_cast<size_t>(i)], 4), 0)
          << info.name << " trial " << trial << " element " << i << ": " << want << " vs "
          << out[static_cast<size_t>(i)];
    }
    if (trial == 0) {
      for (float v : out) ASSERT_EQ(v, 0.0f);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, DequantTest,
                         ::testing::Values(GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_K,
                                           GgmlType::kQ5_K, GgmlType::kQ6_K),
                         [](const auto& info) {
                           return std::string(
                               ggml_type_info(static_cast<uint32_t>(info.param))->name);
                         });

TEST(DequantTest, PlainTypes) {
  const std::vector<float> values = {0.0f, -1.5f, 3.25f, 65504.0f, -6.0e-8f, 1e-3f};
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
    std::vector<std::byte> bytes(static_cast<size_t>(ggml_row_bytes(type, 6)));
    quantize_row(type, values.data(), bytes.data(), 6);
    std::vector<float> out(6);
    dequantize_row(type, bytes.data(), out.data(), 6);
    for (size_t i = 0; i < 6; ++i) {
      const float want = type == GgmlType::kF32   ? values[i]
                         : type == GgmlType::kF16 ? f16_to_f32(f32_to_f16(values[i]))
                                                  : bf16_to_f32(f32_to_bf16(values[i]));
      EXPECT_EQ(out[i], want) << ggml_type_name(static_cast<uint32_t>(type)) << " " << i;
    }
  }
}

// Round to nearest: each value within half a step (plus the scales' own rounding) of
// its original; zero rows stay zero.
TEST(QuantizeTest, RoundTripWithinTheStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    const int64_t n = 512;
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng) * (rng() % 4 == 0 ? 100.0f : 1.0f);
    std::vector<std::byte> q(static_cast<size_t>(ggml_row_bytes(type, n)));
    quantize_row(type, x.data(), q.data(), n);
    std::vector<float> y(n);
    dequantize_row(type, q.data(), y.data(), n);
    const int64_t block = ggml_type_info(static_cast<uint32_t>(type))->block_values;
    // Bound per block: levels over the block's range, with slack for rounded scales.
    const double levels = type == GgmlType::kQ8_0 ? 254 : type == GgmlType::kQ6_K ? 62 : 15;
    for (int64_t b = 0; b < n / block; ++b) {
      float amax = 0;
      for (int64_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(x[b * block + i]));
      const double tolerance = (type == GgmlType::kQ4_K ? 4.0 : 2.0) * amax / levels * 1.1;
      for (int64_t i = 0; i < block; ++i) {
        ASSERT_NEAR(y[b * block + i], x[b * block + i], tolerance)
            << ggml_type_name(static_cast<uint32_t>(type)) << " element " << b * block + i;
      }
    }
    std::vector<float> zeros(n, 0.0f);
    quantize_row(type, zeros.data(), q.data(), n);
    dequantize_row(type, q.data(), y.data(), n);
    for (float v : y) ASSERT_EQ(v, 0.0f);
  }
}

TEST(QuantTypesTest, NamesAndSizes) {
  EXPECT_EQ(ggml_row_bytes(GgmlType::kQ4_K, 512), 288);
  EXPECT_EQ(ggml_row_bytes(GgmlType::kQ6_K, 256), 210);
  EXPECT_EQ(ggml_row_bytes(GgmlType::kQ8_0, 64), 68);
  EXPECT_EQ(ggml_type_name(99), "type 99");
  EXPECT_EQ(parse_ggml_type("q4_k"), GgmlType::kQ4_K);
  EXPECT_EQ(parse_ggml_type("Q8_0"), GgmlType::kQ8_0);
  EXPECT_FALSE(parse_ggml_type("q3_k"));
}

}  // namespace
}  // namespace strata
