// The conversation records: bounded by count (least recently used dropped first) and by
// idle time, on a manual clock; a reference model checks a random sequence.
#include "server/conversations.h"

#include <gtest/gtest.h>

#include <list>
#include <random>
#include <string>

namespace strata {
namespace {

ConversationRecord record(int n) {
  ConversationRecord r;
  r.num_messages = static_cast<size_t>(n);
  r.tokens.assign(static_cast<size_t>(n), n);
  return r;
}

TEST(ConversationRecordsTest, KeepsTheMostRecentlyUsedWithinTheCap) {
  ManualClock clock;
  ConversationRecords records(3, 60'000, &clock);
  records.put("a", record(1));
  records.put("b", record(2));
  records.put("c", record(3));
  ASSERT_TRUE(records.find("a").has_value());  // a is now the most recent
  records.put("d", record(4));                 // drops b, the least recently used
  EXPECT_FALSE(records.find("b").has_value());
  EXPECT_EQ(records.find("a")->num_messages, 1u);
  EXPECT_TRUE(records.find("c").has_value());
  EXPECT_TRUE(records.find("d").has_value());
  const auto st = records.stats();
  EXPECT_EQ(st.records, 3u);
  EXPECT_EQ(st.dropped_capacity, 1u);
  EXPECT_EQ(st.dropped_idle, 0u);
}

TEST(ConversationRecordsTest, DropsRecordsIdlePastTheTtl) {
  ManualClock clock;
  ConversationRecords records(100, 1'000, &clock);
  records.put("old", record(1));
  clock.advance_ms(600);
  records.put("new", record(2));
  clock.advance_ms(500);  // old: idle 1,100 ms; new: 500 ms
  EXPECT_FALSE(records.find("old").has_value());
  EXPECT_TRUE(records.find("new").has_value());
  EXPECT_EQ(records.stats().dropped_idle, 1u);
  records.erase("new");
  EXPECT_EQ(records.stats().records, 0u);
}

TEST(ConversationRecordsTest, ACapOfZeroKeepsNothing) {
  ConversationRecords records(0, 1'000);
  records.put("a", record(1));
  EXPECT_FALSE(records.find("a").has_value());
  EXPECT_EQ(records.stats().records, 0u);
}

TEST(ConversationRecordsTest, MatchesAnLruReferenceOnRandomSequences) {
  std::mt19937 rng(7);
  ManualClock clock;
  const size_t cap = 16;
  ConversationRecords records(cap, 1'000'000, &clock);
  std::list<std::pair<std::string, int>> ref;  // front: most recent
  auto ref_find = [&](const std::string& id) -> std::optional<int> {
    for (auto it = ref.begin(); it != ref.end(); ++it) {
      if (it->first == id) {
        const int v = it->second;
        ref.erase(it);
        ref.emplace_front(id, v);
        return v;
      }
    }
    return std::nullopt;
  };
  for (int step = 0; step < 20'000; ++step) {
    std::string id = "s";  // (appended: g++ 12 warns falsely on "s" + std::to_string)
    id += std::to_string(rng() % 40);
    switch (rng() % 3) {
      case 0: {
        const auto got = records.find(id);
        const auto want = ref_find(id);
        ASSERT_EQ(got.has_value(), want.has_value()) << step;
        if (got) {
          ASSERT_EQ(static_cast<int>(got->num_messages), *want);
        }
        break;
      }
      case 1: {
        const int v = static_cast<int>(rng() % 1000);
        records.put(id, record(v));
        if (ref_find(id)) {
          ref.front().second = v;
        } else {
          if (ref.size() == cap) ref.pop_back();
          ref.emplace_front(id, v);
        }
        break;
      }
      default:
        records.erase(id);
        std::erase_if(ref, [&](const auto& e) { return e.first == id; });
    }
    ASSERT_EQ(records.stats().records, ref.size());
  }
}

}  // namespace
}  // namespace strata
