// The transfer engine: copies pages between the device pool and the host pool on its own
// copy threads, so that write-back and restore run off the scheduler thread and overlap
// with the forward pass (HiCache's "compute-transfer overlap": layer N+1 loads while
// layer N computes).
//
// Ownership: the engine borrows both pools; they must outlive it. A submitted job is
// owned by the engine until its ticket is done.
//
// Tickets: submit() returns a ticket at once. A ticket is done when its copy has fully
// landed; the engine then forgets everything about it except that it is done, and lists
// it once in take_completed(). done() and wait() on a finished ticket answer at once, so
// a ticket may be waited for before or after take_completed() returned it. The scheduler
// is expected to poll take_completed(): the list of finished tickets grows until it does.
//
// Ordering: a load (host -> device) goes ahead of the queued backups that share no page
// with it (a request or an agent waits on a load; a backup only frees pages later).
// Otherwise, with one copy thread, jobs run one at a time in submission order; with more
// they run concurrently in any order. Two jobs that touch the same page (device or host)
// must be ordered by the caller (wait for the first before submitting the second), as
// must the forward pass's reads and writes of pages that a pending job copies.
//
// Thread: submit, done, wait, wait_layer, take_completed and stats may be called from any
// thread (normally the scheduler's) while the copy threads run; one mutex guards the
// engine's state, never held during a copy.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "memory/host_kv_pool.h"
#include "memory/kv_pool.h"
#include "memory/kv_transfers.h"
#include "memory/page_id.h"
#include "memory/transfer_direction.h"

namespace strata {

class TransferEngine final : public KvTransfers {
 public:
  struct Stats {
    uint64_t jobs = 0;  // finished jobs
    uint64_t pages_to_host = 0;
    uint64_t pages_to_device = 0;
    uint64_t bytes_to_host = 0;
    uint64_t bytes_to_device = 0;
    double busy_seconds = 0;  // copy time summed over the copy threads
  };

  // Starts `num_threads` (>= 1) copy threads. The pools must have the same page shape.
  TransferEngine(KvPool& device, HostKvPool& host, int32_t num_threads = 1);
  // Finishes every queued job, then joins the copy threads.
  ~TransferEngine() override;

  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // Queues a job; never waits for a copy. Lists of different lengths or invalid pages
  // are caller bugs and fail a check here, on the caller's thread.
  TransferTicket submit(TransferJob job) override;
  // Whether the job has fully landed. Non-blocking.
  bool done(TransferTicket ticket) const;
  // Blocks until the job has fully landed.
  void wait(TransferTicket ticket);
  // Blocks until layers [0, layer] of a layer-by-layer host -> device job have landed
  // on the device; for any other job, until it is done.
  void wait_layer(TransferTicket ticket, int32_t layer);
  // Tickets finished since the last call, in completion order. Non-blocking.
  std::vector<TransferTicket> take_completed();
  Stats stats() const;

  // KvTransfers: a memcpy cannot fail, so every job lands.
  Status wait_resolved(TransferTicket ticket) override {
    wait(ticket);
    return {};
  }
  std::vector<TransferOutcome> take_outcomes() override;
  // KvTransfers: wait_layer from the forward thread (the engine takes any thread).
  LayerWait layer_wait(TransferTicket ticket) override {
    return [this, ticket](int32_t layer) {
      wait_layer(ticket, layer);
      return Status{};
    };
  }
  void end_layer_wait(TransferTicket) override {}

 private:
  struct QueuedJob {
    TransferTicket ticket = 0;
    TransferJob job;
  };

  void check_job(const TransferJob& job) const;
  void check_issued(TransferTicket ticket) const;
  void run_copy_thread();
  // Where a new job enters queue_ (mutex_ held).
  size_t queue_position(const TransferJob& job) const;
  void execute(const QueuedJob& queued);
  void finish(const QueuedJob& queued, double seconds);

  KvPool& device_;
  HostKvPool& host_;

  mutable std::mutex mutex_;
  std::condition_variable work_cv_;  // a job was queued, or the engine is stopping
  std::condition_variable done_cv_;  // a job finished, or a layer of one landed
  std::deque<QueuedJob> queue_;      // GUARDED_BY(mutex_)
  // Tickets queued or running -> layers landed on the device (layer-by-layer jobs;
  // 0 for the others until they finish). GUARDED_BY(mutex_)
  std::unordered_map<TransferTicket, int32_t> pending_;
  std::vector<TransferTicket> completed_;  // GUARDED_BY(mutex_), since take_completed()
  TransferTicket next_ticket_ = 1;         // GUARDED_BY(mutex_)
  bool stopping_ = false;                  // GUARDED_BY(mutex_)
  Stats stats_;                            // GUARDED_BY(mutex_)

  std::vector<std::thread> threads_;  // started last, after the state they use
};

}  // namespace strata
