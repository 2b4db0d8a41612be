#include "storage/redis_connection.h"

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <string>
#include <vector>

#include "common/clock.h"
#include "testing/redis_test_server.h"

namespace strata::redis_connection_test {

using test_support::RedisTestServer;

TEST(RedisUrlTest, ReadsHostPortDatabaseAndPassword) {
  auto e = parse_redis_url("redis://10.0.0.7:6380/3");
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(e->host, "10.0.0.7");
  EXPECT_EQ(e->port, 6380);
  EXPECT_EQ(e->db, 3);
  EXPECT_EQ(e->password, "");

  e = parse_redis_url("redis://:s3cret@cache.internal");
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(e->host, "cache.internal");
  EXPECT_EQ(e->port, 6379);
  EXPECT_EQ(e->db, 0);
  EXPECT_EQ(e->password, "s3cret");

  e = parse_redis_url("redis://user:pw@h:1/");
  ASSERT_TRUE(e) << e.error().message;
  EXPECT_EQ(e->password, "pw");
  EXPECT_EQ(e->port, 1);
}

TEST(RedisUrlTest, RefusesWhatIsNotOne) {
  for (const char* bad :
       {"", "http://h:6379", "redis://", "redis://h:0", "redis://h:65536", "redis://h:port",
        "redis://h:6379/x", "redis://h:6379/-1", "redis://:pw@"}) {
    auto e = parse_redis_url(bad);
    ASSERT_FALSE(e) << bad;
    EXPECT_EQ(e.error().code, ErrorCode::kInvalidArgument) << bad;
    EXPECT_NE(e.error().message.find("redis://"), std::string::npos) << e.error().message;
  }
}

TEST(RedisConnectionTest, PipelinesAndBacksOffAfterAFailure) {
  RedisTestServer server;
  ASSERT_EQ(server.start(), "");
  ManualClock clock(1'000'000);
  RedisConnection conn(RedisEndpoint{.port = server.port(), .db = 2, .timeout_ms = 2000}, clock,
                       "test store");
  ASSERT_TRUE(conn.ensure_connected());
  const std::vector<std::vector<std::string>> commands{{"SET", "k", "v"}, {"GET", "k"}};
  std::vector<std::string> replies;
  ASSERT_TRUE(conn.round_trip(
      commands.size(), [&](redisContext* c, size_t i) { redis_append_argv(c, commands[i]); },
      [&](size_t, const redisReply& r) { replies.emplace_back(redis_reply_text(r)); }));
  EXPECT_EQ(replies, (std::vector<std::string>{"OK", "v"}));
  // SELECT 2 was sent: database 0 does not have the key.
  EXPECT_EQ(test_support::redis_command(server.port(), {"EXISTS", "k"}), "0");

  const int port = server.port();
  server.kill();
  const Status lost = conn.round_trip(
      1, [&](redisContext* c, size_t) { redis_append_argv(c, commands[1]); },
      [](size_t, const redisReply&) {});
  ASSERT_FALSE(lost);
  EXPECT_EQ(lost.error().code, ErrorCode::kIoError);
  EXPECT_NE(lost.error().message.find("test store: "), std::string::npos) << lost.error().message;
  EXPECT_FALSE(conn.connected());
  ASSERT_EQ(server.start(port), "");
  // Within the back-off: refused at once, without dialling.
  const Status early = conn.ensure_connected();
  ASSERT_FALSE(early);
  EXPECT_NE(early.error().message.find("waiting before reconnecting"), std::string::npos);
  clock.advance_ms(RedisConnection::kReconnectBackoffMs);
  EXPECT_TRUE(conn.ensure_connected());
}

TEST(RedisConnectionTest, AWrongPasswordIsRefusedAndDropped) {
  RedisTestServer server;
  ASSERT_EQ(server.start(0, {"--requirepass", "right"}), "");
  ManualClock clock(0);
  RedisConnection conn(RedisEndpoint{.port = server.port(), .password = "wrong"}, clock, "s");
  const Status s = conn.connect();
  ASSERT_FALSE(s);
  EXPECT_NE(s.error().message.find("refused AUTH"), std::string::npos) << s.error().message;
  EXPECT_FALSE(conn.connected());
}

}  // namespace strata::redis_connection_test
