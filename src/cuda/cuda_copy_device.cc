#include "cuda/cuda_copy_device.h"

#include <fmt/format.h>
#include <chrono>
#include <thread>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#ifdef STRATA_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/cuda_status.h"
#include "cuda/kernel_launch.h"
#endif

namespace strata::cuda {

HostRegistration::HostRegistration(HostRegistration&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)) {}

HostRegistration& HostRegistration::operator=(HostRegistration&& other) noexcept {
  if (this != &other) {
    HostRegistration old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
  }
  return *this;
}

#ifdef STRATA_HAVE_CUDA

namespace {

using detail::cuda_error;

// The kernel path cuts spans into pieces of at most this many bytes, so that one long span
// (a whole layer of consecutive pages) is copied by many thread blocks.
constexpr size_t kKernelPieceBytes = 64 * 1024;

}  // namespace

Result<HostRegistration> HostRegistration::register_memory(void* data, size_t bytes) {
  if (data == nullptr || bytes == 0) return bad_argument("registering an empty range");
  if (const cudaError_t e =
          cudaHostRegister(data, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
      e != cudaSuccess) {
    cudaGetLastError();
    Error err = cuda_error(e, fmt::format("page-locking {} bytes of host memory for the GPU "
                                          "(check the memlock limit, ulimit -l)",
                                          bytes));
    err.code = ErrorCode::kResourceExhausted;
    return std::unexpected(std::move(err));
  }
  HostRegistration out;
  out.data_ = data;
  return out;
}

HostRegistration::~HostRegistration() {
  if (data_ != nullptr) cudaHostUnregister(data_);
}

struct CudaCopyDevice::Impl {
  // A page-locked, device-mapped array of span descriptors for one kernel-path batch; it
  // stays with the batch's event until released (the kernel may not have read it yet).
  struct Descriptors {
    CopySpanArg* data = nullptr;
    size_t capacity = 0;
  };
  struct Event {
    cudaEvent_t event = nullptr;
    Descriptors descriptors;
  };

  // Declared first, so undone last: after the destructor has waited for both streams.
  HostRegistration registration;
  CopyPath path = CopyPath::kDirect;
  cudaStream_t compute = nullptr;
  cudaStream_t streams[2] = {nullptr, nullptr};
  int multiprocessors = 1;
  // The scheduler thread enqueues, polls and releases while the forward thread makes the
  // compute stream wait (compute_wait): the tables below under one lock (the CUDA calls are
  // thread-safe).
  std::mutex mutex;
  std::unordered_map<CopyEvent, Event> live;  // GUARDED_BY(mutex)
  std::vector<cudaEvent_t> free_events;       // GUARDED_BY(mutex)
  std::vector<Descriptors> free_descriptors;  // GUARDED_BY(mutex)
  CopyEvent next = 1;                         // GUARDED_BY(mutex)

  cudaEvent_t event_of(CopyEvent id) {
    std::lock_guard lock(mutex);
    return live.at(id).event;
  }

  ~Impl() {
    for (cudaStream_t s : streams) {
      if (s != nullptr) {
        cudaStreamSynchronize(s);
        cudaStreamDestroy(s);
      }
    }
    for (auto& [id, e] : live) {
      cudaEventDestroy(e.event);
      if (e.descriptors.data != nullptr) cudaFreeHost(e.descriptors.data);
    }
    for (cudaEvent_t e : free_events) cudaEventDestroy(e);
    for (Descriptors& d : free_descriptors) cudaFreeHost(d.data);
  }

  cudaStream_t stream(CopyQueue q) const { return streams[static_cast<size_t>(q)]; }

  Result<cudaEvent_t> take_event() {
    if (!free_events.empty()) {
      cudaEvent_t e = free_events.back();
      free_events.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    if (const cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
        err != cudaSuccess) {
      return std::unexpected(cuda_error(err, "creating a copy event"));
    }
    return e;
  }

  Result<Descriptors> take_descriptors(size_t n) {
    for (size_t i = 0; i < free_descriptors.size(); ++i) {
      if (free_descriptors[i].capacity >= n) {
        Descriptors d = free_descriptors[i];
        free_descriptors.erase(free_descriptors.begin() + static_cast<std::ptrdiff_t>(i));
        return d;
      }
    }
    Descriptors d;
    d.capacity = std::max<size_t>(n, 1024);
    void* p = nullptr;
    if (const cudaError_t err = cudaHostAlloc(&p, d.capacity * sizeof(CopySpanArg),
                                              cudaHostAllocMapped | cudaHostAllocPortable);
        err != cudaSuccess) {
      return std::unexpected(cuda_error(err, "allocating copy descriptors"));
    }
    d.data = static_cast<CopySpanArg*>(p);
    return d;
  }

  Status direct(cudaStream_t s, std::span<const CopySpan> spans) {
    std::vector<void*> dsts(spans.size());
    std::vector<const void*> srcs(spans.size());
    std::vector<size_t> sizes(spans.size());
    for (size_t i = 0; i < spans.size(); ++i) {
      dsts[i] = spans[i].dst;
      srcs[i] = spans[i].src;
      sizes[i] = spans[i].bytes;
    }
    cudaMemcpyAttributes attrs{};
    attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t attr_index = 0;
    cudaError_t err = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), spans.size(),
                                           &attrs, &attr_index, 1, s);
    if (err == cudaErrorNotSupported || err == cudaErrorInvalidValue) {
      // Drivers without batched copies: one call per span, in order on the same stream.
      cudaGetLastError();
      err = cudaSuccess;
      for (size_t i = 0; i < spans.size() && err == cudaSuccess; ++i) {
        err = cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDefault, s);
      }
    }
    if (err != cudaSuccess) return std::unexpected(cuda_error(err, "queueing KV copies"));
    return {};
  }

  Result<Descriptors> kernel(cudaStream_t s, std::span<const CopySpan> spans) {
    size_t pieces = 0;
    for (const CopySpan& span : spans)
      pieces += (span.bytes + kKernelPieceBytes - 1) / kKernelPieceBytes;
    Result<Descriptors> d = take_descriptors(pieces);
    if (!d) return d;
    size_t n = 0;
    for (const CopySpan& span : spans) {
      for (size_t off = 0; off < span.bytes; off += kKernelPieceBytes) {
        d->data[n++] = CopySpanArg{span.dst + off, span.src + off,
                                   std::min(kKernelPieceBytes, span.bytes - off)};
      }
    }
    const auto blocks =
        static_cast<int32_t>(std::min<size_t>(n, static_cast<size_t>(multiprocessors) * 4));
    const auto err = static_cast<cudaError_t>(
        detail::launch_copy_spans(d->data, static_cast<int32_t>(n), std::max(blocks, 1), s));
    if (err != cudaSuccess) {
      free_descriptors.push_back(*d);
      return std::unexpected(cuda_error(err, "launching the KV copy kernel"));
    }
    return d;
  }
};

