// The GPU as the rest of Strata sees it: whether this build has the CUDA path, what the
// device is (or a clear reason why there is none), device memory and streams. Plain C++:
// no CUDA header reaches the code that includes this one, so the engine, the tests and the
// command line compile the same with and without CUDA (STRATA_CUDA in CMakeLists.txt).
//
// Contract. Every call returns an error value rather than throwing or aborting: a build
// without CUDA answers "built without CUDA" (kUnsupported), a machine without a usable GPU
// names what is missing (no device, a driver older than the runtime, a device older than
// sm_90). Device memory and streams are owned by RAII types that free them on destruction;
// nothing here synchronizes the device except the explicit copy and synchronize calls.
//
// Thread: a DeviceBuffer or Stream is used from one thread at a time; probe_device may be
// called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/result.h"
#include "cuda/kernel_args.h"

namespace strata::cuda {

// Whether this build has the CUDA path (STRATA_CUDA found nvcc, or was ON).
bool built_with_cuda();

// The oldest compute capability the kernels are built for (sm_90a: H100, H200).
inline constexpr int kMinSmMajor = 9;

struct DeviceInfo {
  int ordinal = 0;
  std::string name;  // "NVIDIA H200"
  int sm_major = 0;  // compute capability
  int sm_minor = 0;
  int multiprocessors = 0;
  int64_t total_bytes = 0;  // device memory
  int64_t free_bytes = 0;   // free when probed
  int driver_version = 0;   // cudaDriverGetVersion: 13000 = CUDA 13.0
  int runtime_version = 0;  // cudaRuntimeGetVersion
};

// The device `ordinal`, checked usable by this build: kUnsupported when the build has no
// CUDA, there is no device (or not that many), the driver is older than the runtime, or the
// device's compute capability is below kMinSmMajor; the message says which, with the
// versions it saw.
Result<DeviceInfo> probe_device(int ordinal = 0);

// "NVIDIA H200, sm_90, 132 SMs, 139.8 GiB (139.1 free), driver 13.0, runtime 13.0".
std::string describe(const DeviceInfo& info);

// Device memory's bandwidth as a copy within it sees it: bytes read plus bytes written per
// second by one cudaMemcpy of `bytes` between two device buffers, the best of `repeats`
// timed with events (one untimed copy first). The floor of a decode step, which reads
// every weight once (`strata bench forward --device cuda`; issue 30).
Result<double> device_copy_bandwidth(size_t bytes, int repeats = 5);

// A stream the caller owns (non-blocking with respect to the default stream).
class Stream {
 public:
  static Result<Stream> create();
  Stream() = default;
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  StreamHandle handle() const { return handle_; }
  // Waits for everything queued on the stream; the first error the device reported.
  Status synchronize() const;

 private:
  StreamHandle handle_ = nullptr;
};

// Device memory of a fixed size, freed on destruction.
class DeviceBuffer {
 public:
  // kResourceExhausted (with the size and what was free) when the device has not the room.
  static Result<DeviceBuffer> allocate(size_t bytes);
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

  // Synchronous copies of `bytes` (<= size()) from and to host memory.
  Status copy_from_host(const void* src, size_t bytes);
  Status copy_to_host(void* dst, size_t bytes) const;
  // Sets every byte to zero (synchronously).
  Status zero();

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace strata::cuda
