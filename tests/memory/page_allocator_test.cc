#include "memory/page_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "memory/page_id.h"

namespace strata {
namespace {

std::vector<PageId> ids(std::initializer_list<int32_t> indices) {
  std::vector<PageId> out;
  for (int32_t i : indices) out.push_back(make_page_id(i));
  return out;
}

TEST(PageAllocatorTest, StartsAllFreeAndHandsOutLowIdsFirst) {
  PageAllocator a(8);
  EXPECT_EQ(a.num_pages(), 8);
  EXPECT_EQ(a.num_free(), 8);
  EXPECT_EQ(a.num_allocated(), 0);
  EXPECT_TRUE(a.audit({}));

  std::vector<PageId> got;
  ASSERT_TRUE(a.allocate(3, got));
  EXPECT_EQ(got, ids({0, 1, 2}));
  EXPECT_EQ(a.num_free(), 5);
  EXPECT_EQ(a.num_allocated(), 3);
  for (PageId p : got) EXPECT_TRUE(a.is_allocated(p));
  EXPECT_FALSE(a.is_allocated(make_page_id(3)));
  EXPECT_TRUE(a.audit(got));
}

TEST(PageAllocatorTest, AllocateAppendsToWhatTheCallerHolds) {
  PageAllocator a(4);
  std::vector<PageId> got = ids({99});  // not the allocator's: left in place
  ASSERT_TRUE(a.allocate(2, got));
  EXPECT_EQ(got, ids({99, 0, 1}));
}

TEST(PageAllocatorTest, FreedPagesAreReusedMostRecentFirst) {
  PageAllocator a(4);
  std::vector<PageId> got;
  ASSERT_TRUE(a.allocate(4, got));
  a.free(make_page_id(1));
  a.free(std::vector<PageId>{make_page_id(3)});
  EXPECT_FALSE(a.is_allocated(make_page_id(1)));
  EXPECT_EQ(a.num_free(), 2);
  EXPECT_TRUE(a.audit(ids({0, 2})));

  std::vector<PageId> again;
  ASSERT_TRUE(a.allocate(2, again));
  EXPECT_EQ(again, ids({3, 1}));  // LIFO: the page freed last comes back first
}

TEST(PageAllocatorTest, ExhaustionIsAValueAndAllocatesNothing) {
  PageAllocator a(5);
  std::vector<PageId> held;
  ASSERT_TRUE(a.allocate(4, held));

  std::vector<PageId> out = ids({42});
  const Status st = a.allocate(2, out);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.error().code, ErrorCode::kOutOfPages);
  EXPECT_EQ(st.error().message, "need 2 pages, 1 free");
  EXPECT_EQ(out, ids({42}));  // all or nothing: unchanged
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_TRUE(a.audit(held));

  // Exactly what is left still fits; then nothing does, not even one page.
  ASSERT_TRUE(a.allocate(1, held));
  EXPECT_EQ(a.num_free(), 0);
  std::vector<PageId> none;
  EXPECT_EQ(a.allocate(1, none).error().code, ErrorCode::kOutOfPages);
  EXPECT_TRUE(none.empty());
  EXPECT_TRUE(a.allocate(0, none));  // zero pages always fit
  EXPECT_TRUE(none.empty());
}

TEST(PageAllocatorTest, ANegativeCountIsRefused) {
  PageAllocator a(2);
  std::vector<PageId> out;
  EXPECT_EQ(a.allocate(-1, out).error().code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(a.num_free(), 2);
}

TEST(PageAllocatorTest, AnEmptyPoolHasNothingToGive) {
  PageAllocator a(0);
  std::vector<PageId> out;
  EXPECT_TRUE(a.allocate(0, out));
  EXPECT_EQ(a.allocate(1, out).error().code, ErrorCode::kOutOfPages);
  EXPECT_TRUE(a.audit({}));
}

TEST(PageAllocatorTest, ResetFreesEverything) {
  PageAllocator a(6);
  std::vector<PageId> got;
  ASSERT_TRUE(a.allocate(4, got));
  a.free(got[2]);
  a.reset();
  EXPECT_EQ(a.num_free(), 6);
  for (PageId p : got) EXPECT_FALSE(a.is_allocated(p));
  EXPECT_TRUE(a.audit({}));
  std::vector<PageId> again;
  ASSERT_TRUE(a.allocate(2, again));
  EXPECT_EQ(again, ids({0, 1}));
}

TEST(PageAllocatorTest, IsAllocatedIsFalseOutsideThePool) {
  PageAllocator a(3);
  EXPECT_FALSE(a.is_allocated(kInvalidPage));
  EXPECT_FALSE(a.is_allocated(make_page_id(3)));
}

TEST(PageAllocatorTest, AuditFindsEachViolation) {
  PageAllocator a(6);
  std::vector<PageId> held;
  ASSERT_TRUE(a.allocate(3, held));  // 0, 1, 2
  EXPECT_TRUE(a.audit(held));
  EXPECT_TRUE(a.audit(ids({2, 0, 1})));  // order does not matter

  const Status leak = a.audit(ids({0, 1}));
  ASSERT_FALSE(leak);
  EXPECT_EQ(leak.error().code, ErrorCode::kInternal);
  EXPECT_EQ(leak.error().message, "1 allocated pages have no owner (leak)");

  const Status twice = a.audit(ids({0, 1, 1}));
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.error().message, "page 1 is owned twice");

  const Status owned_free = a.audit(ids({0, 1, 2, 4}));
  ASSERT_FALSE(owned_free);
  EXPECT_EQ(owned_free.error().message, "page 4 is owned but free");

  const Status outside = a.audit(ids({0, 1, 2, 6}));
  ASSERT_FALSE(outside);
  EXPECT_EQ(outside.error().message, "owned page id out of range: 6");
  EXPECT_FALSE(a.audit(ids({0, 1, -1})));
}

TEST(PageAllocatorDeathTest, DoubleFreeIsRefused) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  PageAllocator a(4);
  std::vector<PageId> got;
  ASSERT_TRUE(a.allocate(2, got));
  a.free(got[0]);
  EXPECT_DEATH(a.free(got[0]), "double free of page 0");
  // A page never allocated is refused the same way.
  EXPECT_DEATH(a.free(make_page_id(3)), "double free of page 3");
}

