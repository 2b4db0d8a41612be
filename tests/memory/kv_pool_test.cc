#include "memory/kv_pool.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "memory/kv_dtype.h"

namespace strata {
namespace {

TEST(KvDtypeTest, F16ConversionsAreExactAndRoundToNearestEven) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001);         // smallest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);         // halfway to zero: ties to even
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);  // tie, even stays
  EXPECT_EQ(f32_to_f16(1.0f + 0x3p-11f), 0x3c02);  // tie, odd rounds up
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::nanf("")))));
  // Every F16 value widens and narrows back to itself.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
}

TEST(KvDtypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);  // tie, even
  EXPECT_EQ(f32_to_bf16(1.0f + 0x3p-8f), 0x3f82);  // tie, odd rounds up
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
}

TEST(KvDtypeTest, RowConversionsMatchScalar) {
  std::mt19937 gen(1);
  std::uniform_real_distribution<float> dist(-70000.0f, 70000.0f);
  std::vector<float> src(1000);
  for (float& v : src) v = dist(gen) * (gen() % 2 ? 1e-6f : 1.0f);
  src[3] = 0x1p-20f;  // F16 subnormal
  src[4] = -0.0f;
  std::vector<uint16_t> h(src.size()), b(src.size());
  f32_to_f16_row(src.data(), h.data(), src.size());
  f32_to_bf16_row(src.data(), b.data(), src.size());
  std::vector<float> hf(src.size()), bf(src.size());
  f16_to_f32_row(h.data(), hf.data(), src.size());
  bf16_to_f32_row(b.data(), bf.data(), src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(h[i], f32_to_f16(src[i])) << i;
    ASSERT_EQ(b[i], f32_to_bf16(src[i])) << i;
    ASSERT_EQ(hf[i], f16_to_f32(h[i])) << i;
    ASSERT_EQ(bf[i], bf16_to_f32(b[i])) << i;
  }
  EXPECT_EQ(parse_kv_dtype("BF16").value(), KvDtype::kBF16);
  EXPECT_EQ(parse_kv_dtype("float16").value(), KvDtype::kF16);
  EXPECT_EQ(parse_kv_dtype("int8").value(), KvDtype::kInt8);
  EXPECT_EQ(parse_kv_dtype("FP8_E4M3").value(), KvDtype::kFp8E4M3);
  EXPECT_EQ(parse_kv_dtype("fp8").value(), KvDtype::kFp8E4M3);  // vLLM's alias
  EXPECT_EQ(kv_dtype_name(KvDtype::kFp8E4M3), "fp8_e4m3");
  EXPECT_FALSE(parse_kv_dtype("int4").has_value());
  EXPECT_FALSE(parse_kv_dtype("fp8_e5m2").has_value());
}

TEST(KvPoolTest, ScaledBlocksCarryTheirScalesAfterTheCodes) {
  // 3 layers, 2 KV heads, head_dim 8, 10 pages of 4: per block 2 * 4 rows of 8 codes and
  // one BF16 scale each.
  KvPool pool(3, 2, 8, 10, 4, KvDtype::kInt8);
  EXPECT_EQ(pool.block_bytes(), 2u * 4u * 8u + 2u * 4u * 2u);
  EXPECT_EQ(pool.layer_page_bytes(), 2u * 80u);
  EXPECT_EQ(pool.page_bytes(), 3u * 160u);
  EXPECT_EQ(pool.total_bytes(), 10u * 3u * 160u);
  EXPECT_EQ(pool.scale_offset_bytes(1, 2), 64u + (4u + 2u) * 2u);
  EXPECT_EQ(pool.block_layout().block_bytes, pool.block_bytes());
  // BF16 of a Qwen3-like head (128 dims, page 16) against int8: 1.97x the tokens.
  EXPECT_EQ(kv_block_bytes(KvDtype::kBF16, 8, 16, 128), 32768u);
  EXPECT_EQ(kv_block_bytes(KvDtype::kFp8E4M3, 8, 16, 128), 16384u + 256u);
}

TEST(KvPoolTest, SizesFollowTheShape) {
  KvPool pool(3, 2, 8, 10, 4, KvDtype::kF16);
  EXPECT_EQ(pool.head_block_elements(), 4u * 8u);
  EXPECT_EQ(pool.block_elements(), 2u * 4u * 8u);
  EXPECT_EQ(pool.layer_page_bytes(), 2u * 64u * 2u);
  EXPECT_EQ(pool.page_bytes(), 3u * 256u);
  EXPECT_EQ(pool.total_bytes(), 10u * 3u * 256u);
  EXPECT_TRUE(pool.is_valid_page(make_page_id(9)));
  EXPECT_FALSE(pool.is_valid_page(make_page_id(10)));
  EXPECT_FALSE(pool.is_valid_page(kInvalidPage));
}

