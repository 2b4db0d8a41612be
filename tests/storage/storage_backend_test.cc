#include "storage/storage_backend.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace strata {
namespace {

std::vector<std::byte> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<std::byte> out(n);
  for (std::byte& b : out) b = static_cast<std::byte>(gen());
  return out;
}

constexpr uint64_t kKey = 0x0123456789abcdefULL;

class FramingTest : public ::testing::Test {
 protected:
  const uint64_t ns_ = storage_namespace_hash("model-a");
  const std::vector<std::byte> payload_ = random_bytes(4099, 1);
  const std::vector<std::byte> stored_ = frame_value(kKey, ns_, payload_);

  FrameCheck unframe(std::span<const std::byte> stored, size_t dst_bytes, uint64_t key = kKey) {
    dst_.assign(dst_bytes, std::byte{0});
    return unframe_value(stored, key, ns_, dst_);
  }
  std::vector<std::byte> dst_;
};

TEST_F(FramingTest, RoundTripGivesThePayloadBack) {
  ASSERT_EQ(stored_.size(), kFrameHeaderBytes + payload_.size());
  const FrameCheck check = unframe(stored_, payload_.size());
  ASSERT_TRUE(check.status) << check.status.error().message;
  EXPECT_EQ(dst_, payload_);
}

TEST_F(FramingTest, EmptyPayloadRoundTrips) {
  const std::vector<std::byte> stored = frame_value(kKey, ns_, {});
  EXPECT_TRUE(unframe(stored, 0).status);
}

TEST_F(FramingTest, EveryFlippedByteIsCorrupt) {
  // Every byte of the header and a sample of the payload: none may pass as ok.
  for (size_t i = 0; i < stored_.size(); i += (i < kFrameHeaderBytes ? 1 : 97)) {
    std::vector<std::byte> bad = stored_;
    bad[i] ^= std::byte{0x10};
    const FrameCheck check = unframe(bad, payload_.size());
    ASSERT_FALSE(check.status) << "flipped byte " << i;
    EXPECT_EQ(check.status.error().code, ErrorCode::kCorrupt);
    EXPECT_TRUE(check.damaged) << i;
  }
}

TEST_F(FramingTest, TruncatedOrExtendedValueIsCorrupt) {
  for (size_t size : {size_t{0}, size_t{10}, kFrameHeaderBytes, stored_.size() - 1}) {
    const FrameCheck check = unframe(std::span(stored_).first(size), payload_.size());
    ASSERT_FALSE(check.status) << size;
    EXPECT_EQ(check.status.error().code, ErrorCode::kCorrupt);
    EXPECT_TRUE(check.damaged);
  }
  std::vector<std::byte> longer = stored_;
  longer.push_back(std::byte{0});
  const FrameCheck check = unframe(longer, payload_.size());
  ASSERT_FALSE(check.status);
  EXPECT_TRUE(check.damaged);
}

TEST_F(FramingTest, ValueOfAnotherKeyOrNamespaceIsCorrupt) {
  FrameCheck check = unframe(stored_, payload_.size(), kKey + 1);
  ASSERT_FALSE(check.status);
  EXPECT_EQ(check.status.error().code, ErrorCode::kCorrupt);
  EXPECT_TRUE(check.damaged);

  const std::vector<std::byte> foreign =
      frame_value(kKey, storage_namespace_hash("model-b"), payload_);
  check = unframe(foreign, payload_.size());
  ASSERT_FALSE(check.status);
  EXPECT_EQ(check.status.error().code, ErrorCode::kCorrupt);
}

