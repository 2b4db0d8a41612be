#include "storage/redis_backend.h"

#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/check.h"
#include "common/log.h"

namespace strata {

namespace {

Status io_error(const std::string& message) {
  return make_error(ErrorCode::kIoError, message);
}

// A Redis error reply for one item: out of memory is the store being full.
Status error_reply(const redisReply& r) {
  const std::string text(redis_reply_text(r));
  const ErrorCode code =
      text.starts_with("OOM") ? ErrorCode::kResourceExhausted : ErrorCode::kIoError;
  return make_error(code, "redis storage: " + text);
}

}  // namespace

RedisBackend::RedisBackend(const StorageConfig& config, const Clock& clock)
    : config_(config),
      clock_(clock),
      key_prefix_("strata:" + config.name_space + ":"),
      namespace_hash_(storage_namespace_hash(config.name_space)),
      page_format_(config.page_format),
      log_throttle_(clock),
      conn_(RedisEndpoint{.host = config.host,
                          .port = config.port,
                          .db = config.db,
                          .password = config.password,
                          .timeout_ms = config.timeout_ms},
            clock, "redis storage") {}

RedisBackend::~RedisBackend() = default;

Result<std::unique_ptr<RedisBackend>> RedisBackend::create(const StorageConfig& config,
                                                           const Clock& clock) {
  if (auto s = validate_storage_namespace(config.name_space); !s) {
    return std::unexpected(s.error());
  }
  if (auto s = validate(RedisEndpoint{.host = config.host,
                                      .port = config.port,
                                      .db = config.db,
                                      .timeout_ms = config.timeout_ms},
                        "redis storage");
      !s) {
    return std::unexpected(s.error());
  }
  std::unique_ptr<RedisBackend> backend(new RedisBackend(config, clock));
  Status connected;
  {
    std::lock_guard lock(backend->mutex_);
    connected = backend->conn_.connect();
  }
  if (connected) {
    STRATA_LOG_INFO("redis storage: connected to {}:{} db {}, keys {}*", config.host, config.port,
                    config.db, backend->key_prefix_);
  } else {
    STRATA_LOG_WARN("{}; storage calls fail until it answers", connected.error().message);
  }
  return backend;
}

std::string RedisBackend::redis_key(uint64_t key) const {
  return key_prefix_ + storage_key_hex(key);
}

std::vector<bool> RedisBackend::exists(std::span<const uint64_t> keys) {
  StorageCounters::add(counters_.exists_calls);
  if (keys.empty()) return {};
  std::vector<bool> found(keys.size(), false);
  std::vector<bool> answered(keys.size(), false);
  std::lock_guard lock(mutex_);
  Status s = conn_.ensure_connected();
  if (s) {
    s = conn_.round_trip(
        keys.size(),
        [&](redisContext* ctx, size_t i) {
          const std::string k = redis_key(keys[i]);
          redisAppendCommand(ctx, "EXISTS %b", k.data(), k.size());
        },
        [&](size_t i, const redisReply& r) {
          if (r.type != REDIS_REPLY_INTEGER) return;
          found[i] = r.integer > 0;
          answered[i] = true;
        });
  }
  const auto failed = static_cast<uint64_t>(std::count(answered.begin(), answered.end(), false));
  if (failed > 0) {
    StorageCounters::add(counters_.exists_errors, failed);
    if (!s) log_failure(s.error().message);
  }
  return found;
}

std::vector<Status> RedisBackend::get(std::span<const uint64_t> keys,
                                      std::span<const std::span<std::byte>> dst) {
  STRATA_CHECK_MSG(keys.size() == dst.size(), "get: one buffer per key");
  if (keys.empty()) return {};
  std::vector<Status> results(keys.size());
  std::vector<bool> answered(keys.size(), false);
  std::vector<uint64_t> damaged;
  std::lock_guard lock(mutex_);
  Status s = conn_.ensure_connected();
  if (s) {
    s = conn_.round_trip(
        keys.size(),
        [&](redisContext* ctx, size_t i) {
          const std::string k = redis_key(keys[i]);
          redisAppendCommand(ctx, "GET %b", k.data(), k.size());
        },
        [&](size_t i, const redisReply& r) {
          answered[i] = true;
          if (r.type == REDIS_REPLY_NIL) {
            StorageCounters::add(counters_.get_misses);
            results[i] = make_error(ErrorCode::kNotFound, "no stored value " + redis_key(keys[i]));
          } else if (r.type == REDIS_REPLY_ERROR) {
            StorageCounters::add(counters_.get_errors);
            results[i] = error_reply(r);
          } else if (r.type != REDIS_REPLY_STRING) {
            StorageCounters::add(counters_.corrupt_values);
            results[i] = make_error(ErrorCode::kCorrupt, "redis value is not a string");
          } else {
            const auto stored = std::as_bytes(std::span<const char>(r.str, r.len));
            FrameCheck check =
                unframe_value(stored, keys[i], namespace_hash_, dst[i], page_format_);
            if (check.status) {
              StorageCounters::add(counters_.get_hits);
              StorageCounters::add(counters_.bytes_read, dst[i].size());
            } else {
              StorageCounters::add(check.foreign_format ? counters_.foreign_format_values
                                                        : counters_.corrupt_values);
              log_failure("redis storage: " + redis_key(keys[i]) + ": " +
                          check.status.error().message);
              if (check.damaged) damaged.push_back(keys[i]);
            }
            results[i] = std::move(check.status);
          }
        });
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    if (answered[i]) continue;
    StorageCounters::add(counters_.get_errors);
    results[i] = std::unexpected(s.error());
  }
  if (!s) log_failure(s.error().message);
  if (!damaged.empty() && conn_.connected()) delete_keys(damaged);
  return results;
}

std::vector<Status> RedisBackend::set(std::span<const uint64_t> keys,
                                      std::span<const std::span<const std::byte>> values) {
  STRATA_CHECK_MSG(keys.size() == values.size(), "set: one value per key");
  if (keys.empty()) return {};
  std::vector<Status> results(keys.size());
  std::vector<bool> answered(keys.size(), false);
  std::vector<size_t> missing;  // items Redis lacks, in order
  std::lock_guard lock(mutex_);
  Status s = conn_.ensure_connected();
  // Only values Redis lacks travel: ask first, then send those with NX, which also
  // settles a race with another instance writing the same block meanwhile.
  if (s) {
    s = conn_.round_trip(
        keys.size(),
        [&](redisContext* ctx, size_t i) {
          const std::string k = redis_key(keys[i]);
          redisAppendCommand(ctx, "EXISTS %b", k.data(), k.size());
        },
        [&](size_t i, const redisReply& r) {
          if (r.type != REDIS_REPLY_INTEGER) return;  // left unanswered: an error below
          if (r.integer > 0) {
            answered[i] = true;
            StorageCounters::add(counters_.set_skipped_existing);
          } else {
            missing.push_back(i);
          }
        });
  }
  for (size_t begin = 0; s && begin < missing.size();) {
    size_t end = begin;
    size_t bytes = 0;
    while (end < missing.size() &&
           (end == begin || bytes + values[missing[end]].size() <= kMaxPipelineBytes)) {
      bytes += values[missing[end]].size();
      ++end;
    }
    s = conn_.round_trip(
        end - begin,
        [&](redisContext* ctx, size_t j) {
          const size_t i = missing[begin + j];
          const std::string k = redis_key(keys[i]);
          frame_into_scratch(keys[i], values[i]);
          redisAppendCommand(ctx, "SET %b %b NX", k.data(), k.size(), scratch_.data(),
                             scratch_.size());
        },
        [&](size_t j, const redisReply& r) {
          const size_t i = missing[begin + j];
          answered[i] = true;
          if (r.type == REDIS_REPLY_STATUS) {
            StorageCounters::add(counters_.set_written);
            StorageCounters::add(counters_.bytes_written, values[i].size());
          } else if (r.type == REDIS_REPLY_NIL) {
            StorageCounters::add(counters_.set_skipped_existing);
          } else {
            StorageCounters::add(counters_.set_errors);
            results[i] = r.type == REDIS_REPLY_ERROR
                             ? error_reply(r)
                             : make_error(ErrorCode::kIoError, "redis: unexpected SET reply");
            log_failure(results[i].error().message);
          }
        });
    begin = end;
  }
  scratch_.clear();
  for (size_t i = 0; i < keys.size(); ++i) {
    if (answered[i]) continue;
    StorageCounters::add(counters_.set_errors);
    results[i] =
        s ? io_error("redis storage: unexpected EXISTS reply") : Status(std::unexpected(s.error()));
  }
  if (!s) log_failure(s.error().message);
  return results;
}

void RedisBackend::frame_into_scratch(uint64_t key, std::span<const std::byte> value) {
  scratch_.resize(kFrameHeaderBytes + value.size());
  encode_frame_header(key, namespace_hash_, value,
                      std::span<std::byte, kFrameHeaderBytes>(scratch_.data(), kFrameHeaderBytes),
                      page_format_);
  if (!value.empty()) std::memcpy(scratch_.data() + kFrameHeaderBytes, value.data(), value.size());
}

void RedisBackend::delete_keys(std::span<const uint64_t> keys) {
  // Best effort: after a failure the value is found damaged again on a later read.
  const Status s = conn_.round_trip(
      keys.size(),
      [&](redisContext* ctx, size_t i) {
        const std::string k = redis_key(keys[i]);
        redisAppendCommand(ctx, "DEL %b", k.data(), k.size());
      },
      [](size_t, const redisReply&) {});
  if (!s) log_failure(s.error().message);
}

void RedisBackend::log_failure(const std::string& message) {
  uint64_t suppressed = 0;
  if (log_throttle_.allow(suppressed)) {
    STRATA_LOG_WARN("{} ({} similar failures not logged)", message, suppressed);
  }
}

}  // namespace strata
