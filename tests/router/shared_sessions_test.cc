#include "router/shared_sessions.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "common/clock.h"
#include "testing/redis_test_server.h"

namespace strata::router {
namespace {

using test_support::redis_command;
using test_support::RedisTestServer;

class SharedSessionsTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(server_.start(), ""); }

  SharedSessionOptions options() const {
    return SharedSessionOptions{.url = "redis://127.0.0.1:" + std::to_string(server_.port()),
                                .name_space = "cluster-a",
                                .timeout_ms = 2000};
  }
  std::unique_ptr<SharedSessions> make(int64_t ttl_ms = 600'000) {
    auto s = SharedSessions::create(options(), ttl_ms, clock_);
    EXPECT_TRUE(s) << s.error().message;
    return s ? std::move(*s) : nullptr;
  }

  RedisTestServer server_;
  ManualClock clock_{1'000'000};
};

TEST_F(SharedSessionsTest, ABindingIsSeenByAnotherReplica) {
  auto a = make();
  auto b = make();
  ASSERT_TRUE(a && b);
  auto none = b->lookup("conv-1");
  ASSERT_TRUE(none) << none.error().message;
  EXPECT_FALSE(none->has_value());

  auto bound = a->bind("conv-1", "http://127.0.0.1:9001", true);
  ASSERT_TRUE(bound) << bound.error().message;
  EXPECT_EQ(*bound, "http://127.0.0.1:9001");
  auto seen = b->lookup("conv-1");
  ASSERT_TRUE(seen && seen->has_value());
  EXPECT_EQ(**seen, "http://127.0.0.1:9001");
  EXPECT_EQ(redis_command(server_.port(), {"GET", "strata:router:cluster-a:session:conv-1"}),
            "http://127.0.0.1:9001");
  EXPECT_EQ(a->key("x"), "strata:router:cluster-a:session:x");
  EXPECT_EQ(b->stats().lookups, 2u);
  EXPECT_EQ(b->stats().found, 1u);
  EXPECT_EQ(a->stats().binds, 1u);
}

TEST_F(SharedSessionsTest, TwoReplicasBindingANewSessionAtOnceFollowTheFirst) {
  auto a = make();
  auto b = make();
  ASSERT_TRUE(a && b);
  ASSERT_EQ(*a->bind("s", "http://w1", true), "http://w1");
  // b chose another worker for the same new session: the first binding holds.
  auto holds = b->bind("s", "http://w2", true);
  ASSERT_TRUE(holds);
  EXPECT_EQ(*holds, "http://w1");
  EXPECT_EQ(b->stats().races_lost, 1u);
  EXPECT_EQ(**a->lookup("s"), "http://w1");
  // A move (not only_if_absent) overwrites.
  ASSERT_EQ(*b->bind("s", "http://w2", false), "http://w2");
  EXPECT_EQ(**a->lookup("s"), "http://w2");
  EXPECT_EQ(a->stats().races_lost, 0u);
}

TEST_F(SharedSessionsTest, LookupsRefreshTheTtlAndIdleBindingsExpire) {
  auto a = make(/*ttl_ms=*/600);
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->bind("s", "http://w1", true));
  const int64_t ttl =
      std::stoll(redis_command(server_.port(), {"PTTL", "strata:router:cluster-a:session:s"}));
  EXPECT_GT(ttl, 0);
  EXPECT_LE(ttl, 600);
  // Refreshed well inside the TTL, five times over more than the TTL in all: still bound.
  for (int i = 0; i < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto seen = a->lookup("s");
    ASSERT_TRUE(seen && seen->has_value()) << i;
  }
  // Left idle past the TTL: gone (Redis expires it; polled so a slow machine cannot fail it).
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    gone = redis_command(server_.port(), {"EXISTS", "strata:router:cluster-a:session:s"}) == "0";
  }
  EXPECT_TRUE(gone);
  auto seen = a->lookup("s");
  ASSERT_TRUE(seen);
  EXPECT_FALSE(seen->has_value());
}

TEST_F(SharedSessionsTest, ADeadStoreFailsFastAndIsUsedAgainWhenBack) {
  auto a = make();
  ASSERT_TRUE(a);
  ASSERT_TRUE(a->bind("s", "http://w1", true));
  const int port = server_.port();
  server_.kill();
  auto lost = a->lookup("s");
  ASSERT_FALSE(lost);
  EXPECT_EQ(lost.error().code, ErrorCode::kIoError);
  EXPECT_NE(lost.error().message.find("session store"), std::string::npos);
  EXPECT_FALSE(a->bind("t", "http://w1", true));
  EXPECT_EQ(a->stats().errors, 2u);
  ASSERT_EQ(server_.start(port), "");
  clock_.advance_ms(RedisConnection::kReconnectBackoffMs);
  auto back = a->lookup("s");
  ASSERT_TRUE(back) << back.error().message;
  EXPECT_FALSE(back->has_value());  // a restarted Redis without persistence lost it
  ASSERT_TRUE(a->bind("s", "http://w2", true));
  EXPECT_EQ(**a->lookup("s"), "http://w2");
}

TEST_F(SharedSessionsTest, AWrongTypedKeyIsAnErrorNotABinding) {
  auto a = make();
  ASSERT_TRUE(a);
  ASSERT_EQ(redis_command(server_.port(), {"LPUSH", "strata:router:cluster-a:session:s", "x"}),
            "1");
  auto r = a->lookup("s");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kIoError);
}

TEST(SharedSessionOptionsTest, BadOptionsAreRefusedNamingTheFlag) {
  EXPECT_TRUE(validate(SharedSessionOptions{}));  // no store: nothing to check
  auto expect_bad = [](SharedSessionOptions o, const std::string& flag) {
    const Status s = validate(o);
    ASSERT_FALSE(s) << flag;
    EXPECT_EQ(s.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(s.error().message.find(flag), std::string::npos) << s.error().message;
  };
  expect_bad({.url = "http://x:6379"}, "--session-store");
  expect_bad({.url = "redis://x:6379", .name_space = ""}, "--session-store-namespace");
  expect_bad({.url = "redis://x:6379", .name_space = "a b"}, "--session-store-namespace");
  expect_bad({.url = "redis://x:6379", .timeout_ms = 0}, "--session-store-timeout-ms");
}

TEST(SharedSessionOptionsTest, AnUnreachableStoreIsNoErrorAtStart) {
  ManualClock clock(0);
  const int port = test_support::free_loopback_port();
  auto s = SharedSessions::create(
      {.url = "redis://127.0.0.1:" + std::to_string(port), .timeout_ms = 200}, 1000, clock);
  ASSERT_TRUE(s) << s.error().message;
  EXPECT_FALSE((*s)->lookup("x"));
}

}  // namespace
}  // namespace strata::router