CudaCopyDevice::CudaCopyDevice(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<CudaCopyDevice>> CudaCopyDevice::create(StreamHandle compute, CopyPath path,
                                                               std::span<std::byte> host) {
  auto impl = std::make_unique<Impl>();
  if (!host.empty()) {
    auto registered = HostRegistration::register_memory(host.data(), host.size());
    if (!registered) return std::unexpected(registered.error());
    impl->registration = std::move(*registered);
  }
  impl->path = path;
  impl->compute = static_cast<cudaStream_t>(compute);
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) {
    return std::unexpected(cuda_error(e, "finding the current device"));
  }
  cudaDeviceGetAttribute(&impl->multiprocessors, cudaDevAttrMultiProcessorCount, device);
  if (path == CopyPath::kKernel) {
    int direct_host = 0;
    cudaDeviceGetAttribute(&direct_host, cudaDevAttrCanUseHostPointerForRegisteredMem, device);
    if (direct_host == 0) {
      return std::unexpected(Error{ErrorCode::kUnsupported,
                                   "the kernel I/O backend needs a device that can use registered "
                                   "host pointers directly; use --hicache-io-backend direct"});
    }
  }
  for (cudaStream_t& s : impl->streams) {
    if (const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        e != cudaSuccess) {
      return std::unexpected(cuda_error(e, "creating a copy stream"));
    }
  }
  return std::unique_ptr<CudaCopyDevice>(new CudaCopyDevice(std::move(impl)));
}

CudaCopyDevice::~CudaCopyDevice() = default;

CopyPath CudaCopyDevice::path() const {
  return impl_->path;
}