TEST_F(FramingTest, ValueOfAnotherPageFormatIsForeignNotDamaged) {
  const std::vector<std::byte> int8 = frame_value(kKey, ns_, payload_, 0x10004);
  dst_.assign(payload_.size(), std::byte{0});
  EXPECT_TRUE(unframe_value(int8, kKey, ns_, dst_, 0x10004).status);
  EXPECT_EQ(dst_, payload_);
  for (uint32_t other : {0u, 0x10003u, 0x10103u, 0x10005u}) {
    const FrameCheck check = unframe_value(int8, kKey, ns_, dst_, other);
    ASSERT_FALSE(check.status) << other;
    EXPECT_EQ(check.status.error().code, ErrorCode::kCorrupt);
    EXPECT_FALSE(check.damaged);
    EXPECT_TRUE(check.foreign_format);
  }
}

TEST_F(FramingTest, VersionOneFrameIsForeignNotDamaged) {
  // A 48-byte version 1 header (before page formats), then the payload.
  std::vector<std::byte> v1 = stored_;
  const uint16_t version = 1, header_bytes = 48;
  std::memcpy(v1.data() + 4, &version, 2);
  std::memcpy(v1.data() + 6, &header_bytes, 2);
  const FrameCheck check = unframe(v1, payload_.size());
  ASSERT_FALSE(check.status);
  EXPECT_FALSE(check.damaged);
  EXPECT_TRUE(check.foreign_format);
}

TEST_F(FramingTest, WrongBufferSizeIsCorruptButNotDamaged) {
  for (size_t size : {payload_.size() - 1, payload_.size() + 1}) {
    const FrameCheck check = unframe(stored_, size);
    ASSERT_FALSE(check.status) << size;
    EXPECT_EQ(check.status.error().code, ErrorCode::kCorrupt);
    EXPECT_FALSE(check.damaged);
  }
}

TEST(StorageKeyTest, HexIsSixteenLowercaseDigits) {
  EXPECT_EQ(storage_key_hex(0), "0000000000000000");
  EXPECT_EQ(storage_key_hex(0xABCDEF0123456789ULL), "abcdef0123456789");
}

TEST(StorageNamespaceTest, OnlySafeNamesPass) {
  EXPECT_TRUE(validate_storage_namespace("qwen3-0.6b_bf16"));
  for (const char* bad : {"", ".hidden", "a/b", "..", "a b", "a:b"}) {
    EXPECT_FALSE(validate_storage_namespace(bad)) << bad;
  }
  EXPECT_FALSE(validate_storage_namespace(std::string(129, 'a')));
  StorageConfig config;
  config.backend = "file";
  config.name_space = "../escape";
  auto backend = make_storage_backend(config);
  ASSERT_FALSE(backend);
  EXPECT_EQ(backend.error().code, ErrorCode::kInvalidArgument);
}

// ---- config parsing ----

TEST(StorageConfigTest, EmptyExtraConfigGivesDefaults) {
  auto config = parse_storage_config("file", "");
  ASSERT_TRUE(config) << config.error().message;
  EXPECT_EQ(config->backend, "file");
  EXPECT_EQ(config->dir, "./strata-kv-store");
  EXPECT_EQ(config->capacity_bytes, 0);
  EXPECT_EQ(config->prefetch_threshold, 256);
  EXPECT_DOUBLE_EQ(config->prefetch_timeout_base, 0.5);
  EXPECT_DOUBLE_EQ(config->prefetch_timeout_per_ki_token, 0.25);
}

TEST(StorageConfigTest, GoodJsonSetsEveryField) {
  auto file = parse_storage_config(
      "file", R"({"dir": "/tmp/kv", "capacity_bytes": 1073741824, "prefetch_threshold": 64,
                  "prefetch_timeout_base": 1, "prefetch_timeout_per_ki_token": 0.125})");
  ASSERT_TRUE(file) << file.error().message;
  EXPECT_EQ(file->dir, "/tmp/kv");
  EXPECT_EQ(file->capacity_bytes, int64_t{1} << 30);
  EXPECT_EQ(file->prefetch_threshold, 64);
  EXPECT_DOUBLE_EQ(file->prefetch_timeout_base, 1.0);
  EXPECT_DOUBLE_EQ(file->prefetch_timeout_per_ki_token, 0.125);

  auto redis =
      parse_storage_config("redis", R"({"host": "10.0.0.5", "port": 6380, "db": 2, "password": "pw",
                   "timeout_ms": 250})");
  ASSERT_TRUE(redis) << redis.error().message;
  EXPECT_EQ(redis->backend, "redis");
  EXPECT_EQ(redis->host, "10.0.0.5");
  EXPECT_EQ(redis->port, 6380);
  EXPECT_EQ(redis->db, 2);
  EXPECT_EQ(redis->password, "pw");
  EXPECT_EQ(redis->timeout_ms, 250);
}

