// EvictionHistory (cache/eviction_history.h) against a simple reference: a list of the last
// `capacity` recorded hashes, a taken one removed.
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
