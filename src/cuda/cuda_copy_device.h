// The GPU's copy machinery for the KV tiers (memory/copy_device.h): two copy streams of its
// own, loads (host -> device) on one and backups (device -> host) on the other, CUDA events
// for completion, and the compute stream's waits on them (the forward pass starts layer l
// once layer l's pages have landed). The stream transfer engine
// (memory/stream_transfer_engine.h) drives it; nothing here decides what to copy.
//
// Two I/O paths (HiCache's --hicache-io-backend):
//   direct  one cudaMemcpyBatchAsync per batch (every span of a transfer in one call, not one
//           call per page), the copy engines doing the work;
//   kernel  our own copy kernel (copy_spans.cu): thread blocks read and write the spans with
//           16-byte accesses, the host side through its page-locked mapping, so the batch is
//           one launch; it competes with compute for SMs but not for the copy engines.
// Host memory must be registered first (HostRegistration): copies from pageable memory are
// neither asynchronous nor fast, and the kernel path cannot reach it at all.
//
// Without CUDA in the build every call answers "built without CUDA" (kUnsupported).
//
// Thread: one thread (the scheduler's) calls a device at a time (copy_device.h).
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "common/result.h"
#include "cuda/kernel_args.h"
#include "memory/copy_device.h"

namespace strata::cuda {

// The I/O paths (memory/copy_device.h), named here as the device's.
using strata::copy_path_name;
using strata::CopyPath;
using strata::parse_copy_path;

// Page-locked registration of a range of host memory (the host pool) for the device, undone
// on destruction. The range must stay allocated while registered.
class HostRegistration {
 public:
  // kResourceExhausted when the system refuses to lock the memory (RLIMIT_MEMLOCK, or too
  // much), with what was asked.
  static Result<HostRegistration> register_memory(void* data, size_t bytes);
  HostRegistration() = default;
  ~HostRegistration();
  HostRegistration(HostRegistration&& other) noexcept;
  HostRegistration& operator=(HostRegistration&& other) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;

 private:
  void* data_ = nullptr;
};

class CudaCopyDevice final : public CopyDevice {
 public:
  // `compute` is the stream the forward pass runs on (compute_wait makes it wait); null is
  // the legacy default stream. kUnsupported for the kernel path on a system where the device
  // cannot use registered host pointers directly.
  // `host`, when not empty, is registered (HostRegistration) for the device's lifetime: the
  // host pool the engine's tiers copy to and from (GpuModel::make_copy_device).
  static Result<std::unique_ptr<CudaCopyDevice>> create(StreamHandle compute, CopyPath path,
                                                        std::span<std::byte> host = {});
  // Waits for both copy streams, then frees the streams, events and descriptor buffers.
  ~CudaCopyDevice() override;

  Result<CopyEvent> enqueue(CopyQueue queue, std::span<const CopySpan> spans) override;
  Result<bool> ready(CopyEvent event) override;
  Result<bool> wait(CopyEvent event, int64_t timeout_ms) override;
  Status queue_wait(CopyQueue queue, CopyEvent event) override;
  Status compute_wait(CopyEvent event) override;
  void release(CopyEvent event) override;

  CopyPath path() const;

 private:
  struct Impl;
  explicit CudaCopyDevice(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::cuda