TEST(StorageConfigTest, AtFileIsRead) {
  char path[] = "/tmp/strata-storage-config-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  std::ofstream(path) << R"({"port": 7000, "prefetch_threshold": 512})";
  auto config = parse_storage_config("redis", std::string("@") + path);
  ::unlink(path);
  ASSERT_TRUE(config) << config.error().message;
  EXPECT_EQ(config->port, 7000);
  EXPECT_EQ(config->prefetch_threshold, 512);

  auto missing = parse_storage_config("redis", "@/nonexistent/strata.json");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, ErrorCode::kIoError);
  EXPECT_NE(missing.error().message.find("/nonexistent/strata.json"), std::string::npos);
}

// The error is kInvalidArgument and its message contains `needle`.
void expect_invalid(std::string_view backend, std::string_view json, std::string_view needle) {
  auto config = parse_storage_config(backend, json);
  ASSERT_FALSE(config) << json;
  EXPECT_EQ(config.error().code, ErrorCode::kInvalidArgument) << json;
  EXPECT_NE(config.error().message.find(needle), std::string::npos)
      << "'" << config.error().message << "' should mention " << needle;
}

TEST(StorageConfigTest, UnknownKeyIsNamed) {
  expect_invalid("file", R"({"dir": "/tmp/x", "capacity": 5})", "'capacity'");
  expect_invalid("redis", R"({"hots": "x"})", "'hots'");
}

TEST(StorageConfigTest, WrongTypeIsNamed) {
  expect_invalid("redis", R"({"port": "6379"})", "'port'");
  expect_invalid("redis", R"({"port": 6379.5})", "'port'");
  expect_invalid("redis", R"({"password": 5})", "'password'");
  expect_invalid("file", R"({"capacity_bytes": true})", "'capacity_bytes'");
  expect_invalid("file", R"({"dir": null})", "'dir'");
  expect_invalid("file", R"({"prefetch_timeout_base": "1"})", "'prefetch_timeout_base'");
}

TEST(StorageConfigTest, OutOfRangeIsNamed) {
  expect_invalid("redis", R"({"port": 0})", "'port'");
  expect_invalid("redis", R"({"port": 70000})", "'port'");
  expect_invalid("redis", R"({"timeout_ms": 0})", "'timeout_ms'");
  expect_invalid("file", R"({"capacity_bytes": -1})", "'capacity_bytes'");
  expect_invalid("file", R"({"capacity_bytes": 18446744073709551615})", "'capacity_bytes'");
  expect_invalid("file", R"({"prefetch_timeout_per_ki_token": -0.5})",
                 "'prefetch_timeout_per_ki_token'");
  expect_invalid("file", R"({"dir": ""})", "'dir'");
}

TEST(StorageConfigTest, KeyOfTheOtherBackendIsRefused) {
  expect_invalid("file", R"({"host": "127.0.0.1"})", "'host'");
  expect_invalid("redis", R"({"dir": "/tmp"})", "'dir'");
}

TEST(StorageConfigTest, BadBackendAndBadJsonAreRefused) {
  expect_invalid("mooncake", "", "mooncake");
  expect_invalid("", "", "storage backend");
  expect_invalid("File", "", "File");
  expect_invalid("file", "{not json", "malformed JSON");
  expect_invalid("file", "[1, 2]", "JSON object");
}

}  // namespace
}  // namespace strata
