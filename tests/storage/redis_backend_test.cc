#include "storage/redis_backend.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "common/clock.h"
#include "testing/redis_test_server.h"

namespace strata::redis_backend_test {

using test_support::redis_command;
using test_support::RedisTestServer;

constexpr size_t kPageBytes = 5000;

std::vector<std::byte> page_bytes(uint64_t key, size_t n = kPageBytes) {
  std::mt19937_64 gen(key * 31 + 7);
  std::vector<std::byte> out(n);
  for (std::byte& b : out) b = static_cast<std::byte>(gen());
  return out;
}

struct Batch {
  std::vector<uint64_t> keys;
  std::vector<std::vector<std::byte>> values;
  std::vector<std::span<const std::byte>> views;

  explicit Batch(std::vector<uint64_t> k, size_t n = kPageBytes) : keys(std::move(k)) {
    for (uint64_t key : keys) values.push_back(page_bytes(key, n));
    for (const auto& v : values) views.emplace_back(v);
  }
};

struct ReadBuffers {
  std::vector<std::vector<std::byte>> bufs;
  std::vector<std::span<std::byte>> views;

  ReadBuffers(size_t count, size_t n = kPageBytes) : bufs(count, std::vector<std::byte>(n)) {
    for (auto& b : bufs) views.emplace_back(b);
  }
};

void expect_all_ok(const std::vector<Status>& results) {
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_TRUE(results[i]) << i << ": " << results[i].error().message;
  }
}

void expect_all(const std::vector<Status>& results, ErrorCode code) {
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_FALSE(results[i]) << i;
    EXPECT_EQ(results[i].error().code, code) << i << ": " << results[i].error().message;
  }
}

// How many SET commands the server has executed.
int64_t set_calls(int port) {
  const std::string info = redis_command(port, {"INFO", "commandstats"});
  const auto at = info.find("cmdstat_set:calls=");
  if (at == std::string::npos) return 0;
  return std::stoll(info.substr(at + std::string("cmdstat_set:calls=").size()));
}

class RedisBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string error = server_.start();
    ASSERT_EQ(error, "") << "cannot start redis-server";
    config_.backend = "redis";
    config_.name_space = "test-ns";
    config_.port = server_.port();
    config_.timeout_ms = 2000;
  }

  std::unique_ptr<RedisBackend> make(const StorageConfig& config) {
    auto backend = RedisBackend::create(config, clock_);
    EXPECT_TRUE(backend) << backend.error().message;
    return backend ? std::move(*backend) : nullptr;
  }
  std::unique_ptr<RedisBackend> make() { return make(config_); }

  RedisTestServer server_;
  StorageConfig config_;
  ManualClock clock_{1'000'000};
};

TEST_F(RedisBackendTest, BatchRoundTrip) {
  auto backend = make();
  ASSERT_TRUE(backend);
  const Batch batch({1, 2, 3, 0xfedcba9876543210ULL});
  expect_all_ok(backend->set(batch.keys, batch.views));
  EXPECT_EQ(backend->exists(batch.keys), std::vector<bool>(4, true));
  ReadBuffers read(4);
  expect_all_ok(backend->get(batch.keys, read.views));
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(read.bufs[i], batch.values[i]) << i;
  EXPECT_EQ(redis_command(server_.port(), {"EXISTS", "strata:test-ns:fedcba9876543210"}), "1");
  EXPECT_EQ(backend->redis_key(0xab), "strata:test-ns:00000000000000ab");

  const std::vector<uint64_t> missing = {4, 5};
  EXPECT_EQ(backend->exists(missing), std::vector<bool>(2, false));
  ReadBuffers miss(2);
  expect_all(backend->get(missing, miss.views), ErrorCode::kNotFound);

  const StorageStats stats = backend->stats();
  EXPECT_EQ(stats.set_written, 4u);
  EXPECT_EQ(stats.get_hits, 4u);
  EXPECT_EQ(stats.get_misses, 2u);
  EXPECT_EQ(stats.bytes_written, 4 * kPageBytes);
  EXPECT_EQ(stats.bytes_read, 4 * kPageBytes);
  EXPECT_EQ(stats.exists_calls, 2u);
  EXPECT_EQ(stats.get_errors + stats.set_errors + stats.exists_errors, 0u);
}

TEST_F(RedisBackendTest, LargeValuesRoundTrip) {
  auto backend = make();
  ASSERT_TRUE(backend);
  const size_t n = 2 << 20;
  const Batch batch({7, 8, 9}, n);
  expect_all_ok(backend->set(batch.keys, batch.views));
  ReadBuffers read(3, n);
  expect_all_ok(backend->get(batch.keys, read.views));
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(read.bufs[i], batch.values[i]);
}

