#include "kvtransfer/page_runs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "memory/kv_pool.h"

namespace strata {
namespace {

KvPoolShape shape(int32_t num_pages, KvDtype dtype = KvDtype::kF32, int32_t layers = 3,
                  int32_t heads = 2, int32_t head_dim = 4, int32_t page_size = 4) {
  return KvPoolShape{layers, heads, head_dim, num_pages, page_size, dtype};
}

std::vector<PageId> ids(std::initializer_list<int32_t> pages) {
  std::vector<PageId> out;
  for (int32_t p : pages) out.push_back(make_page_id(p));
  return out;
}

void fill_random_bytes(KvPool& pool, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::byte* base = kv_pool_base(pool);
  for (size_t i = 0; i < pool.total_bytes(); ++i) base[i] = static_cast<std::byte>(gen());
}

// The reference: one page at a time through the pool's own per-layer block accessors.
void reference_copy(const KvPool& src, KvPool& dst, const std::vector<PageId>& src_pages,
                    const std::vector<PageId>& dst_pages) {
  const size_t block = src.block_bytes();
  for (size_t i = 0; i < src_pages.size(); ++i) {
    for (int32_t l = 0; l < src.num_layers(); ++l) {
      std::memcpy(dst.k_block(l, dst_pages[i]), src.k_block(l, src_pages[i]), block);
      std::memcpy(dst.v_block(l, dst_pages[i]), src.v_block(l, src_pages[i]), block);
    }
  }
}

TEST(PageRunsTest, GeometryMatchesThePool) {
  for (KvDtype dtype :
       {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kInt8, KvDtype::kFp8E4M3}) {
    const KvPoolShape s = shape(7, dtype, 2, 3, 8, 16);
    KvPool pool(s);
    const KvPoolGeometry g = kv_pool_geometry(s);
    EXPECT_EQ(g.block_bytes, pool.block_bytes());
    EXPECT_EQ(g.region_bytes, pool.layer_region_bytes());
    EXPECT_EQ(g.total_bytes(), pool.total_bytes());
    EXPECT_EQ(kv_pool_base(pool) + g.region_bytes * 3 + g.block_bytes * 5,
              pool.v_block(1, make_page_id(5)));
  }
}

TEST(PageRunsTest, ConsecutivePagesMergeIntoOneRunPerRegion) {
  const KvPoolShape src = shape(10), dst = shape(20);
  const KvPoolGeometry sg = kv_pool_geometry(src), dg = kv_pool_geometry(dst);
  auto runs = plan_page_runs(src, dst, ids({2, 3, 4}), ids({7, 8, 9}));
  ASSERT_TRUE(runs) << runs.error().message;
  ASSERT_EQ(runs->size(), 6u);  // 3 layers x K/V
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ((*runs)[r], (PageRun{r * sg.region_bytes + 2 * sg.block_bytes,
                                   r * dg.region_bytes + 7 * dg.block_bytes, 3 * sg.block_bytes}));
  }
}

TEST(PageRunsTest, PairsMergeWhateverTheirOrder) {
  const KvPoolShape s = shape(10);
  auto runs = plan_page_runs(s, s, ids({4, 2, 3}), ids({6, 4, 5}));
  ASSERT_TRUE(runs);
  EXPECT_EQ(runs->size(), 6u);
  // Consecutive on one side only: no merge.
  runs = plan_page_runs(s, s, ids({1, 2}), ids({5, 3}));
  ASSERT_TRUE(runs);
  EXPECT_EQ(runs->size(), 12u);
}

TEST(PageRunsTest, WholePoolBecomesOneRun) {
  const KvPoolShape s = shape(5);
  std::vector<PageId> all;
  for (int32_t p = 0; p < 5; ++p) all.push_back(make_page_id(p));
  auto runs = plan_page_runs(s, s, all, all);
  ASSERT_TRUE(runs);
  ASSERT_EQ(runs->size(), 1u);
  EXPECT_EQ((*runs)[0], (PageRun{0, 0, kv_pool_geometry(s).total_bytes()}));
}

TEST(PageRunsTest, RefusesBadInput) {
  const KvPoolShape s = shape(4);
  EXPECT_EQ(plan_page_runs(s, s, ids({0, 1}), ids({0})).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(plan_page_runs(s, s, ids({4}), ids({0})).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(plan_page_runs(s, s, ids({0}), ids({-1})).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(plan_page_runs(s, s, ids({0, 1}), ids({2, 2})).error().code,
            ErrorCode::kInvalidArgument);
  auto other = s;
  other.head_dim = 8;
  auto r = plan_page_runs(s, other, ids({0}), ids({0}));
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("head_dim"), std::string::npos) << r.error().message;
  other = s;
  other.dtype = KvDtype::kBF16;
  EXPECT_EQ(plan_page_runs(s, other, ids({0}), ids({0})).error().code, ErrorCode::kInvalidArgument);
  // A source page sent to two destinations is allowed.
  EXPECT_TRUE(plan_page_runs(s, s, ids({1, 1}), ids({2, 3})));
  auto empty = plan_page_runs(s, s, {}, {});
  ASSERT_TRUE(empty);
  EXPECT_TRUE(empty->empty());
}

// Random page lists, the runs applied with memcpy, against the per-page reference.
TEST(PageRunsTest, RandomPageListsMatchPerPageCopies) {
  std::mt19937 gen(1234);
  for (int trial = 0; trial < 300; ++trial) {
    const KvDtype dtype = std::array{KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kInt8,
                                     KvDtype::kFp8E4M3}[trial % 5];
    const int32_t src_pages_n = 1 + static_cast<int32_t>(gen() % 40);
    const int32_t dst_pages_n = 1 + static_cast<int32_t>(gen() % 40);
    const int32_t layers = 1 + static_cast<int32_t>(gen() % 4);
    const int32_t page_size = (trial % 2 == 0) ? 16 : 3;
    const KvPoolShape ss = shape(src_pages_n, dtype, layers, 2, 4, page_size);
    const KvPoolShape ds = shape(dst_pages_n, dtype, layers, 2, 4, page_size);
    KvPool src(ss), via_runs(ds), via_reference(ds);
    fill_random_bytes(src, trial);
    fill_random_bytes(via_runs, 1000 + trial);
    std::memcpy(kv_pool_base(via_reference), kv_pool_base(via_runs), via_runs.total_bytes());

    // Often long consecutive stretches (as the allocator hands out), sometimes scattered.
    const int32_t n = static_cast<int32_t>(gen() % (std::min(src_pages_n, dst_pages_n) + 1));
    std::vector<int32_t> sp(src_pages_n), dp(dst_pages_n);
    std::iota(sp.begin(), sp.end(), 0);
    std::iota(dp.begin(), dp.end(), 0);
    if (gen() % 2 == 0) std::shuffle(sp.begin(), sp.end(), gen);
    if (gen() % 2 == 0) std::shuffle(dp.begin(), dp.end(), gen);
    const int32_t s0 = static_cast<int32_t>(gen() % (src_pages_n - n + 1));
    const int32_t d0 = static_cast<int32_t>(gen() % (dst_pages_n - n + 1));
    std::vector<PageId> src_ids, dst_ids;
    for (int32_t i = 0; i < n; ++i) {
      src_ids.push_back(make_page_id(sp[s0 + i]));
      dst_ids.push_back(make_page_id(dp[d0 + i]));
    }
    if (gen() % 3 == 0) {  // the pairs in any order
      std::vector<size_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), gen);
      std::vector<PageId> a, b;
      for (size_t i : order) {
        a.push_back(src_ids[i]);
        b.push_back(dst_ids[i]);
      }
      src_ids = a;
      dst_ids = b;
    }

    auto runs = plan_page_runs(ss, ds, src_ids, dst_ids);
    ASSERT_TRUE(runs) << runs.error().message;
    copy_page_runs(kv_pool_base(src), kv_pool_base(via_runs), *runs);
    reference_copy(src, via_reference, src_ids, dst_ids);
    ASSERT_EQ(
        std::memcmp(kv_pool_base(via_runs), kv_pool_base(via_reference), via_runs.total_bytes()), 0)
        << "trial " << trial;
    EXPECT_EQ(page_runs_bytes(*runs), static_cast<uint64_t>(n) * src.page_bytes());
    // Runs never overlap on the destination side, and come in source order.
    for (size_t i = 1; i < runs->size(); ++i) {
      EXPECT_LT((*runs)[i - 1].src_offset, (*runs)[i].src_offset);
    }
    auto sorted = *runs;
    std::sort(sorted.begin(), sorted.end(),
              [](const PageRun& a, const PageRun& b) { return a.dst_offset < b.dst_offset; });
    for (size_t i = 1; i < sorted.size(); ++i) {
      EXPECT_LE(sorted[i - 1].dst_offset + sorted[i - 1].size_bytes, sorted[i].dst_offset);
    }
  }
}

}  // namespace
}  // namespace strata
