// The storage (L3) worker: one thread that moves pages between the host pool and a
// storage backend, so that the scheduler thread never waits on a disk or a network.
//
// The scheduler submits tasks and polls results; the worker only touches host pages the
// task names, which the scheduler keeps allocated and unchanged until the result is
// taken (a write reads pages of nodes the tree holds with io_ref; a read fills pages that
// no node owns yet). Every backend fault ends in a result, never in an exception or a
// hang: a failed item is simply not written / not read.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cache/block_hash.h"
#include "memory/host_kv_pool.h"
#include "memory/page_id.h"
#include "storage/storage_backend.h"

namespace strata {

struct StorageTask {
  enum class Kind : uint8_t {
    kWrite,   // host pages -> storage (only what the store lacks is written)
    kExists,  // how many leading hashes the store has
    kRead,    // storage -> host pages, each value checked
  };
  uint64_t id = 0;
  Kind kind = Kind::kWrite;
  std::vector<BlockHash> hashes;
  std::vector<PageId> host_pages;  // kWrite, kRead: one per hash
};

struct StorageTaskResult {
  uint64_t id = 0;
  StorageTask::Kind kind = StorageTask::Kind::kWrite;
  std::vector<BlockHash> hashes;
  std::vector<PageId> host_pages;
  std::vector<uint8_t> ok;   // per item: written / read and verified
  int32_t leading_hits = 0;  // kExists: consecutive hits from the first hash
  int32_t failures = 0;      // items that failed for a backend fault or a bad value
};

class StorageWorker {
 public:
  StorageWorker(StorageBackend* backend, HostKvPool* host);
  ~StorageWorker();  // finishes queued tasks, joins
  StorageWorker(const StorageWorker&) = delete;
  StorageWorker& operator=(const StorageWorker&) = delete;

  uint64_t submit(StorageTask task);  // returns the task id; never blocks on I/O
  std::vector<StorageTaskResult> take_results();
  bool idle() const;
  // Blocks until every submitted task has a result (tests, shutdown).
  void drain();

 private:
  void run();
  StorageTaskResult execute(const StorageTask& task);

  StorageBackend* backend_;
  HostKvPool* host_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  std::deque<StorageTask> queue_;           // GUARDED_BY(mutex_)
  std::vector<StorageTaskResult> results_;  // GUARDED_BY(mutex_)
  int64_t in_flight_ = 0;                   // GUARDED_BY(mutex_)
  uint64_t next_id_ = 1;                    // GUARDED_BY(mutex_)
  bool stopping_ = false;                   // GUARDED_BY(mutex_)
  std::thread thread_;
};

}  // namespace strata