Result<CopyEvent> CudaCopyDevice::enqueue(CopyQueue queue, std::span<const CopySpan> spans) {
  Impl& m = *impl_;
  std::lock_guard lock(m.mutex);
  const cudaStream_t s = m.stream(queue);
  Impl::Event ev;
  if (!spans.empty()) {
    if (m.path == CopyPath::kDirect) {
      if (Status st = m.direct(s, spans); !st) return std::unexpected(st.error());
    } else {
      Result<Impl::Descriptors> d = m.kernel(s, spans);
      if (!d) return std::unexpected(d.error());
      ev.descriptors = *d;
    }
  }
  Result<cudaEvent_t> e = m.take_event();
  if (e) {
    if (const cudaError_t err = cudaEventRecord(*e, s); err != cudaSuccess) {
      m.free_events.push_back(*e);
      e = std::unexpected(cuda_error(err, "recording a copy event"));
    }
  }
  if (!e) {
    // The copies are queued but cannot be waited for: wait here, so that nothing the caller
    // frees is still being copied, and report the failure.
    cudaStreamSynchronize(s);
    if (ev.descriptors.data != nullptr) m.free_descriptors.push_back(ev.descriptors);
    return std::unexpected(e.error());
  }
  ev.event = *e;
  const CopyEvent id = m.next++;
  m.live.emplace(id, ev);
  return id;
}

Result<bool> CudaCopyDevice::ready(CopyEvent event) {
  const cudaError_t e = cudaEventQuery(impl_->event_of(event));
  if (e == cudaSuccess) return true;
  if (e == cudaErrorNotReady) return false;
  return std::unexpected(cuda_error(e, "a KV copy"));
}

Result<bool> CudaCopyDevice::wait(CopyEvent event, int64_t timeout_ms) {
  // cudaEventSynchronize cannot be bounded: the event is queried until it is done or the
  // time is up (a yield between queries; copies take microseconds to milliseconds).
  const cudaEvent_t ev = impl_->event_of(event);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) return std::unexpected(cuda_error(e, "waiting for a KV copy"));
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

Status CudaCopyDevice::queue_wait(CopyQueue queue, CopyEvent event) {
  if (const cudaError_t e = cudaStreamWaitEvent(impl_->stream(queue), impl_->event_of(event), 0);
      e != cudaSuccess) {
    return std::unexpected(cuda_error(e, "ordering KV copies"));
  }
  return {};
}

Status CudaCopyDevice::compute_wait(CopyEvent event) {
  if (const cudaError_t e = cudaStreamWaitEvent(impl_->compute, impl_->event_of(event), 0);
      e != cudaSuccess) {
    return std::unexpected(cuda_error(e, "making compute wait for a KV copy"));
  }
  return {};
}

void CudaCopyDevice::release(CopyEvent event) {
  std::lock_guard lock(impl_->mutex);
  const auto it = impl_->live.find(event);
  if (it == impl_->live.end()) return;
  impl_->free_events.push_back(it->second.event);
  if (it->second.descriptors.data != nullptr) {
    impl_->free_descriptors.push_back(it->second.descriptors);
  }
  impl_->live.erase(it);
}

#else  // no CUDA in this build

namespace {

Error no_cuda_copies() {
  return Error{ErrorCode::kUnsupported,
               "this strata was built without CUDA: the GPU's copy streams are not available"};
}

}  // namespace

struct CudaCopyDevice::Impl {
  CopyPath path = CopyPath::kDirect;
};

CudaCopyDevice::CudaCopyDevice(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<HostRegistration> HostRegistration::register_memory(void*, size_t) {
  return std::unexpected(no_cuda_copies());
}
HostRegistration::~HostRegistration() = default;
Result<std::unique_ptr<CudaCopyDevice>> CudaCopyDevice::create(StreamHandle, CopyPath,
                                                               std::span<std::byte>) {
  return std::unexpected(no_cuda_copies());
}
CudaCopyDevice::~CudaCopyDevice() = default;
CopyPath CudaCopyDevice::path() const {
  return impl_->path;
}
Result<CopyEvent> CudaCopyDevice::enqueue(CopyQueue, std::span<const CopySpan>) {
  return std::unexpected(no_cuda_copies());
}
Result<bool> CudaCopyDevice::ready(CopyEvent) {
  return std::unexpected(no_cuda_copies());
}
Result<bool> CudaCopyDevice::wait(CopyEvent, int64_t) {
  return std::unexpected(no_cuda_copies());
}
Status CudaCopyDevice::queue_wait(CopyQueue, CopyEvent) {
  return std::unexpected(no_cuda_copies());
}
Status CudaCopyDevice::compute_wait(CopyEvent) {
  return std::unexpected(no_cuda_copies());
}
void CudaCopyDevice::release(CopyEvent) {}

#endif

}  // namespace strata::cuda
