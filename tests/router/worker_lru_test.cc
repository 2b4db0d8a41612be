// WorkerLru (router/worker_lru.h) against a plain reference: a vector of (key, worker,
// value) in most-recently-used order, under random inserts, touches, moves and erases.
#include "router/worker_lru.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

namespace strata::router {
namespace {

struct Ref {
  std::string key;
  uint32_t worker;
  int value;
};

void expect_same(WorkerLru<int>& lru, const std::vector<Ref>& ref) {
  ASSERT_EQ(lru.size(), static_cast<int64_t>(ref.size()));
  // Oldest first in the reference's reverse order.
  auto it = lru.oldest();
  for (auto r = ref.rbegin(); r != ref.rend(); ++r) {
    ASSERT_NE(it, lru.end());
    EXPECT_EQ(it->key, r->key);
    EXPECT_EQ(it->worker, r->worker);
    EXPECT_EQ(it->value, r->value);
    if (std::next(r) != ref.rend()) --it;
  }
  for (uint32_t w = 0; w < 4; ++w) {
    EXPECT_EQ(lru.count_on(w),
              std::ranges::count_if(ref, [w](const Ref& e) { return e.worker == w; }));
  }
  int64_t listed = 0;
  for (const auto& [w, n] : lru.per_worker()) {
    EXPECT_GT(n, 0);
    listed += n;
  }
  EXPECT_EQ(listed, lru.size());
}

TEST(WorkerLruTest, RandomOperationsMatchAReferenceList) {
  std::mt19937 rng(5);
  WorkerLru<int> lru;
  std::vector<Ref> ref;  // most recently used first
  for (int step = 0; step < 3000; ++step) {
    const std::string key = "k" + std::to_string(rng() % 40);
    const auto worker = static_cast<uint32_t>(rng() % 4);
    auto at = std::ranges::find(ref, key, &Ref::key);
    auto it = lru.find(key);
    ASSERT_EQ(it == lru.end(), at == ref.end());
    switch (rng() % 5) {
      case 0:  // insert, or touch and move when present
        if (at == ref.end()) {
          lru.insert(key, worker, step);
          ref.insert(ref.begin(), Ref{key, worker, step});
        } else {
          lru.set_worker(it, worker);
          lru.touch(it);
          Ref r = *at;
          r.worker = worker;
          ref.erase(at);
          ref.insert(ref.begin(), r);
        }
        break;
      case 1:  // erase
        if (at != ref.end()) {
          lru.erase(it);
          ref.erase(at);
        }
        break;
      case 2:  // drop the oldest
        if (!ref.empty()) {
          EXPECT_EQ(lru.oldest()->key, ref.back().key);
          lru.erase(lru.oldest());
          ref.pop_back();
        }
        break;
      case 3: {  // every entry of one worker
        int64_t seen = 0;
        const int64_t n = lru.erase_worker(worker, [&](const WorkerLru<int>::Entry& e) {
          EXPECT_EQ(e.worker, worker);
          ++seen;
        });
        const auto gone = std::erase_if(ref, [worker](const Ref& e) { return e.worker == worker; });
        EXPECT_EQ(n, static_cast<int64_t>(gone));
        EXPECT_EQ(seen, n);
        break;
      }
      default:  // touch
        if (at != ref.end()) {
          lru.touch(it);
          Ref r = *at;
          ref.erase(at);
          ref.insert(ref.begin(), r);
        }
        break;
    }
    ASSERT_NO_FATAL_FAILURE(expect_same(lru, ref));
  }
}

TEST(WorkerLruTest, EmptyHasNoOldestAndKeysAreStoredOnce) {
  WorkerLru<int> lru;
  EXPECT_TRUE(lru.empty());
  EXPECT_EQ(lru.oldest(), lru.end());
  std::string key = "session";
  auto it = lru.insert(key, 1, 7);
  key[0] = 'X';  // the table holds its own copy
  EXPECT_EQ(lru.find("session"), it);
  EXPECT_EQ(lru.find("Xession"), lru.end());
  lru.set_worker(it, 1);  // the same worker: counts unchanged
  EXPECT_EQ(lru.count_on(1), 1);
}

}  // namespace
}  // namespace strata::router
