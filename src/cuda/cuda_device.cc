#include "cuda/cuda_device.h"

#include <fmt/format.h>

#include <utility>

#ifdef STRATA_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/cuda_status.h"
#endif

namespace strata::cuda {

namespace {

[[maybe_unused]] std::string version_text(int v) {
  return fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
}

#ifdef STRATA_HAVE_CUDA
using detail::cuda_error;
#else
Error no_cuda() {
  return Error{ErrorCode::kUnsupported,
               "this strata was built without CUDA (STRATA_CUDA=OFF, or nvcc was not found when "
               "it was configured): rebuild with -DSTRATA_CUDA=ON and CUDA 12.8 or newer"};
}
#endif

}  // namespace

#ifdef STRATA_HAVE_CUDA
Error detail::cuda_error(cudaError_t e, std::string_view what) {
  const ErrorCode code =
      e == cudaErrorMemoryAllocation ? ErrorCode::kResourceExhausted : ErrorCode::kInternal;
  return Error{code, fmt::format("{}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e))};
}
#endif

bool built_with_cuda() {
#ifdef STRATA_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::string describe(const DeviceInfo& d) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  return fmt::format("{}, sm_{}{}, {} SMs, {:.1f} GiB ({:.1f} free), driver {}, runtime {}", d.name,
                     d.sm_major, d.sm_minor, d.multiprocessors,
                     static_cast<double>(d.total_bytes) / kGiB,
                     static_cast<double>(d.free_bytes) / kGiB, version_text(d.driver_version),
                     version_text(d.runtime_version));
}

#ifdef STRATA_HAVE_CUDA

Result<DeviceInfo> probe_device(int ordinal) {
  DeviceInfo info;
  info.ordinal = ordinal;
  cudaDriverGetVersion(&info.driver_version);  // 0 when no driver is installed
  cudaRuntimeGetVersion(&info.runtime_version);
  if (info.driver_version == 0) {
    return std::unexpected(Error{ErrorCode::kUnsupported,
                                 "no NVIDIA driver found (libcuda.so could not be loaded): install "
                                 "the driver, or run without --device cuda"});
  }
  if (info.driver_version < info.runtime_version) {
    return std::unexpected(
        Error{ErrorCode::kUnsupported,
              fmt::format("the NVIDIA driver supports CUDA {}, older than the CUDA runtime {} this "
                          "strata was built with: update the driver",
                          version_text(info.driver_version), version_text(info.runtime_version))});
  }
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    if (e == cudaErrorNoDevice)
      count = 0;
    else
      return std::unexpected(cuda_error(e, "counting CUDA devices"));
  }
  if (count == 0) {
    return std::unexpected(Error{ErrorCode::kUnsupported, "no CUDA device found"});
  }
  if (ordinal < 0 || ordinal >= count) {
    return std::unexpected(
        Error{ErrorCode::kUnsupported,
              fmt::format("CUDA device {} asked for, and this machine has {} (0 to {})", ordinal,
                          count, count - 1)});
  }
  cudaDeviceProp prop{};
  if (const cudaError_t e = cudaGetDeviceProperties(&prop, ordinal); e != cudaSuccess) {
    return std::unexpected(cuda_error(e, "reading the device's properties"));
  }
  info.name = prop.name;
  info.sm_major = prop.major;
  info.sm_minor = prop.minor;
  info.multiprocessors = prop.multiProcessorCount;
  if (info.sm_major < kMinSmMajor) {
    return std::unexpected(
        Error{ErrorCode::kUnsupported,
              fmt::format("{} is sm_{}{}; Strata's CUDA kernels need sm_{}0 or newer (H100, H200)",
                          info.name, info.sm_major, info.sm_minor, kMinSmMajor)});
  }
  if (const cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) {
    return std::unexpected(cuda_error(e, "selecting the device"));
  }
  size_t free_bytes = 0, total_bytes = 0;
  if (const cudaError_t e = cudaMemGetInfo(&free_bytes, &total_bytes); e != cudaSuccess) {
    return std::unexpected(cuda_error(e, "reading the device's memory"));
  }
  info.free_bytes = static_cast<int64_t>(free_bytes);
  info.total_bytes = static_cast<int64_t>(total_bytes);
  return info;
}

Result<Stream> Stream::create() {
  cudaStream_t s = nullptr;
  if (const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      e != cudaSuccess) {
    return std::unexpected(cuda_error(e, "creating a stream"));
  }
  Stream out;
  out.handle_ = s;
  return out;
}

Stream::~Stream() {
  if (handle_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(handle_));
}

Status Stream::synchronize() const {
  if (const cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(handle_));
      e != cudaSuccess) {
    return std::unexpected(cuda_error(e, "synchronizing a stream"));
  }
  return {};
}

