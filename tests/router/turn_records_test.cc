// The router's table of the workers' exact turn records (router/turn_records.h): records kept,
// replaced and moved to another worker; sessions and responses apart; the count and byte
// bounds drop the least recently used (a find refreshes); a record larger than the byte
// bound is not kept and drops the key's previous one; erase; a worker removed or restarted
// (forget_worker) leaves none of its records; and a randomized run against a plain reference.
#include "router/turn_records.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace strata::router {
namespace {

TurnEntry turn_entry(uint32_t worker, size_t num_tokens, int32_t first_token = 0) {
  TurnEntry e;
  e.worker = worker;
  e.record.num_messages = 2;
  for (size_t i = 0; i < num_tokens; ++i) {
    e.record.tokens.push_back(first_token + static_cast<int32_t>(i));
  }
  e.record.stop_text = "<|im_end|>";
  e.record.completion_text = "done";
  return e;
}

TEST(TurnRecordTableTest, KeepsReplacesAndMoves) {
  TurnRecordTable t;
  EXPECT_EQ(t.find(TurnKey::kSession, "s1"), nullptr);
  ASSERT_TRUE(t.put(TurnKey::kSession, "s1", turn_entry(1, 40, 100)));
  ASSERT_TRUE(t.put(TurnKey::kResponse, "resp_1", turn_entry(2, 8)));
  auto s1 = t.find(TurnKey::kSession, "s1");
  ASSERT_NE(s1, nullptr);
  EXPECT_EQ(s1->worker, 1u);
  EXPECT_EQ(s1->record.tokens.size(), 40u);
  EXPECT_EQ(s1->record.tokens.front(), 100);
  // Sessions and responses are apart: the same name in the other kind is another key.
  EXPECT_EQ(t.find(TurnKey::kResponse, "s1"), nullptr);
  EXPECT_EQ(t.find(TurnKey::kSession, "resp_1"), nullptr);
  // The session's next turn, answered by another worker: replaced and moved.
  ASSERT_TRUE(t.put(TurnKey::kSession, "s1", turn_entry(2, 60)));
  EXPECT_EQ(t.find(TurnKey::kSession, "s1")->worker, 2u);
  EXPECT_EQ(t.find(TurnKey::kSession, "s1")->record.tokens.size(), 60u);
  EXPECT_EQ(t.records_on(1), 0);
  EXPECT_EQ(t.records_on(2), 2);
  EXPECT_EQ(t.size(), 2);
  // A record found earlier stays readable after it was replaced (shared, immutable).
  EXPECT_EQ(s1->record.tokens.size(), 40u);
  // The byte count follows what is held.
  EXPECT_EQ(t.bytes(), TurnRecordTable::size_of(*t.find(TurnKey::kSession, "s1"), 3) +
                           TurnRecordTable::size_of(*t.find(TurnKey::kResponse, "resp_1"), 7));
  EXPECT_FALSE(t.put(TurnKey::kSession, "", turn_entry(1, 4)));
}

TEST(TurnRecordTableTest, EraseForgetsAKey) {
  TurnRecordTable t;
  ASSERT_TRUE(t.put(TurnKey::kSession, "s", turn_entry(0, 16)));
  EXPECT_TRUE(t.erase(TurnKey::kSession, "s"));
  EXPECT_FALSE(t.erase(TurnKey::kSession, "s"));
  EXPECT_EQ(t.find(TurnKey::kSession, "s"), nullptr);
  EXPECT_EQ(t.size(), 0);
  EXPECT_EQ(t.bytes(), 0);
  EXPECT_EQ(t.records_on(0), 0);
  EXPECT_EQ(t.stats().erased, 1u);
}

TEST(TurnRecordTableTest, TheCountBoundDropsTheLeastRecentlyUsed) {
  TurnRecordTable t(TurnRecordOptions{.max_records = 3});
  for (const char* s : {"a", "b", "c"}) ASSERT_TRUE(t.put(TurnKey::kSession, s, turn_entry(0, 4)));
  ASSERT_NE(t.find(TurnKey::kSession, "a"), nullptr);  // refreshed: b is the oldest now
  ASSERT_TRUE(t.put(TurnKey::kSession, "d", turn_entry(0, 4)));
  EXPECT_EQ(t.size(), 3);
  EXPECT_EQ(t.find(TurnKey::kSession, "b"), nullptr);
  EXPECT_NE(t.find(TurnKey::kSession, "a"), nullptr);
  EXPECT_NE(t.find(TurnKey::kSession, "c"), nullptr);
  EXPECT_NE(t.find(TurnKey::kSession, "d"), nullptr);
  EXPECT_EQ(t.stats().lru_drops, 1u);
}

TEST(TurnRecordTableTest, TheByteBoundDropsTheLeastRecentlyUsedAndRefusesAGiant) {
  const int64_t mib = int64_t{1} << 20;
  TurnRecordTable t(TurnRecordOptions{.max_records = 1000, .max_bytes = mib});
  // Records of 96 KiB of tokens each: ten fit in 1 MiB, the eleventh drops the oldest.
  const size_t tokens = 96 * 1024 / sizeof(int32_t);
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(t.put(TurnKey::kSession, "s" + std::to_string(i), turn_entry(0, tokens)));
  }
  EXPECT_EQ(t.size(), 10);
  ASSERT_TRUE(t.put(TurnKey::kSession, "s10", turn_entry(0, tokens)));
  EXPECT_LE(t.bytes(), mib);
  EXPECT_EQ(t.find(TurnKey::kSession, "s0"), nullptr);
  EXPECT_NE(t.find(TurnKey::kSession, "s10"), nullptr);
  EXPECT_GE(t.stats().lru_drops, 1u);
  // A record larger than the whole bound is not kept, and the key's previous one goes: the
  // router must not predict from a record the worker has replaced.
  EXPECT_FALSE(t.put(TurnKey::kSession, "s10", turn_entry(0, static_cast<size_t>(mib))));
  EXPECT_EQ(t.find(TurnKey::kSession, "s10"), nullptr);
  EXPECT_EQ(t.stats().too_large, 1u);
  EXPECT_LE(t.bytes(), mib);
}