TEST(KvPoolTest, PageCopiesFollowTheDocumentedLayout) {
  for (KvDtype dtype :
       {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kInt8, KvDtype::kFp8E4M3}) {
    KvPool pool(2, 2, 4, 5, 3, dtype);
    // Tag every byte of page 3 with (layer, K/V, position in block).
    const size_t block_bytes = pool.block_bytes();
    EXPECT_EQ(block_bytes, kv_block_bytes(dtype, 2, 3, 4));
    for (int32_t layer = 0; layer < 2; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        std::byte* block =
            kv == 0 ? pool.k_block(layer, make_page_id(3)) : pool.v_block(layer, make_page_id(3));
        for (size_t i = 0; i < block_bytes; ++i) {
          block[i] = static_cast<std::byte>((layer * 64 + kv * 32 + i) & 0xff);
        }
      }
    }
    std::vector<std::byte> page(pool.page_bytes());
    pool.copy_page_out(make_page_id(3), page);
    for (int32_t layer = 0; layer < 2; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        for (size_t i = 0; i < block_bytes; ++i) {
          const size_t offset = (static_cast<size_t>(layer) * 2 + kv) * block_bytes + i;
          ASSERT_EQ(page[offset], static_cast<std::byte>((layer * 64 + kv * 32 + i) & 0xff));
        }
      }
    }
    // Into another page and another pool of the same shape: same bytes.
    pool.copy_page_in(make_page_id(0), page);
    KvPool other(2, 2, 4, 5, 3, dtype);
    other.copy_page_in(make_page_id(4), page);
    std::vector<std::byte> back(pool.page_bytes()), back_other(pool.page_bytes());
    pool.copy_page_out(make_page_id(0), back);
    other.copy_page_out(make_page_id(4), back_other);
    EXPECT_EQ(back, page);
    EXPECT_EQ(back_other, page);
    // Neighbouring pages untouched.
    std::vector<std::byte> neighbour(pool.page_bytes());
    pool.copy_page_out(make_page_id(1), neighbour);
    for (std::byte b : neighbour) ASSERT_EQ(b, std::byte{0});
    // One layer at a time.
    std::vector<std::byte> layer_bytes(pool.layer_page_bytes());
    pool.copy_layer_page_out(1, make_page_id(3), layer_bytes);
    EXPECT_EQ(
        std::memcmp(layer_bytes.data(), page.data() + pool.layer_page_bytes(), layer_bytes.size()),
        0);
    other.copy_layer_page_in(0, make_page_id(2), layer_bytes);
    EXPECT_EQ(std::memcmp(other.k_block(0, make_page_id(2)), layer_bytes.data(), block_bytes), 0);
    EXPECT_EQ(std::memcmp(other.v_block(0, make_page_id(2)), layer_bytes.data() + block_bytes,
                          block_bytes),
              0);
  }
}

TEST(KvPoolTest, TokensLandWhereTheLayoutSays) {
  // 2 layers, 3 KV heads, head_dim 4, page size 5.
  KvPool pool(2, 3, 4, 6, 5, KvDtype::kF32);
  std::vector<float> k(12), v(12);
  for (int i = 0; i < 12; ++i) {
    k[static_cast<size_t>(i)] = 100.0f + static_cast<float>(i);
    v[static_cast<size_t>(i)] = 200.0f + static_cast<float>(i);
  }
  pool.write_token(1, make_page_id(4), 3, k.data(), v.data());
  const float* kb = reinterpret_cast<const float*>(pool.k_block(1, make_page_id(4)));
  const float* vb = reinterpret_cast<const float*>(pool.v_block(1, make_page_id(4)));
  for (int h = 0; h < 3; ++h) {
    for (int d = 0; d < 4; ++d) {
      // K: [head][dim][slot]; V: [head][slot][dim].
      EXPECT_EQ(kb[h * 20 + d * 5 + 3], 100.0f + static_cast<float>(h * 4 + d));
      EXPECT_EQ(vb[h * 20 + 3 * 4 + d], 200.0f + static_cast<float>(h * 4 + d));
    }
  }
  for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16}) {
    KvPool p(1, 3, 4, 2, 5, dtype);
    p.write_token(0, make_page_id(1), 4, k.data(), v.data());
    std::vector<float> k2(12), v2(12);
    p.read_token(0, make_page_id(1), 4, k2.data(), v2.data());
    for (size_t i = 0; i < 12; ++i) {
      // 100..211 are exact in F16; BF16 keeps 8 significant bits.
      const float tolerance = dtype == KvDtype::kBF16 ? 1.0f : 0.0f;
      EXPECT_NEAR(k2[i], k[i], tolerance);
      EXPECT_NEAR(v2[i], v[i], tolerance);
    }
    // Other slots and the other page stay zero.
    p.read_token(0, make_page_id(1), 3, k2.data(), v2.data());
    for (size_t i = 0; i < 12; ++i) EXPECT_EQ(k2[i] + v2[i], 0.0f);
  }
}

TEST(KvPoolTest, CreateRefusesBadShapes) {
  auto zero = KvPool::create(KvPoolShape{1, 1, 8, 0, 16, KvDtype::kF32});
  ASSERT_FALSE(zero.has_value());
  EXPECT_EQ(zero.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(zero.error().message.find("num_pages"), std::string::npos);
  auto overflow = KvPool::create(
      KvPoolShape{INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX, INT32_MAX, KvDtype::kF32});
  ASSERT_FALSE(overflow.has_value());
  EXPECT_NE(overflow.error().message.find("overflows"), std::string::npos);
  auto ok = KvPool::create(KvPoolShape{2, 2, 16, 8, 16, KvDtype::kBF16});
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ((*ok)->dtype(), KvDtype::kBF16);
}

}  // namespace
}  // namespace strata
