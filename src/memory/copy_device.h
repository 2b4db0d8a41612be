// A device's copy machinery as the stream transfer engine sees it (stream_transfer_engine.h):
// two copy queues that each run batches of byte copies in the order they were enqueued, and
// events that say when a batch has landed. On a GPU the queues are CUDA streams and the
// events CUDA events (cuda/cuda_copy_device.h); the tests use a device whose copies land only
// when the test says (tests/memory/fake_copy_device.h), so that ordering bugs show without a
// GPU.
//
// Contract:
// - enqueue() returns at once; the batch runs after everything enqueued before it on the same
//   queue, and after the events that queue was told to wait for (queue_wait). It returns an
//   event that is ready when the batch (and all before it on the queue) has landed, or an
//   error when the device refused the batch (nothing of it runs).
// - ready() never blocks: true once landed, false while in flight, an error when the copy
//   failed (the bytes at the destination are then undefined). wait(e, timeout_ms) blocks the
//   calling thread until the event is ready (true) or failed (an error), or for at most
//   timeout_ms (false: still in flight; a copy that hangs cannot hang its caller).
// - queue_wait(queue, e): work enqueued on `queue` afterwards starts only once `e` is ready
//   (a cross-queue dependency, without blocking the caller).
// - compute_wait(e): the device's compute (the forward pass) that is issued afterwards starts
//   only once `e` is ready, without blocking the caller (on a GPU, cudaStreamWaitEvent on the
//   compute stream).
// - release(e): the caller no longer asks about `e`; the device may reuse its resources. Each
//   event is released exactly once.
//
// Thread: one thread (the scheduler's) makes every call but compute_wait, which comes from the
// thread that issues the compute (the forward pass's, while the scheduler thread goes on:
// a load-back overlapped with the pass), concurrently with the others, for events not yet
// released.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "common/result.h"

namespace strata {

// How a device moves a batch (HiCache's --hicache-io-backend):
//   direct  its copy engines, one batched copy call per batch (not one call per page);
//   kernel  a copy kernel of its own, reading and writing the spans (the host side through
//           its page-locked mapping): one launch per batch, competing with compute for SMs
//           but not for the copy engines.
enum class CopyPath : uint8_t { kDirect, kKernel };

// "direct", "kernel"; kInvalidArgument naming both for anything else.
Result<CopyPath> parse_copy_path(std::string_view name);
std::string_view copy_path_name(CopyPath path);

// One contiguous copy of `bytes` bytes; both ranges are in memory the device can reach
// (its own, or host memory registered with it).
struct CopySpan {
  std::byte* dst = nullptr;
  const std::byte* src = nullptr;
  size_t bytes = 0;
};

// Loads (host -> device) and backups (device -> host) have a queue each, so that a load a
// request waits for never queues behind backups.
enum class CopyQueue : uint8_t { kLoad = 0, kBackup = 1 };

using CopyEvent = uint64_t;  // 0 is never issued

class CopyDevice {
 public:
  virtual ~CopyDevice() = default;
  virtual Result<CopyEvent> enqueue(CopyQueue queue, std::span<const CopySpan> spans) = 0;
  virtual Result<bool> ready(CopyEvent event) = 0;
  virtual Result<bool> wait(CopyEvent event, int64_t timeout_ms) = 0;
  virtual Status queue_wait(CopyQueue queue, CopyEvent event) = 0;
  virtual Status compute_wait(CopyEvent event) = 0;
  virtual void release(CopyEvent event) = 0;
};

}  // namespace strata
