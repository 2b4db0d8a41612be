// What the scheduler needs of a transfer engine: jobs submitted, waited for, and their
// outcomes. Two engines provide it: TransferEngine (transfer_engine.h: the CPU build's copy
// threads, every host layout) and StreamTransferEngine (stream_transfer_engine.h: a device's
// copy queues and events, the GPU's; on the CPU in the tests, over a device whose copies
// land when the test says).
//
// Outcomes. Each job is listed once as kLanded or kFailed when it resolves; a page it names
// may be reused only then. A job still in flight long after it was enqueued may be listed
// once before that as kStalled (its waiters can give up; its pages stay held until it
// resolves).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/result.h"
#include "memory/layer_wait.h"
#include "memory/page_id.h"
#include "memory/transfer_direction.h"

namespace strata {

struct TransferJob {
  TransferDirection direction = TransferDirection::kDeviceToHost;
  // Pair i moves device_pages[i] <-> host_pages[i]; both lists have the same length.
  std::vector<PageId> device_pages;
  std::vector<PageId> host_pages;
  // Host -> device only: copy layer by layer and publish progress after each, for
  // wait_layer(). Ignored for device -> host.
  bool layer_by_layer = false;
};

// Whether two jobs name a common device page or a common host page (then they must not run
// at the same time: one of them writes it).
bool shares_a_page(const TransferJob& a, const TransferJob& b);

using TransferTicket = uint64_t;  // 0 is never issued

enum class TransferResult : uint8_t { kLanded, kFailed, kStalled };

struct TransferOutcome {
  TransferTicket ticket = 0;
  TransferResult result = TransferResult::kLanded;
  std::string error;  // kFailed: what the device said; kStalled: how long it has waited
};

class KvTransfers {
 public:
  virtual ~KvTransfers() = default;
  // Queues the job's copies; never waits for one.
  virtual TransferTicket submit(TransferJob job) = 0;
  // Blocks until the job has resolved; its error if it failed. An engine whose copies can
  // stall gives up at the job's stall deadline with kTimeout (the job stays in flight and
  // take_outcomes() reports it kStalled).
  virtual Status wait_resolved(TransferTicket ticket) = 0;
  // The outcomes since the last call (non-blocking).
  virtual std::vector<TransferOutcome> take_outcomes() = 0;

  // A load-back overlapped with the forward pass that reads it (a layer-by-layer host ->
  // device job): what the pass calls before it reads layer l of the job's pages, from the
  // forward thread (memory/layer_wait.h). It stays valid, whatever the job's outcome
  // and whether take_outcomes() reported it, until end_layer_wait(ticket), which the caller
  // makes once the pass that used it has returned; one open wait per ticket. A job that
  // fails lets the wait return (the caller learns the outcome from take_outcomes()).
  virtual LayerWait layer_wait(TransferTicket ticket) = 0;
  virtual void end_layer_wait(TransferTicket ticket) = 0;
};

}  // namespace strata
