// EvictionHistory (cache/eviction_history.h) against a simple reference: a list of the last
// `capacity` recorded hashes, a taken one removed (exact sizes); and its sampling beyond them.
#include "cache/eviction_history.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <random>
#include <vector>

namespace strata {
namespace {

TEST(EvictionHistoryTest, RemembersTheLastCapacityBlocksAndForgetsWhatIsTaken) {
  EvictionHistory h(3);
  const std::vector<BlockHash> first = {11, 12};
  h.record(first);
  EXPECT_EQ(h.size(), 2);
  EXPECT_TRUE(h.take(12));
  EXPECT_FALSE(h.take(12));  // one recomputation per eviction
  const std::vector<BlockHash> more = {13, 14, 15};
  h.record(more);  // the ring comes round: 11 is forgotten
  EXPECT_FALSE(h.take(11));
  EXPECT_TRUE(h.take(13));
  EXPECT_TRUE(h.take(15));
  EXPECT_EQ(h.size(), 1);
  h.clear();
  EXPECT_FALSE(h.take(14));
  EXPECT_EQ(h.size(), 0);
}

TEST(EvictionHistoryTest, ARecordedAgainBlockIsRememberedFromItsLatestRecord) {
  EvictionHistory h(2);
  const std::vector<BlockHash> a = {1, 2, 3, 2};  // the last two records: 3 and 2
  h.record(a);
  EXPECT_TRUE(h.take(2));
  EXPECT_TRUE(h.take(3));
  EXPECT_FALSE(h.take(1));
  const std::vector<BlockHash> b = {7, 8, 7, 9};  // 7's first slot goes to 9, not 7 itself
  h.record(b);
  EXPECT_TRUE(h.take(9));
  EXPECT_TRUE(h.take(7));
  EXPECT_FALSE(h.take(8));
}

TEST(EvictionHistoryTest, ZeroCapacityRemembersNothing) {
  EvictionHistory h(0);
  const std::vector<BlockHash> a = {1, 2};
  h.record(a);
  EXPECT_FALSE(h.take(1));
  EXPECT_EQ(h.capacity(), 0);
}

// Beyond kExactBlocks the history keeps a fixed 1/S of the hash space and counts each block
// taken as S pages (issue 56): over many blocks the count comes out near the exact one, a
// block outside the sample is never counted, and the window is still the last `capacity`
// recorded blocks.
TEST(EvictionHistoryTest, ALargeHistorySamplesByHashAndCountsEachBlockTakenForItsShare) {
  const int64_t capacity = 4 * EvictionHistory::kExactBlocks;
  EvictionHistory h(capacity);
  EXPECT_EQ(h.pages_per_block(), 4);
  EXPECT_EQ(EvictionHistory(EvictionHistory::kExactBlocks).pages_per_block(), 1);
  std::mt19937_64 rng(56);
  std::vector<BlockHash> old(static_cast<size_t>(capacity)), recent(old.size());
  for (auto& x : old) x = rng();
  for (auto& x : recent) x = rng();
  h.record(old);
  h.record(recent);  // the window moves past most of `old`
  EXPECT_LE(h.size(), capacity / 4 + 1);
  // The last half of `recent` is well inside the window, the first half of `old` well
  // outside it (the ring holds the last capacity / 4 sampled blocks: the window's edge
  // moves by the sample's chance, about 1 % of the window).
  const size_t half = recent.size() / 2;
  int64_t counted = 0, counted_old = 0;
  for (size_t i = half; i < recent.size(); ++i) {
    const int64_t pages = h.take(recent[i]);
    ASSERT_TRUE(pages == 0 || pages == 4) << pages;
    counted += pages;
    EXPECT_EQ(h.take(recent[i]), 0);  // once
  }
  for (size_t i = 0; i < half; ++i) counted_old += h.take(old[i]);
  EXPECT_EQ(counted_old, 0);
  // 32,768 blocks, a quarter of them sampled (8,192, standard deviation 78), 4 pages each.
  EXPECT_NEAR(static_cast<double>(counted), static_cast<double>(half), 4 * 4 * 78.0);
}

TEST(EvictionHistoryTest, RandomRecordsAndTakesMatchAListOfTheLastRecords) {
  std::mt19937_64 rng(33);
  for (int64_t capacity : {1, 5, 64}) {
    EvictionHistory h(capacity);
    std::deque<std::pair<BlockHash, bool>> ring;  // (hash, still there), the last `capacity`
    for (int step = 0; step < 20'000; ++step) {
      const BlockHash x = rng() % 97;
      if (rng() % 2 == 0) {
        const std::vector<BlockHash> one = {x};
        h.record(one);
        for (auto& [hash, live] : ring) {
          if (hash == x) live = false;  // superseded by this record
        }
        ring.emplace_back(x, true);
        if (static_cast<int64_t>(ring.size()) > capacity) ring.pop_front();
      } else {
        const auto it = std::find_if(ring.begin(), ring.end(),
                                     [&](const auto& e) { return e.first == x && e.second; });
        const bool expected = it != ring.end();
        if (expected) it->second = false;
        ASSERT_EQ(h.take(x), expected) << "capacity " << capacity << ", step " << step;
      }
      const auto live =
          std::count_if(ring.begin(), ring.end(), [](const auto& e) { return e.second; });
      ASSERT_EQ(h.size(), live);
    }
  }
}

}  // namespace
}  // namespace strata
