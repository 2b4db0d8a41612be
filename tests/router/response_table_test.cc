// The response table (router/response_table.h): bindings made, moved and looked up; the
// bound drops the least recently used (a lookup refreshes); erase and unbind_worker; ids
// refused; counts per worker; misses remembered for their TTL, forgotten by a bind, bounded;
// and randomized runs against plain references.
#include "router/response_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace strata::router {
namespace {

TEST(ResponseTableTest, BindLookupAndMove) {
  ResponseTable t;
  EXPECT_FALSE(t.lookup("resp_a").has_value());
  ASSERT_TRUE(t.bind("resp_a", 1).has_value());
  ASSERT_TRUE(t.bind("resp_b", 2).has_value());
  EXPECT_EQ(t.lookup("resp_a"), 1u);
  EXPECT_EQ(t.peek("resp_b"), 2u);
  EXPECT_EQ(t.responses_on(1), 1);
  // Bound again to another worker: moved, counted once.
  ASSERT_TRUE(t.bind("resp_a", 2).has_value());
  EXPECT_EQ(t.lookup("resp_a"), 2u);
  EXPECT_EQ(t.responses_on(1), 0);
  EXPECT_EQ(t.responses_on(2), 2);
  EXPECT_EQ(t.size(), 2);
  EXPECT_EQ(t.stats().binds, 3u);
}

TEST(ResponseTableTest, IdsAreChecked) {
  ResponseTable t(ResponseTableOptions{.max_responses = 4, .max_id_bytes = 8});
  EXPECT_FALSE(t.bind("", 0).has_value());
  EXPECT_FALSE(t.bind("123456789", 0).has_value());
  EXPECT_TRUE(t.bind("12345678", 0).has_value());
  EXPECT_FALSE(t.lookup("123456789").has_value());
  EXPECT_EQ(t.size(), 1);
  EXPECT_FALSE(validate(ResponseTableOptions{.max_responses = 0}).has_value());
  EXPECT_FALSE(validate(ResponseTableOptions{.max_id_bytes = 0}).has_value());
}

TEST(ResponseTableTest, TheBoundDropsTheLeastRecentlyUsed) {
  ResponseTable t(ResponseTableOptions{.max_responses = 3});
  ASSERT_TRUE(t.bind("r1", 0).has_value());
  ASSERT_TRUE(t.bind("r2", 0).has_value());
  ASSERT_TRUE(t.bind("r3", 1).has_value());
  // A continuation of r1 refreshes it: r2 is now the oldest.
  EXPECT_EQ(t.lookup("r1"), 0u);
  ASSERT_TRUE(t.bind("r4", 1).has_value());
  EXPECT_EQ(t.size(), 3);
  EXPECT_FALSE(t.peek("r2").has_value());
  EXPECT_TRUE(t.peek("r1").has_value());
  EXPECT_EQ(t.stats().lru_drops, 1u);
  // peek does not refresh: r3 is the next to go.
  EXPECT_TRUE(t.peek("r3").has_value());
  ASSERT_TRUE(t.bind("r5", 2).has_value());
  EXPECT_FALSE(t.peek("r3").has_value());
  EXPECT_EQ(t.responses_on(0), 1);
  EXPECT_EQ(t.responses_on(1), 1);
  EXPECT_EQ(t.responses_on(2), 1);
}

TEST(ResponseTableTest, EraseAndUnbindWorker) {
  ResponseTable t;
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(t.bind("r" + std::to_string(i), i % 3).has_value());
  EXPECT_TRUE(t.erase("r0"));
  EXPECT_FALSE(t.erase("r0"));
  EXPECT_EQ(t.stats().erased, 1u);
  EXPECT_EQ(t.unbind_worker(0), 3);  // r3, r6, r9
  EXPECT_EQ(t.unbind_worker(0), 0);
  EXPECT_EQ(t.stats().unbound, 3u);
  EXPECT_EQ(t.size(), 6);
  EXPECT_EQ(t.responses_on(0), 0);
  EXPECT_EQ(t.responses_on(1), 3);
  EXPECT_EQ(t.responses_on(2), 3);
  for (int i : {1, 4, 7}) EXPECT_EQ(t.peek("r" + std::to_string(i)), 1u);
  EXPECT_FALSE(t.peek("r3").has_value());
}

TEST(ResponseTableTest, AMissIsRememberedForItsTtl) {
  ResponseTable t(ResponseTableOptions{.miss_ttl_ms = 100});
  EXPECT_FALSE(t.known_missing("resp_x", 0));
  t.remember_missing("resp_x", 1'000);
  EXPECT_TRUE(t.known_missing("resp_x", 1'000));
  EXPECT_TRUE(t.known_missing("resp_x", 1'099));
  EXPECT_FALSE(t.known_missing("resp_x", 1'100));  // ran out, and dropped
  EXPECT_EQ(t.misses(), 0);
  EXPECT_FALSE(t.known_missing("resp_x", 1'000));
  // Remembered again: its TTL counts from then.
  t.remember_missing("resp_x", 2'000);
  t.remember_missing("resp_x", 2'050);
  EXPECT_TRUE(t.known_missing("resp_x", 2'120));
  EXPECT_FALSE(t.known_missing("resp_x", 2'150));
  EXPECT_EQ(t.stats().misses_remembered, 3u);
  EXPECT_EQ(t.stats().miss_hits, 3u);
  // A bind forgets the miss at once (the response exists now).
  t.remember_missing("resp_y", 3'000);
  ASSERT_TRUE(t.bind("resp_y", 4).has_value());
  EXPECT_FALSE(t.known_missing("resp_y", 3'001));
  EXPECT_EQ(t.lookup("resp_y"), 4u);
  // Ids the table would not bind are not remembered either; a TTL of 0 remembers nothing.
  t.remember_missing("", 3'000);
  t.remember_missing(std::string(300, 'r'), 3'000);
  EXPECT_EQ(t.misses(), 0);
  ResponseTable none(ResponseTableOptions{.miss_ttl_ms = 0});
  none.remember_missing("resp_x", 0);
  EXPECT_FALSE(none.known_missing("resp_x", 0));
  EXPECT_FALSE(validate(ResponseTableOptions{.miss_ttl_ms = -1}).has_value());
}

TEST(ResponseTableTest, MissesAreBounded) {
  ResponseTable t(ResponseTableOptions{.miss_ttl_ms = 1'000'000});
  const size_t n = ResponseTable::kMaxMisses + 500;
  for (size_t i = 0; i < n; ++i) t.remember_missing("resp_" + std::to_string(i), 10);
  EXPECT_LE(t.misses(), static_cast<int64_t>(ResponseTable::kMaxMisses));
  // The oldest went first; the newest are all there.
  EXPECT_FALSE(t.known_missing("resp_0", 11));
  EXPECT_FALSE(t.known_missing("resp_499", 11));
  for (size_t i = n - 100; i < n; ++i)
    EXPECT_TRUE(t.known_missing("resp_" + std::to_string(i), 11));
}

// Random remembers, binds and queries at a clock that moves forward, against a reference map
// of id -> until (no bound reached here).
TEST(ResponseTableTest, MissesMatchAReferenceModel) {
  std::mt19937_64 rng(5);
  ResponseTable t(ResponseTableOptions{.miss_ttl_ms = 50});
  std::map<std::string, int64_t> until;
  int64_t now = 0;
  for (int step = 0; step < 20'000; ++step) {
    now += static_cast<int64_t>(rng() % 7);
    const std::string id = "resp_" + std::to_string(rng() % 40);
    switch (rng() % 3) {
      case 0:
        t.remember_missing(id, now);
        until[id] = now + 50;
        break;
      case 1:
        ASSERT_TRUE(t.bind(id, 1).has_value());
        until.erase(id);
        break;
      default: {
        const auto it = until.find(id);
        const bool expected = it != until.end() && it->second > now;
        ASSERT_EQ(t.known_missing(id, now), expected) << id << " at " << now;
        break;
      }
    }
  }
}

// Random binds, lookups, erases and worker removals against a reference: a vector of
// (id, worker), most recently used first.
TEST(ResponseTableTest, MatchesAReferenceModel) {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 20; ++round) {
    const int64_t bound = 1 + static_cast<int64_t>(rng() % 12);
    ResponseTable t(ResponseTableOptions{.max_responses = bound});
    std::vector<std::pair<std::string, uint32_t>> ref;
    auto find = [&](const std::string& id) {
      return std::find_if(ref.begin(), ref.end(), [&](const auto& e) { return e.first == id; });
    };
    for (int step = 0; step < 400; ++step) {
      const std::string id = "r" + std::to_string(rng() % 24);
      const uint32_t worker = static_cast<uint32_t>(rng() % 4);
      switch (rng() % 4) {
        case 0: {
          ASSERT_TRUE(t.bind(id, worker).has_value());
          if (auto it = find(id); it != ref.end()) ref.erase(it);
          ref.insert(ref.begin(), {id, worker});
          if (static_cast<int64_t>(ref.size()) > bound) ref.pop_back();
          break;
        }
        case 1: {
          auto it = find(id);
          const auto got = t.lookup(id);
          ASSERT_EQ(got.has_value(), it != ref.end());
          if (it != ref.end()) {
            EXPECT_EQ(*got, it->second);
            auto e = *it;
            ref.erase(it);
            ref.insert(ref.begin(), e);
          }
          break;
        }
        case 2: {
          auto it = find(id);
          EXPECT_EQ(t.erase(id), it != ref.end());
          if (it != ref.end()) ref.erase(it);
          break;
        }
        default: {
          if (rng() % 8 != 0) break;
          const auto n = std::erase_if(ref, [&](const auto& e) { return e.second == worker; });
          EXPECT_EQ(t.unbind_worker(worker), static_cast<int64_t>(n));
        }
      }
      ASSERT_EQ(t.size(), static_cast<int64_t>(ref.size()));
      for (uint32_t w = 0; w < 4; ++w) {
        EXPECT_EQ(t.responses_on(w), std::count_if(ref.begin(), ref.end(),
                                                   [&](const auto& e) { return e.second == w; }));
      }
    }
    for (const auto& [id, worker] : ref) EXPECT_EQ(t.peek(id), worker);
  }
}

}  // namespace
}  // namespace strata::router
