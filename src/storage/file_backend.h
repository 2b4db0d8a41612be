// The file storage backend: one file per value under
//
//   <dir>/<name_space>/<first 2 hex digits of the key>/<16 hex digits of the key>
//
// each holding a framed value (storage_backend.h). Writes are atomic: the value goes to a
// temp file in the same directory (".tmp.<key>.<pid>.<n>", a name no value can have),
// which is then renamed over the final name, so a reader sees a whole value or none. No
// fsync: L3 is a cache, and a value torn by a power loss fails its checks on read.
//
// Capacity. With capacity_bytes > 0 the backend keeps the bytes of its values (framing
// included) at or under the cap by evicting the oldest-written values first. It tracks
// them in an in-memory index built at open by scanning the directory (oldest by mtime).
// The filesystem stays the truth for exists/get, so values written by another process
// sharing the directory are found too; only the cap is per process.
//
// Faults. A full disk (ENOSPC, EDQUOT, EFBIG) answers kResourceExhausted and any other
// write failure kIoError, for that item only; its temp file is removed. A value found
// damaged on read is deleted so that a later set can write it again.
//
// Threading. Thread-safe. Reads take no lock; writes, evictions and index updates hold
// mutex_ (the storage thread is the one writer in practice, so this costs nothing).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <ctime>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/result.h"
#include "storage/storage_backend.h"

namespace strata {

class FileBackend final : public StorageBackend {
 public:
  // Creates <dir>/<name_space> if needed, indexes the values already there and evicts
  // the oldest while over capacity. kIoError when the directory cannot be created or
  // read; kInvalidArgument for a bad namespace. `clock` (log throttling) must outlive
  // the backend.
  static Result<std::unique_ptr<FileBackend>> open(const StorageConfig& config, const Clock& clock);

  std::string_view name() const override { return "file"; }
  std::vector<bool> exists(std::span<const uint64_t> keys) override;
  std::vector<Status> get(std::span<const uint64_t> keys,
                          std::span<const std::span<std::byte>> dst) override;
  std::vector<Status> set(std::span<const uint64_t> keys,
                          std::span<const std::span<const std::byte>> values) override;
  StorageStats stats() const override { return counters_.snapshot(); }

  // The directory holding this namespace's values.
  const std::string& root() const { return root_; }
  // Bytes of the indexed values (framing included), never above a non-zero capacity.
  int64_t used_bytes() const;
  // The final path of a key's value (it may not exist).
  std::string value_path(uint64_t key) const;

 private:
  struct IndexEntry {
    int64_t size_bytes = 0;
    std::list<uint64_t>::iterator order_it;  // position in write_order_
  };
  struct ScannedValue {
    uint64_t key = 0;
    int64_t size_bytes = 0;
    timespec mtime{};
  };

  FileBackend(const StorageConfig& config, const Clock& clock, std::string root);

  Status scan();
  Status scan_shard(const std::string& shard_name, std::vector<ScannedValue>& out) const;
  Status get_one(uint64_t key, std::span<std::byte> dst);
  Status set_one(uint64_t key, std::span<const std::byte> value);
  Status make_room(int64_t size_bytes);  // requires mutex_
  Status write_atomically(uint64_t key, std::span<const std::byte> value);
  void drop_damaged(uint64_t key);
  void index_insert(uint64_t key, int64_t size_bytes);  // requires mutex_
  void index_erase(uint64_t key);                       // requires mutex_
  void log_failure(const std::string& message);

  const std::string root_;
  const int64_t capacity_bytes_;
  const uint64_t namespace_hash_;
  const uint32_t page_format_;  // StorageConfig::page_format
  StorageCounters counters_;
  LogThrottle log_throttle_;
  std::atomic<uint64_t> temp_counter_{0};

  mutable std::mutex mutex_;                        // guards the index; held across a value's write
  std::unordered_map<uint64_t, IndexEntry> index_;  // GUARDED_BY(mutex_)
  std::list<uint64_t> write_order_;                 // GUARDED_BY(mutex_), oldest first
  int64_t used_bytes_ = 0;                          // GUARDED_BY(mutex_)
};

}  // namespace strata
