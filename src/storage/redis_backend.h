// The Redis storage backend: values in a real Redis server, so that several Strata
// instances pointed at one Redis share KV. A value is stored framed
// (storage_backend.h) under the key "strata:<name_space>:<16 hex digits of the key>".
//
// Batches. Each call pipelines its batch (redisAppendCommand for every item, then one
// redisGetReply per item): one round trip for exists and get; set makes one EXISTS
// round trip and then one SET ... NX round trip for only the values Redis lacks (NX
// settles a race with another instance; both count as skipped). Large set batches are cut
// into pipelines of at most kMaxPipelineBytes to bound the client's buffers.
//
// Faults. A failed connection or round trip answers kIoError for every item it left
// unanswered, counts it and logs at most once per few seconds. The connection is then
// dropped; a later call reconnects (connect timeout min(timeout_ms, 500 ms)), but not
// sooner than kReconnectBackoffMs after the last failure, so a dead server is not
// hammered and each call during the back-off fails at once. A Redis error reply fails
// only its item ("OOM ..." is kResourceExhausted). A value found damaged is deleted.
// Capacity is Redis's own business (maxmemory and its eviction policy).
//
// Threading. Thread-safe: one connection, and calls take turns on it (mutex_). SIGPIPE
// is blocked in the calling thread while it talks to Redis, so a server that went away
// cannot kill the process.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/result.h"
#include "storage/redis_connection.h"
#include "storage/storage_backend.h"

struct redisContext;
struct redisReply;

namespace strata {

class RedisBackend final : public StorageBackend {
 public:
  static constexpr int64_t kReconnectBackoffMs = RedisConnection::kReconnectBackoffMs;
  static constexpr size_t kMaxPipelineBytes = size_t{64} << 20;

  // Makes the backend and tries to connect once; an unreachable server is logged, not an
  // error (calls answer kIoError until it answers). kInvalidArgument for a bad config.
  // `clock` (reconnect back-off, log throttling) must outlive the backend.
  static Result<std::unique_ptr<RedisBackend>> create(const StorageConfig& config,
                                                      const Clock& clock);
  ~RedisBackend() override;

  RedisBackend(const RedisBackend&) = delete;
  RedisBackend& operator=(const RedisBackend&) = delete;

  std::string_view name() const override { return "redis"; }
  std::vector<bool> exists(std::span<const uint64_t> keys) override;
  std::vector<Status> get(std::span<const uint64_t> keys,
                          std::span<const std::span<std::byte>> dst) override;
  std::vector<Status> set(std::span<const uint64_t> keys,
                          std::span<const std::span<const std::byte>> values) override;
  StorageStats stats() const override { return counters_.snapshot(); }

  // The Redis key of a block: "strata:<name_space>:<16 hex digits>".
  std::string redis_key(uint64_t key) const;

 private:
  RedisBackend(const StorageConfig& config, const Clock& clock);

  void delete_keys(std::span<const uint64_t> keys);  // requires mutex_, best effort
  void frame_into_scratch(uint64_t key, std::span<const std::byte> value);  // requires mutex_
  void log_failure(const std::string& message);

  const StorageConfig config_;
  const Clock& clock_;
  const std::string key_prefix_;  // "strata:<name_space>:"
  const uint64_t namespace_hash_;
  const uint32_t page_format_;  // StorageConfig::page_format
  StorageCounters counters_;
  LogThrottle log_throttle_;

  std::mutex mutex_;                // one caller at a time on the connection
  RedisConnection conn_;            // GUARDED_BY(mutex_)
  std::vector<std::byte> scratch_;  // GUARDED_BY(mutex_), a framed value being sent
};

}  // namespace strata