TEST(PageAllocatorDeathTest, FreeingAnIdOutsideThePoolIsRefused) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  PageAllocator a(4);
  EXPECT_DEATH(a.free(make_page_id(4)), "page id out of range: 4");
  EXPECT_DEATH(a.free(kInvalidPage), "page id out of range: -1");
}

// Random allocations and frees against a reference model (the set of pages the caller
// owns): after every operation the counts match, each page's state matches, the audit
// passes with the reference's pages, and no id is handed out twice.
TEST(PageAllocatorRandomTest, MatchesAReferenceSetOfOwnedPages) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const int32_t num_pages = std::uniform_int_distribution<int32_t>(1, 64)(rng);
    PageAllocator a(num_pages);
    std::set<int32_t> owned;  // the reference
    for (int step = 0; step < 2'000; ++step) {
      const int op = std::uniform_int_distribution<int>(0, 9)(rng);
      if (op < 5) {
        const int32_t count = std::uniform_int_distribution<int32_t>(0, 8)(rng);
        std::vector<PageId> got;
        const Status st = a.allocate(count, got);
        const int32_t free_before = num_pages - static_cast<int32_t>(owned.size());
        if (count > free_before) {
          ASSERT_FALSE(st);
          ASSERT_EQ(st.error().code, ErrorCode::kOutOfPages);
          ASSERT_TRUE(got.empty());
        } else {
          ASSERT_TRUE(st) << st.error().message;
          ASSERT_EQ(static_cast<int32_t>(got.size()), count);
          for (PageId p : got) {
            ASSERT_GE(page_index(p), 0);
            ASSERT_LT(page_index(p), num_pages);
            ASSERT_TRUE(owned.insert(page_index(p)).second) << "page handed out twice";
          }
        }
      } else if (op < 9 && !owned.empty()) {
        // Free a random subset of what is owned, in a random order.
        std::vector<int32_t> pool(owned.begin(), owned.end());
        std::shuffle(pool.begin(), pool.end(), rng);
        pool.resize(std::uniform_int_distribution<size_t>(1, pool.size())(rng));
        std::vector<PageId> to_free;
        for (int32_t i : pool) {
          to_free.push_back(make_page_id(i));
          owned.erase(i);
        }
        a.free(to_free);
      } else if (op == 9 && step % 100 == 0) {
        a.reset();
        owned.clear();
      }
      ASSERT_EQ(a.num_allocated(), static_cast<int32_t>(owned.size()));
      ASSERT_EQ(a.num_free(), num_pages - static_cast<int32_t>(owned.size()));
      std::vector<PageId> owned_ids;
      for (int32_t i : owned) owned_ids.push_back(make_page_id(i));
      ASSERT_TRUE(a.audit(owned_ids));
      if (step % 97 == 0) {
        for (int32_t i = 0; i < num_pages; ++i) {
          ASSERT_EQ(a.is_allocated(make_page_id(i)), owned.count(i) == 1) << "page " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata
