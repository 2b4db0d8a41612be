// The transfer engine of a device with copy queues (a GPU and its streams): moves pages
// between the device pool and the pinned host pool by enqueueing their blocks' copies on the
// device (copy_device.h) and learning from its events when they have landed. The CPU build's
// TransferEngine (transfer_engine.h) does the same with copy threads; this one never copies a
// byte itself and never blocks except in wait().
//
// Jobs (TransferJob, kv_transfers.h) become batches of contiguous copies, one span per
// block (a page's K or V in one layer), spans that are adjacent on both sides merged into one
// (consecutive pages of the layer-first pools are one span per layer and K/V):
// - a backup (device -> host) is one batch on the backup queue;
// - a load (host -> device) is one batch on the load queue, or one batch per layer when it is
//   layer by layer, each with its own event, so that the forward pass can start layer l once
//   layer l has landed (wait_layer) while the later layers are still on their way.
// A load never queues behind backups (they have a queue each); a job that touches a page
// (device or host) that an unfinished job on the other queue also touches starts after it
// (the device orders the queues, the caller does not wait).
//
// Tickets and outcomes. submit() returns a ticket at once. take_completed() polls the device
// and lists each job once when it has resolved: kLanded, or kFailed when the device refused or
// failed one of its copies (the destination's bytes are then undefined). A page of a job is
// free for reuse only after its job has resolved: that is when the device has finished with
// it, success or not. A job still in flight `stall_timeout_ms` after it was enqueued is also
// listed once as kStalled: the requests waiting for it can be failed, but its pages stay held
// until it resolves (a copy cannot be called back; its bytes may still land).
//
// Ownership: the engine borrows the device and both pools' memory, which must outlive it; its
// destructor waits for every copy in flight.
//
// Thread: one thread (the scheduler's) calls the engine.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/result.h"
#include "memory/copy_device.h"
#include "memory/kv_block_layout.h"
#include "memory/kv_transfers.h"

namespace strata {

struct StreamTransferOptions {
  int64_t stall_timeout_ms = 10'000;
};

class StreamTransferEngine final : public KvTransfers {
 public:
  struct Stats {
    uint64_t jobs = 0;           // resolved jobs, landed or failed
    uint64_t failed = 0;         // of which failed
    uint64_t stalled = 0;        // jobs reported stalled (each once)
    uint64_t pages_to_host = 0;  // of landed jobs
    uint64_t pages_to_device = 0;
    uint64_t bytes_to_host = 0;
    uint64_t bytes_to_device = 0;
    uint64_t batches = 0;  // enqueue calls
    uint64_t spans = 0;    // contiguous copies in them, after merging
  };

  // The two layouts must have the same layers and block size (checked).
  StreamTransferEngine(CopyDevice& device, const KvBlockLayout& device_blocks,
                       const KvBlockLayout& host_blocks, StreamTransferOptions options = {},
                       const Clock& clock = SteadyClock::instance());
  ~StreamTransferEngine() override;

  StreamTransferEngine(const StreamTransferEngine&) = delete;
  StreamTransferEngine& operator=(const StreamTransferEngine&) = delete;

  // Enqueues the job's copies; never waits for one. Lists of different lengths or invalid
  // pages are caller bugs and fail a check. A batch the device refuses makes the job resolve
  // as kFailed (at the next poll).
  TransferTicket submit(TransferJob job) override;
  // Whether the job has resolved (landed or failed). Polls the device; never blocks.
  bool done(TransferTicket ticket);
  // Blocks until the job has resolved; its error if it failed. A ticket that
  // take_completed() has already returned answers at once, successfully. Blocks at most
  // until the job's stall deadline (stall_timeout_ms after it was enqueued): kTimeout then,
  // the job still in flight.
  Status wait(TransferTicket ticket);
  Status wait_resolved(TransferTicket ticket) override { return wait(ticket); }
  // Makes the device's compute that is issued afterwards wait for layers [0, layer] of a
  // layer-by-layer load (for any other job, for all of it); the caller does not block. The
  // job's error if it has already failed.
  Status wait_layer(TransferTicket ticket, int32_t layer);
  // KvTransfers: a copy of the job's event ids, for compute_wait from the forward thread (the
  // device must take compute_wait from that thread: copy_device.h). The events stay unreleased
  // until end_layer_wait, even once the job has resolved. A job already resolved, failed or
  // refused gets a wait that returns at once.
  LayerWait layer_wait(TransferTicket ticket) override;
  void end_layer_wait(TransferTicket ticket) override;
  // Polls the device: the jobs resolved since the last call, and those newly stalled.
  std::vector<TransferOutcome> take_completed();
  std::vector<TransferOutcome> take_outcomes() override { return take_completed(); }
  // Jobs submitted and not yet resolved.
  size_t in_flight() const { return jobs_.size(); }
  Stats stats() const { return stats_; }

 private:
  struct Job {
    TransferJob job;
    CopyQueue queue = CopyQueue::kLoad;
    // Layer-by-layer loads: events[l] lands with layer l (and all before it on the queue);
    // other jobs: one event. Shorter than planned when the device refused a batch.
    std::vector<CopyEvent> events;
    std::optional<std::string> error;  // refused or failed
    int64_t enqueued_ms = 0;
    bool stall_reported = false;
    bool compute_hold = false;  // a layer_wait is open: finish() keeps the events
  };

  void check_job(const TransferJob& job) const;
  void check_issued(TransferTicket ticket) const;
  // Spans of the job's blocks in `layer` (all layers when layer < 0), merged.
  std::vector<CopySpan> spans(const TransferJob& job, int32_t layer) const;
  // Makes `queue` wait for the unfinished jobs of the other queue that share a page with `job`
  // (found through latest_: O(the job's pages), whatever is in flight).
  void order_after_conflicts(const TransferJob& job, CopyQueue queue, Job& into);
  // Adds or removes an unfinished job in latest_.
  void index_pages(TransferTicket ticket, const Job& job);
  void unindex_pages(TransferTicket ticket, const Job& job);
  void enqueue(Job& job, std::span<const CopySpan> spans);
  // Polls the job's events; true once they have all landed or one failed (then the job is
  // finished: outcome recorded, events released, forgotten).
  bool poll(std::map<TransferTicket, Job>::iterator it);
  void finish(std::map<TransferTicket, Job>::iterator it);

  CopyDevice& device_;
  KvBlockLayout device_blocks_;
  KvBlockLayout host_blocks_;
  StreamTransferOptions options_;
  const Clock& clock_;

  std::map<TransferTicket, Job> jobs_;  // unresolved, by ticket (submission order)
  // [queue][0: device pool, 1: host pool][page index]: the latest unresolved job of the queue
  // that touches the page and has enqueued copies (0: none). A queue runs its batches in
  // order, so waiting for that job's last event waits for every earlier job of the queue on
  // the page too; a job the device refused outright copies nothing and is not recorded.
  std::vector<TransferTicket> latest_[2][2];
  std::vector<TransferOutcome> resolved_;  // since the last take_completed()
  // Events of resolved jobs whose layer_wait is still open, by ticket (end_layer_wait).
  std::map<TransferTicket, std::vector<CopyEvent>> held_events_;
  TransferTicket next_ticket_ = 1;
  Stats stats_;
};

}  // namespace strata
