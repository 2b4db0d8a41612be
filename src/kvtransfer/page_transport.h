// PageTransport: what the engine uses to move a room's KV pages from a prefill worker's
// pool into a decode worker's pool, whatever carries the bytes: UCX
// (ucx_page_transport.h) or, where UCX is not available, the shared storage tier
// (storage_page_transport.h). The control plane (the room handshake) carries the
// descriptors and the "sent" messages; this interface is the data plane only.
//
// Flow of one room:
//   decode worker   pool_descriptor() once, into every handshake it sends;
//   prefill worker  open_destination(descriptor) once per decode worker (cached), then
//                   send(batch) per chunk of computed pages; its `done` means the bytes
//                   are at the far end (in the decode pool for UCX, in the store for the
//                   storage path), and the control plane tells the decode worker;
//   decode worker   receive(batch) on that message; its `done` means the pages hold the
//                   KV and may be read (a no-op for UCX beyond ordering, a read from the
//                   store for the storage path).
//
// Leases (docs/kv-transfer.md): the prefill worker keeps batch.src_pages from being
// reused until send's `done` ran; the decode worker keeps batch.dst_pages reserved from
// the handshake until receive's `done` (or, after a failure, until the quarantine that
// the docs describe ends).
//
// Threading: every method may be called from any thread; `done` runs on the transport's
// own thread (TransferDone). Both pools are borrowed and must outlive the transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "kvtransfer/transfer_done.h"
#include "memory/page_id.h"

namespace strata {

// One chunk of a room's pages: src_pages[i] of the prefill pool goes to dst_pages[i] of
// the decode pool. Page i of the batch is page `first_index + i` of the room.
struct PageBatch {
  uint64_t room_id = 0;  // unique per room and store (the decode worker draws it at random)
  int32_t first_index = 0;
  std::vector<PageId> src_pages;
  std::vector<PageId> dst_pages;
};

// kInvalidArgument unless the lists have the same length, every source page is in
// [0, src_num_pages) and every destination page in [0, dst_num_pages) and listed once.
// A negative count skips that side's check.
Status check_batch_pages(const PageBatch& batch, int32_t src_num_pages, int32_t dst_num_pages);

enum class PageDestinationId : uint64_t {};  // a decode worker's pool, on the prefill side

class PageTransport {
 public:
  virtual ~PageTransport() = default;

  virtual std::string_view name() const = 0;  // "ucx", "storage"

  // Decode side: the framed bytes (wire_format.h) that let a prefill worker reach this
  // worker's pool. The same for every room.
  virtual const std::vector<std::byte>& pool_descriptor() const = 0;

  // Prefill side: a destination from a decode worker's pool_descriptor(). kCorrupt for
  // bytes that are not a descriptor of this transport; kInvalidArgument when the page
  // shapes differ (only num_pages may); transport errors otherwise. May block for a
  // round trip to the peer; never call it from a TransferDone.
  virtual Result<PageDestinationId> open_destination(std::span<const std::byte> descriptor) = 0;
  // Forgets a destination; its pending sends fail.
  virtual void close_destination(PageDestinationId destination) = 0;

  // Prefill side: moves the batch. Non-blocking. A bad batch (lists of different lengths,
  // pages out of range, a destination page twice) or an unknown destination returns the
  // error and never calls `done`; otherwise `done` runs once with the outcome.
  virtual Status send(PageDestinationId destination, const PageBatch& batch, int64_t timeout_ms,
                      TransferDone done) = 0;

  // Decode side: after the prefill side reported the batch sent, makes its dst_pages hold
  // the KV. Same error contract as send().
  virtual Status receive(const PageBatch& batch, int64_t timeout_ms, TransferDone done) = 0;
};

}  // namespace strata
