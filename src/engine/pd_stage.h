// Prefill/decode disaggregation on a model that keeps its KV pages in memory of its own
// (the GPU's: ForwardModel::external_kv, cuda/gpu_model.h). The transports (UCX, the
// storage tier) read and write host memory; Debian's UCX has no CUDA transport to register
// GPU memory with (docs/cuda.md). So the pages cross through a staging pool: a KvPool of the
// model's real page shape in host memory, page-locked by the model's copy device, whose
// pages the transports send from and receive into, and the copy streams move between it
// and the device (docs/pd-disaggregation.md, On a GPU).
//
//   prefill side   computed device pages -> stage pages (device to host) -> the transport
//                  sends the stage pages; they go back when the send completes
//   decode side    the order names stage pages; the transport writes them; stage pages ->
//                  the room's device pages (host to device); then the request decodes
//
// The stage has its own page allocator: a page is free only when both its copy and the
// transport are done with it (a failed room's stage pages wait out the quarantine, as the
// device pages of a room without a stage do).
//
// Thread: the scheduler's only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/clock.h"
#include "common/result.h"
#include "memory/copy_device.h"
#include "memory/kv_pool.h"
#include "memory/kv_transfers.h"
#include "memory/page_allocator.h"
#include "model/forward_model.h"

namespace strata {

class PdStage {
 public:
  // A stage of `num_pages` pages of `external`'s page shape, over a copy device the model
  // makes for its memory (`path`: the host tier's I/O path). Copies in flight past
  // `stall_timeout_ms` are reported kStalled (and still hold their pages).
  static Result<std::unique_ptr<PdStage>> create(ForwardModel& model, const ExternalKv& external,
                                                 int32_t num_pages, CopyPath path,
                                                 int64_t stall_timeout_ms, const Clock& clock);
  ~PdStage();
  PdStage(const PdStage&) = delete;
  PdStage& operator=(const PdStage&) = delete;

  // The pool the transports read and write.
  KvPool& pool() { return *pool_; }
  PageAllocator& pages() { return allocator_; }

  // One job: device_pages[i] <-> stage_pages[i]. Never waits.
  TransferTicket copy(TransferDirection direction, std::vector<PageId> device_pages,
                      std::vector<PageId> stage_pages);
  // Each job once kLanded or kFailed (and perhaps kStalled before that), non-blocking.
  std::vector<TransferOutcome> take_outcomes();
  // Jobs submitted and not yet reported landed or failed.
  int32_t in_flight() const { return in_flight_; }

 private:
  explicit PdStage(int32_t num_pages) : allocator_(num_pages) {}

  std::unique_ptr<KvPool> pool_;
  PageAllocator allocator_;
  // Declared after the pool: destroyed first (the engine waits for its copies).
  std::unique_ptr<CopyDevice> device_;
  std::unique_ptr<KvTransfers> transfers_;
  int32_t in_flight_ = 0;
};

}  // namespace strata
