// Sticky session bindings (router/session_table.h): TTL across tool pauses, the LRU bound,
// counts per worker, and migration after repeated rejections in a sliding window.
#include "router/session_table.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>

namespace strata::router {
namespace {

constexpr int64_t kMinute = 60'000;

std::string sid(int i) {
  std::string s = "s";
  s += std::to_string(i);
  return s;
}

TEST(SessionTableTest, BindLookupAndMove) {
  SessionTable t;
  EXPECT_FALSE(t.lookup("a", 0));
  ASSERT_TRUE(t.bind("a", 3, 0));
  std::optional<SessionBinding> b = t.lookup("a", 10);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->worker, 3u);
  EXPECT_FALSE(b->migrate);
  EXPECT_EQ(b->last_used_ms, 10);
  ASSERT_TRUE(t.bind("a", 5, 20));
  EXPECT_EQ(t.lookup("a", 30)->worker, 5u);
  EXPECT_EQ(t.sessions_on(3, 30), 0);
  EXPECT_EQ(t.sessions_on(5, 30), 1);
  EXPECT_EQ(t.stats().moves, 1u);
  EXPECT_EQ(t.size(), 1);
}

TEST(SessionTableTest, BadIdsAreRefused) {
  SessionTable t;
  EXPECT_EQ(t.bind("", 0, 0).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(t.bind(std::string(257, 'x'), 0, 0).error().code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(t.bind(std::string(256, 'x'), 0, 0));
  EXPECT_EQ(t.size(), 1);
}

TEST(SessionTableTest, TheTtlIsRefreshedByRequestsAndToolCallsAndSurvivesAToolPause) {
  SessionTable t(SessionTableOptions{.ttl_ms = 10 * kMinute});
  ASSERT_TRUE(t.bind("agent", 1, 0));
  // A tool runs for 8 minutes, then the agent resumes: still bound.
  EXPECT_TRUE(t.touch("agent", 8 * kMinute));  // tool_end
  ASSERT_TRUE(t.lookup("agent", 8 * kMinute + 100));
  // Each refresh restarts the TTL: 9 more minutes is fine.
  EXPECT_TRUE(t.peek("agent", 17 * kMinute));
  EXPECT_EQ(t.peek("agent", 17 * kMinute)->last_used_ms, 8 * kMinute + 100);  // peek: no refresh
  // 10 minutes without a request: gone.
  EXPECT_FALSE(t.lookup("agent", 18 * kMinute + 100));
  EXPECT_FALSE(t.touch("agent", 18 * kMinute + 100));
  EXPECT_EQ(t.size(), 0);
  EXPECT_EQ(t.sessions_on(1, 18 * kMinute + 100), 0);
  EXPECT_EQ(t.stats().expirations, 1u);
}

TEST(SessionTableTest, ExpiredBindingsLeaveTheCountsPerWorker) {
  SessionTable t(SessionTableOptions{.ttl_ms = 1000});
  ASSERT_TRUE(t.bind("a", 0, 0));
  ASSERT_TRUE(t.bind("b", 0, 500));
  ASSERT_TRUE(t.bind("c", 1, 600));
  EXPECT_EQ(t.sessions_on(0, 900), 2);
  EXPECT_EQ(t.sessions_on(0, 1000), 1);  // "a" expired
  using Counts = std::vector<std::pair<uint32_t, int64_t>>;
  EXPECT_EQ(t.sessions_per_worker(1000), (Counts{{0, 1}, {1, 1}}));
  EXPECT_EQ(t.expire(1600), 2);
  EXPECT_TRUE(t.sessions_per_worker(1600).empty());
}

TEST(SessionTableTest, TheLeastRecentlyUsedIsDroppedBeyondTheBound) {
  SessionTable t(SessionTableOptions{.max_sessions = 3});
  ASSERT_TRUE(t.bind("a", 0, 0));
  ASSERT_TRUE(t.bind("b", 1, 1));
  ASSERT_TRUE(t.bind("c", 2, 2));
  ASSERT_TRUE(t.lookup("a", 3));  // "b" is now the least recently used
  ASSERT_TRUE(t.bind("d", 0, 4));
  EXPECT_EQ(t.size(), 3);
  EXPECT_FALSE(t.peek("b", 5));
  EXPECT_TRUE(t.peek("a", 5));
  EXPECT_TRUE(t.peek("c", 5));
  EXPECT_TRUE(t.peek("d", 5));
  EXPECT_EQ(t.sessions_on(1, 5), 0);
  EXPECT_EQ(t.sessions_on(0, 5), 2);
  EXPECT_EQ(t.stats().lru_drops, 1u);
}

TEST(SessionTableTest, UnbindWorkerDropsItsBindings) {
  SessionTable t;
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(t.bind(sid(i), i % 3, i));
  EXPECT_EQ(t.unbind_worker(1), 3);
  EXPECT_EQ(t.sessions_on(1, 20), 0);
  EXPECT_EQ(t.size(), 7);
  EXPECT_FALSE(t.peek("s1", 20));
  EXPECT_TRUE(t.peek("s0", 20));
  EXPECT_TRUE(t.unbind("s0"));
  EXPECT_FALSE(t.unbind("s0"));
  EXPECT_EQ(t.size(), 6);
}

TEST(SessionTableTest, RepeatedRejectionsByTheBoundWorkerMoveTheSession) {
  SessionTable t;  // 2 rejections within 30 s
  ASSERT_TRUE(t.bind("a", 4, 0));
  EXPECT_FALSE(t.record_rejection("a", 4, 1'000));  // one: only that request moves
  EXPECT_FALSE(t.should_migrate("a", 1'000));
  EXPECT_FALSE(t.lookup("a", 1'500)->migrate);
  // A rejection by another worker (the retry's) does not count against the binding.
  EXPECT_FALSE(t.record_rejection("a", 2, 2'000));
  EXPECT_TRUE(t.record_rejection("a", 4, 5'000));
  EXPECT_TRUE(t.should_migrate("a", 5'000));
  std::optional<SessionBinding> b = t.lookup("a", 6'000);
  ASSERT_TRUE(b);
  EXPECT_TRUE(b->migrate);
  EXPECT_EQ(b->rejections, 2);
  EXPECT_EQ(t.stats().migrations, 1u);
  // The router chose another worker without the sticky bonus and binds the session there.
  ASSERT_TRUE(t.bind("a", 1, 6'000));
  b = t.lookup("a", 6'001);
  EXPECT_FALSE(b->migrate);
  EXPECT_EQ(b->rejections, 0);
  EXPECT_EQ(b->worker, 1u);
  // Unknown sessions: nothing to count.
  EXPECT_FALSE(t.record_rejection("nobody", 4, 7'000));
}

TEST(SessionTableTest, RejectionsDecayOutOfTheWindow) {
  SessionTable t(SessionTableOptions{.rejection_window_ms = 30'000, .migrate_after_rejections = 3});
  ASSERT_TRUE(t.bind("a", 0, 0));
  EXPECT_FALSE(t.record_rejection("a", 0, 0));
  EXPECT_FALSE(t.record_rejection("a", 0, 20'000));
  // The first left the window: still two, not three.
  EXPECT_FALSE(t.record_rejection("a", 0, 31'000));
  EXPECT_EQ(t.peek("a", 31'000)->rejections, 2);
  EXPECT_TRUE(t.record_rejection("a", 0, 32'000));
  EXPECT_TRUE(t.should_migrate("a", 32'000));
  // Without more rejections the mark fades: the worker recovered before the next turn.
  EXPECT_TRUE(t.should_migrate("a", 49'999));
  EXPECT_FALSE(t.should_migrate("a", 50'000));
  EXPECT_EQ(t.peek("a", 62'000)->rejections, 0);
}

// Random operations against a simple reference model (a map with last-use times).
TEST(SessionTableTest, MatchesAReferenceModel) {
  constexpr int64_t kTtl = 100;
  constexpr int64_t kMax = 8;
  SessionTable t(SessionTableOptions{.ttl_ms = kTtl, .max_sessions = kMax});
  struct Ref {
    uint32_t worker;
    int64_t last_used;
  };
  std::map<std::string, Ref> ref;
  std::mt19937_64 rng(5);
  int64_t now = 0;
  auto drop_expired = [&] {
    std::erase_if(ref, [&](const auto& kv) { return now - kv.second.last_used >= kTtl; });
  };
  for (int step = 0; step < 20'000; ++step) {
    now += 1 + static_cast<int64_t>(rng() % 7);  // distinct times: one LRU order
    const std::string s = sid(static_cast<int>(rng() % 20));
    const uint32_t w = static_cast<uint32_t>(rng() % 4);
    switch (rng() % 4) {
      case 0: {
        ASSERT_TRUE(t.bind(s, w, now));
        drop_expired();
        if (!ref.contains(s) && static_cast<int64_t>(ref.size()) >= kMax) {
          auto lru =
              std::ranges::min_element(ref, {}, [](const auto& kv) { return kv.second.last_used; });
          ref.erase(lru);
        }
        ref[s] = Ref{w, now};
        break;
      }
      case 1:
      case 2: {
        const std::optional<SessionBinding> b = t.lookup(s, now);
        auto it = ref.find(s);
        const bool live = it != ref.end() && now - it->second.last_used < kTtl;
        ASSERT_EQ(b.has_value(), live) << s << " at " << now;
        if (live) {
          EXPECT_EQ(b->worker, it->second.worker);
          it->second.last_used = now;
        }
        break;
      }
      case 3: {
        drop_expired();
        int64_t expected = 0;
        for (const auto& [name, r] : ref) expected += r.worker == w ? 1 : 0;
        ASSERT_EQ(t.sessions_on(w, now), expected) << "worker " << w << " at " << now;
        ASSERT_EQ(t.size(), static_cast<int64_t>(ref.size()));
        break;
      }
    }
  }
}

}  // namespace
}  // namespace strata::router