TEST_F(RedisBackendTest, TwoInstancesShareAndOnlyMissingValuesAreWritten) {
  auto first = make();
  auto second = make();
  ASSERT_TRUE(first && second);
  const Batch batch({11, 12, 13});
  expect_all_ok(first->set(batch.keys, batch.views));

  EXPECT_EQ(second->exists(batch.keys), std::vector<bool>(3, true));
  ReadBuffers read(3);
  expect_all_ok(second->get(batch.keys, read.views));
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(read.bufs[i], batch.values[i]);

  // The second instance writes the same blocks plus one new: only the new one is sent.
  const int64_t sets_before = set_calls(server_.port());
  const Batch more({11, 12, 13, 14});
  expect_all_ok(second->set(more.keys, more.views));
  EXPECT_EQ(set_calls(server_.port()) - sets_before, 1);
  EXPECT_EQ(second->stats().set_skipped_existing, 3u);
  EXPECT_EQ(second->stats().set_written, 1u);

  // Another namespace sees none of it.
  StorageConfig other = config_;
  other.name_space = "other-model";
  auto third = make(other);
  ASSERT_TRUE(third);
  EXPECT_EQ(third->exists(more.keys), std::vector<bool>(4, false));
}

TEST_F(RedisBackendTest, ServerDeathGivesIoErrorsAndRestartRecovers) {
  auto backend = make();
  ASSERT_TRUE(backend);
  const Batch batch({21, 22, 23});
  expect_all_ok(backend->set(batch.keys, batch.views));

  const int port = server_.port();
  server_.kill();
  ReadBuffers read(3);
  expect_all(backend->get(batch.keys, read.views), ErrorCode::kIoError);
  EXPECT_EQ(backend->stats().get_errors, 3u);
  // During the back-off calls fail at once, without touching the network.
  expect_all(backend->set(batch.keys, batch.views), ErrorCode::kIoError);
  EXPECT_EQ(backend->stats().set_errors, 3u);
  EXPECT_EQ(backend->exists(batch.keys), std::vector<bool>(3, false));
  EXPECT_EQ(backend->stats().exists_errors, 3u);
  // After the back-off a reconnect is tried, and fails while the server is down.
  clock_.advance_ms(RedisBackend::kReconnectBackoffMs + 1);
  expect_all(backend->get(batch.keys, read.views), ErrorCode::kIoError);
  EXPECT_EQ(backend->stats().get_errors, 6u);

  ASSERT_EQ(server_.start(port), "") << "cannot restart redis-server on port " << port;
  // Still inside the back-off of the last failed connect.
  expect_all(backend->get(batch.keys, read.views), ErrorCode::kIoError);
  clock_.advance_ms(RedisBackend::kReconnectBackoffMs + 1);
  // The restarted server has no data (no persistence); writes and reads work again.
  expect_all(backend->get(batch.keys, read.views), ErrorCode::kNotFound);
  expect_all_ok(backend->set(batch.keys, batch.views));
  expect_all_ok(backend->get(batch.keys, read.views));
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(read.bufs[i], batch.values[i]);
}

TEST_F(RedisBackendTest, HungServerTimesOutWithIoErrors) {
  config_.timeout_ms = 300;
  auto backend = make();
  ASSERT_TRUE(backend);
  const Batch batch({61, 62});
  expect_all_ok(backend->set(batch.keys, batch.views));
  server_.pause();
  // The call returns (after about timeout_ms; the test only needs it to return).
  ReadBuffers read(2);
  expect_all(backend->get(batch.keys, read.views), ErrorCode::kIoError);
  EXPECT_EQ(backend->stats().get_errors, 2u);
  server_.resume();
  clock_.advance_ms(RedisBackend::kReconnectBackoffMs + 1);
  expect_all_ok(backend->get(batch.keys, read.views));
  EXPECT_EQ(read.bufs[1], batch.values[1]);
}

TEST_F(RedisBackendTest, UnreachableAtStartIsNotFatal) {
  StorageConfig config = config_;
  config.port = test_support::free_loopback_port();
  auto backend = make(config);
  ASSERT_TRUE(backend);
  const Batch batch({1});
  expect_all(backend->set(batch.keys, batch.views), ErrorCode::kIoError);
  EXPECT_EQ(backend->exists(batch.keys), std::vector<bool>{false});
}

class RedisCorruptTest : public RedisBackendTest {
 protected:
  void SetUp() override {
    RedisBackendTest::SetUp();
    if (HasFatalFailure()) return;
    backend_ = make();
    ASSERT_TRUE(backend_);
    expect_all_ok(backend_->set(batch_.keys, batch_.views));
    key_ = backend_->redis_key(batch_.keys[0]);
  }

