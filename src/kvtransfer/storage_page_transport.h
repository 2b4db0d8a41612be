// StoragePageTransport: the fallback data plane when UCX is not available. The prefill
// worker writes each page of a batch to the shared storage tier (storage_backend.h: file
// or Redis) under a key derived from the room id and the page's index in the room; the
// decode worker reads them back into its pool's pages, as LMCache moves KV between
// engines through a shared store.
//
// Values are whole pages in KvPool's page buffer format (kv_pool.h: every layer's K and V
// block of the page), framed by the backend with their key and namespace, so a damaged,
// truncated or foreign value fails its checks (kCorrupt) instead of landing in the pool.
// Keys: room_page_key(room_id, index). A store never rewrites a key it has, so room ids
// must not repeat within a store and namespace: the decode worker draws them at random
// (64 bits). The values stay after the room: give the transfer its own namespace with a
// capacity (file) or maxmemory policy (Redis) so they roll off; StorageBackend has no
// delete.
//
// Threading: send and receive queue a job for the transport's own thread, which makes the
// blocking backend calls (chunks of options.pages_per_call pages) and checks the
// deadline between chunks; a single backend call is bounded by the backend's own
// timeouts (Redis timeout_ms), not by the deadline. `done` runs on that thread.
// Ownership: the backend and the pool are borrowed and must outlive the transport;
// destroying it fails the queued jobs (kFailedPrecondition) after the running one ends.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "kvtransfer/page_transport.h"
#include "memory/kv_pool.h"
#include "storage/storage_backend.h"

namespace strata {

struct StoragePageTransportOptions {
  int32_t pages_per_call = 8;  // pages per backend call (bounds the staging buffers), >= 1

  Status validate() const;
};

// The storage key of page `index` of room `room_id`.
uint64_t room_page_key(uint64_t room_id, int32_t index);

class StoragePageTransport final : public PageTransport {
 public:
  struct Stats {
    uint64_t pages_sent = 0;
    uint64_t pages_received = 0;
    uint64_t bytes_sent = 0;
    uint64_t bytes_received = 0;
    uint64_t failures = 0;  // sends and receives that failed
  };

  static Result<std::unique_ptr<StoragePageTransport>> create(
      StorageBackend& backend, KvPool& pool, const StoragePageTransportOptions& options = {});
  ~StoragePageTransport() override;

  StoragePageTransport(const StoragePageTransport&) = delete;
  StoragePageTransport& operator=(const StoragePageTransport&) = delete;

  std::string_view name() const override { return "storage"; }
  const std::vector<std::byte>& pool_descriptor() const override { return descriptor_; }
  Result<PageDestinationId> open_destination(std::span<const std::byte> descriptor) override;
  void close_destination(PageDestinationId destination) override;
  Status send(PageDestinationId destination, const PageBatch& batch, int64_t timeout_ms,
              TransferDone done) override;
  Status receive(const PageBatch& batch, int64_t timeout_ms, TransferDone done) override;

  Stats stats() const;

 private:
  StoragePageTransport(StorageBackend& backend, KvPool& pool,
                       const StoragePageTransportOptions& options);
  void run_thread();
  // Enqueues `job`; it gets the deadline check and `done` from run_thread.
  void enqueue(std::function<Status(int64_t deadline_ms)> job, int64_t timeout_ms,
               TransferDone done);
  Status write_pages(const PageBatch& batch, int64_t deadline_ms);
  Status read_pages(const PageBatch& batch, int64_t deadline_ms);

  struct Job {
    std::function<Status(int64_t deadline_ms)> work;
    int64_t deadline_ms = 0;
    TransferDone done;
  };

  StorageBackend& backend_;
  KvPool& pool_;
  const StoragePageTransportOptions options_;
  std::vector<std::byte> descriptor_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Job> queue_;                                   // GUARDED_BY(mutex_)
  bool stopping_ = false;                                   // GUARDED_BY(mutex_)
  std::unordered_map<uint64_t, KvPoolShape> destinations_;  // GUARDED_BY(mutex_)
  uint64_t next_destination_ = 1;                           // GUARDED_BY(mutex_)
  Stats stats_;                                             // GUARDED_BY(mutex_)
  std::thread thread_;                                      // started last, after the state it uses
};

}  // namespace strata