TEST(TurnRecordTableTest, AWorkerRemovedOrRestartedLeavesNoRecord) {
  TurnRecordTable t;
  ASSERT_TRUE(t.put(TurnKey::kSession, "a", turn_entry(1, 4)));
  ASSERT_TRUE(t.put(TurnKey::kResponse, "resp_a", turn_entry(1, 4)));
  ASSERT_TRUE(t.put(TurnKey::kSession, "b", turn_entry(2, 4)));
  EXPECT_EQ(t.forget_worker(1), 2);
  EXPECT_EQ(t.find(TurnKey::kSession, "a"), nullptr);
  EXPECT_EQ(t.find(TurnKey::kResponse, "resp_a"), nullptr);
  EXPECT_NE(t.find(TurnKey::kSession, "b"), nullptr);
  EXPECT_EQ(t.records_on(1), 0);
  EXPECT_EQ(t.records_on(2), 1);
  EXPECT_EQ(t.forget_worker(1), 0);
  EXPECT_EQ(t.stats().forgotten, 2u);
  EXPECT_EQ(t.bytes(), TurnRecordTable::size_of(*t.find(TurnKey::kSession, "b"), 2));
}

TEST(TurnRecordTableTest, OptionsAreValidated) {
  EXPECT_TRUE(validate(TurnRecordOptions{}).has_value());
  EXPECT_FALSE(validate(TurnRecordOptions{.max_records = 0}).has_value());
  EXPECT_FALSE(validate(TurnRecordOptions{.max_records = 1, .max_bytes = 1000}).has_value());
}

// Random puts, finds, erases and forgets against a reference: a vector of (key, worker,
// first token) in recency order, most recent first, bounded by count only (records of one
// size, far under the byte bound).
TEST(TurnRecordTableTest, RandomizedAgainstAReference) {
  std::mt19937 rng(7);
  constexpr int64_t kMax = 8;
  TurnRecordTable t(TurnRecordOptions{.max_records = kMax});
  struct Ref {
    std::string key;
    uint32_t worker;
    int32_t first;
  };
  std::vector<Ref> ref;
  auto ref_find = [&](const std::string& k) {
    return std::find_if(ref.begin(), ref.end(), [&](const Ref& r) { return r.key == k; });
  };
  for (int step = 0; step < 20000; ++step) {
    const std::string key = "k" + std::to_string(rng() % 16);
    const uint32_t worker = rng() % 3;
    switch (rng() % 8) {
      case 0:
      case 1:
      case 2: {
        const int32_t first = static_cast<int32_t>(rng() % 1000);
        ASSERT_TRUE(t.put(TurnKey::kSession, key, turn_entry(worker, 4, first)));
        if (auto it = ref_find(key); it != ref.end()) ref.erase(it);
        if (static_cast<int64_t>(ref.size()) >= kMax) ref.pop_back();
        ref.insert(ref.begin(), Ref{key, worker, first});
        break;
      }
      case 3:
      case 4:
      case 5: {
        auto got = t.find(TurnKey::kSession, key);
        auto it = ref_find(key);
        ASSERT_EQ(got != nullptr, it != ref.end()) << key;
        if (got) {
          EXPECT_EQ(got->worker, it->worker);
          EXPECT_EQ(got->record.tokens.front(), it->first);
          Ref r = *it;
          ref.erase(it);
          ref.insert(ref.begin(), r);
        }
        break;
      }
      case 6: {
        auto it = ref_find(key);
        EXPECT_EQ(t.erase(TurnKey::kSession, key), it != ref.end());
        if (it != ref.end()) ref.erase(it);
        break;
      }
      default: {
        const int64_t n =
            std::count_if(ref.begin(), ref.end(), [&](const Ref& r) { return r.worker == worker; });
        EXPECT_EQ(t.forget_worker(worker), n);
        std::erase_if(ref, [&](const Ref& r) { return r.worker == worker; });
      }
    }
    ASSERT_EQ(t.size(), static_cast<int64_t>(ref.size()));
    for (uint32_t w = 0; w < 3; ++w) {
      ASSERT_EQ(t.records_on(w),
                std::count_if(ref.begin(), ref.end(), [&](const Ref& r) { return r.worker == w; }));
    }
  }
}

}  // namespace
}  // namespace strata::router