  // Overwrites the value of key 0 with raw bytes, behind the backend's back.
  void overwrite(const std::vector<std::byte>& bytes) {
    const std::string raw(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    ASSERT_EQ(redis_command(server_.port(), {"SET", key_, raw}), "OK");
  }

  void expect_corrupt_and_deleted() {
    ReadBuffers read(1);
    const std::vector<Status> results = backend_->get(std::span(batch_.keys).first(1), read.views);
    ASSERT_FALSE(results[0]);
    EXPECT_EQ(results[0].error().code, ErrorCode::kCorrupt);
    EXPECT_EQ(backend_->stats().corrupt_values, 1u);
    // The damaged value is gone, so a set writes it again.
    EXPECT_EQ(redis_command(server_.port(), {"EXISTS", key_}), "0");
    expect_all_ok(backend_->set(std::span(batch_.keys).first(1), std::span(batch_.views).first(1)));
    expect_all_ok(backend_->get(std::span(batch_.keys).first(1), read.views));
    EXPECT_EQ(read.bufs[0], batch_.values[0]);
  }

  const Batch batch_{{31, 32}};
  std::unique_ptr<RedisBackend> backend_;
  std::string key_;
};

TEST_F(RedisCorruptTest, GarbageIsDetected) {
  overwrite(std::vector<std::byte>(kPageBytes + kFrameHeaderBytes, std::byte{'g'}));
  expect_corrupt_and_deleted();
}

TEST_F(RedisCorruptTest, TruncatedValueIsDetected) {
  const std::vector<std::byte> framed =
      frame_value(batch_.keys[0], storage_namespace_hash("test-ns"), batch_.values[0]);
  overwrite(std::vector<std::byte>(framed.begin(), framed.end() - 100));
  expect_corrupt_and_deleted();
}

TEST_F(RedisCorruptTest, FlippedPayloadByteIsDetected) {
  std::vector<std::byte> framed =
      frame_value(batch_.keys[0], storage_namespace_hash("test-ns"), batch_.values[0]);
  framed[kFrameHeaderBytes + 77] ^= std::byte{1};
  overwrite(framed);
  expect_corrupt_and_deleted();
}

TEST_F(RedisCorruptTest, AnotherNamespacesOrKeysValueIsDetected) {
  overwrite(frame_value(batch_.keys[0], storage_namespace_hash("other"), batch_.values[0]));
  expect_corrupt_and_deleted();
}

TEST_F(RedisCorruptTest, AnotherKeysValueIsDetected) {
  overwrite(frame_value(batch_.keys[1], storage_namespace_hash("test-ns"), batch_.values[1]));
  expect_corrupt_and_deleted();
}

TEST_F(RedisCorruptTest, WrongBufferSizeIsCorruptAndKeepsTheValue) {
  ReadBuffers read(1, kPageBytes + 1);
  const std::vector<Status> results = backend_->get(std::span(batch_.keys).first(1), read.views);
  ASSERT_FALSE(results[0]);
  EXPECT_EQ(results[0].error().code, ErrorCode::kCorrupt);
  EXPECT_EQ(redis_command(server_.port(), {"EXISTS", key_}), "1");
}

TEST_F(RedisBackendTest, PasswordAndDatabaseAreUsed) {
  server_.kill();
  ASSERT_EQ(server_.start(0, {"--requirepass", "s3cret"}), "");
  config_.port = server_.port();
  config_.password = "s3cret";
  config_.db = 3;
  auto backend = make();
  ASSERT_TRUE(backend);
  const Batch batch({41});
  expect_all_ok(backend->set(batch.keys, batch.views));
  ReadBuffers read(1);
  expect_all_ok(backend->get(batch.keys, read.views));
  EXPECT_EQ(read.bufs[0], batch.values[0]);

  config_.password = "wrong";
  auto refused = make();
  ASSERT_TRUE(refused);
  expect_all(refused->get(batch.keys, read.views), ErrorCode::kIoError);
}

TEST_F(RedisBackendTest, MakeStorageBackendGivesTheRedisBackend) {
  auto config = parse_storage_config(
      "redis", R"({"port": )" + std::to_string(server_.port()) + R"(, "timeout_ms": 500})");
  ASSERT_TRUE(config) << config.error().message;
  config->name_space = "ns1";
  auto backend = make_storage_backend(*config, clock_);
  ASSERT_TRUE(backend) << backend.error().message;
  EXPECT_EQ((*backend)->name(), "redis");
  const Batch batch({51});
  expect_all_ok((*backend)->set(batch.keys, batch.views));
  EXPECT_EQ(redis_command(server_.port(), {"EXISTS", "strata:ns1:0000000000000033"}), "1");
}

}  // namespace strata::redis_backend_test