Result<DeviceBuffer> DeviceBuffer::allocate(size_t bytes) {
  DeviceBuffer out;
  if (bytes == 0) return out;
  if (const cudaError_t e = cudaMalloc(&out.data_, bytes); e != cudaSuccess) {
    cudaGetLastError();  // clear it: an allocation failure is not sticky
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    Error err = cuda_error(
        e, fmt::format("allocating {} bytes of device memory ({} free)", bytes, free_bytes));
    return std::unexpected(std::move(err));
  }
  out.size_ = bytes;
  return out;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

namespace {

// A synchronous copy of `bytes` within a buffer of `size` bytes.
Status copy_bytes(void* dst, const void* src, size_t bytes, size_t size, cudaMemcpyKind kind,
                  std::string_view what) {
  if (bytes > size) return bad_argument("copy larger than the device buffer");
  if (bytes == 0) return {};
  if (const cudaError_t e = cudaMemcpy(dst, src, bytes, kind); e != cudaSuccess) {
    return std::unexpected(cuda_error(e, what));
  }
  return {};
}

}  // namespace

Status DeviceBuffer::copy_from_host(const void* src, size_t bytes) {
  return copy_bytes(data_, src, bytes, size_, cudaMemcpyHostToDevice, "copying to the device");
}

Status DeviceBuffer::copy_to_host(void* dst, size_t bytes) const {
  return copy_bytes(dst, data_, bytes, size_, cudaMemcpyDeviceToHost, "copying from the device");
}

Status DeviceBuffer::zero() {
  if (size_ == 0) return {};
  if (const cudaError_t e = cudaMemset(data_, 0, size_); e != cudaSuccess) {
    return std::unexpected(cuda_error(e, "clearing device memory"));
  }
  return {};
}

Result<double> device_copy_bandwidth(size_t bytes, int repeats) {
  if (bytes == 0 || repeats < 1) return bad_argument("device_copy_bandwidth: no bytes or runs");
  auto src = DeviceBuffer::allocate(bytes);
  if (!src) return std::unexpected(src.error());
  auto dst = DeviceBuffer::allocate(bytes);
  if (!dst) return std::unexpected(dst.error());
  if (auto z = src->zero(); !z) return std::unexpected(z.error());
  cudaEvent_t start = nullptr, stop = nullptr;
  if (const cudaError_t e = cudaEventCreate(&start); e != cudaSuccess) {
    return std::unexpected(cuda_error(e, "creating an event"));
  }
  if (const cudaError_t e = cudaEventCreate(&stop); e != cudaSuccess) {
    cudaEventDestroy(start);
    return std::unexpected(cuda_error(e, "creating an event"));
  }
  double best_s = 0;
  cudaError_t e = cudaSuccess;
  // One untimed copy first (the first touch of the pages).
  for (int r = -1; r < repeats && e == cudaSuccess; ++r) {
    e = cudaEventRecord(start, nullptr);
    if (e == cudaSuccess)
      e = cudaMemcpyAsync(dst->data(), src->data(), bytes, cudaMemcpyDeviceToDevice, nullptr);
    if (e == cudaSuccess) e = cudaEventRecord(stop, nullptr);
    if (e == cudaSuccess) e = cudaEventSynchronize(stop);
    float ms = 0;
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, start, stop);
    if (e == cudaSuccess && r >= 0 && (best_s == 0 || ms * 1e-3 < best_s)) best_s = ms * 1e-3;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (e != cudaSuccess) return std::unexpected(cuda_error(e, "timing a device-to-device copy"));
  if (best_s <= 0) return make_error(ErrorCode::kInternal, "a device copy took no time");
  return 2.0 * static_cast<double>(bytes) / best_s;
}

#else  // no CUDA in this build

Result<double> device_copy_bandwidth(size_t, int) {
  return std::unexpected(no_cuda());
}
Result<DeviceInfo> probe_device(int) {
  return std::unexpected(no_cuda());
}
Result<Stream> Stream::create() {
  return std::unexpected(no_cuda());
}
Stream::~Stream() = default;
Status Stream::synchronize() const {
  return std::unexpected(no_cuda());
}
Result<DeviceBuffer> DeviceBuffer::allocate(size_t) {
  return std::unexpected(no_cuda());
}
DeviceBuffer::~DeviceBuffer() = default;
Status DeviceBuffer::copy_from_host(const void*, size_t) {
  return std::unexpected(no_cuda());
}
Status DeviceBuffer::copy_to_host(void*, size_t) const {
  return std::unexpected(no_cuda());
}
Status DeviceBuffer::zero() {
  return std::unexpected(no_cuda());
}

#endif

Stream::Stream(Stream&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Stream old(std::move(*this));
    handle_ = std::exchange(other.handle_, nullptr);
  }
  return *this;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    DeviceBuffer old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace strata::cuda
