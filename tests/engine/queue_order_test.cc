// The admission order: classes, priorities, arrival, and aging (engine/queue_order.h),
// driven by a fake clock (plain numbers).
#include "engine/queue_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <random>
#include <vector>

namespace strata {
namespace {

constexpr int64_t kAging = 100;  // ms per priority point

QueueKey key(SchedClass c, int32_t priority, int64_t arrival, uint64_t id) {
  return QueueKey{c, priority, arrival, id};
}

TEST(QueueOrderTest, LowerPriorityValuesGoFirstAndTiesByArrival) {
  const QueueKey a = key(SchedClass::kNormal, 0, 0, 1);
  const QueueKey b = key(SchedClass::kNormal, -10, 0, 2);
  const QueueKey c = key(SchedClass::kNormal, 0, 0, 3);
  EXPECT_TRUE(goes_before(b, a, 0, kAging));
  EXPECT_TRUE(goes_before(a, c, 0, kAging));
  EXPECT_FALSE(goes_before(c, a, 0, kAging));
  EXPECT_FALSE(goes_before(a, a, 0, kAging));
}

TEST(QueueOrderTest, AResumedSessionGoesBeforeVipAndVipBeforeNormal) {
  const int64_t now = 1'000;
  // A class is worth a full priority range: the worst of a class ties with the best of
  // the next (then arrival decides), anything better goes first.
  const QueueKey resume = key(SchedClass::kResume, 99, now, 3);
  const QueueKey vip = key(SchedClass::kVip, 0, now, 2);
  const QueueKey normal = key(SchedClass::kNormal, -100, now, 1);  // the best priority
  EXPECT_TRUE(goes_before(resume, vip, now, kAging));
  EXPECT_TRUE(goes_before(vip, normal, now, kAging));
  EXPECT_TRUE(goes_before(normal, key(SchedClass::kVip, 100, now, 4), now, kAging));
}

TEST(QueueOrderTest, AnEarlierArrivalOfTheSamePriorityGoesFirst) {
  EXPECT_TRUE(goes_before(key(SchedClass::kNormal, 5, 100, 9), key(SchedClass::kNormal, 5, 200, 1),
                          300, kAging));
}

TEST(QueueOrderTest, AgingLetsAWaitingRequestOvertakeBetterOnes) {
  const QueueKey old_low = key(SchedClass::kNormal, 100, 0, 1);
  // A fresh request of the best priority arriving at time t goes first until the old one
  // has waited 200 points' worth: 20 s at 100 ms per point.
  EXPECT_TRUE(goes_before(key(SchedClass::kNormal, -100, 19'000, 2), old_low, 19'000, kAging));
  EXPECT_TRUE(goes_before(old_low, key(SchedClass::kNormal, -100, 20'100, 3), 20'100, kAging));
  // Each class is worth two more full ranges (normal to resume: 400 points, 40 s).
  EXPECT_TRUE(goes_before(key(SchedClass::kResume, -100, 59'900, 4), old_low, 59'900, kAging));
  EXPECT_TRUE(goes_before(old_low, key(SchedClass::kResume, -100, 60'100, 5), 60'100, kAging));
}

// A simulated queue: each tick admits the first request in order, and a flood of the
// best priority and class arrives all the while. Every request is admitted within the
// bound that aging promises (no starvation), and without a flood the order is exactly by
// priority.
TEST(QueueOrderTest, NoRequestStarvesUnderAFloodOfBetterOnes) {
  std::mt19937 rng(11);
  std::deque<QueueKey> queue;
  uint64_t next_id = 1;
  int64_t now = 0;
  const int64_t tick = 10;  // one admission every 10 ms
  for (int i = 0; i < 50; ++i) {
    queue.push_back(
        key(SchedClass::kNormal, static_cast<int32_t>(rng() % 201) - 100, now, next_id++));
  }
  std::vector<int64_t> waited;
  for (int step = 0; step < 20'000 && waited.size() < 50; ++step) {
    now += tick;
    // Two better requests arrive per admission: the queue grows without bound.
    for (int k = 0; k < 2; ++k) queue.push_back(key(SchedClass::kResume, -100, now, next_id++));
    auto best = std::min_element(queue.begin(), queue.end(), [&](const auto& a, const auto& b) {
      return goes_before(a, b, now, kAging);
    });
    if (best->id <= 50) waited.push_back(now - best->arrival_ms);
    queue.erase(best);
  }
  ASSERT_EQ(waited.size(), 50u) << "a request starved";
  // The bound: a normal request of the worst priority is 600 points behind a fresh
  // resume of the best (400 for the class, 200 for the priority). The flood ages too
  // (its oldest has waited half as long, as it grows by one a tick), so the normal
  // request goes after at most twice 600 points' worth, plus one tick per request ahead.
  for (int64_t w : waited) EXPECT_LE(w, 2 * 600 * kAging + 51 * tick);
}

TEST(QueueOrderTest, WithoutAFloodTheOrderIsByPriority) {
  std::vector<QueueKey> keys;
  std::mt19937 rng(3);
  for (uint64_t i = 1; i <= 100; ++i) {
    keys.push_back(key(SchedClass::kNormal, static_cast<int32_t>(rng() % 201) - 100, 0, i));
  }
  std::sort(keys.begin(), keys.end(),
            [](const auto& a, const auto& b) { return goes_before(a, b, 0, kAging); });
  for (size_t i = 1; i < keys.size(); ++i) {
    EXPECT_TRUE(keys[i - 1].priority < keys[i].priority ||
                (keys[i - 1].priority == keys[i].priority && keys[i - 1].id < keys[i].id));
  }
}

}  // namespace
}  // namespace strata
