// The copy kernel of the KV tiers' kernel I/O path (cuda_copy_device.h): each thread block
// takes spans in turn and copies one with all its threads, 16 bytes per access where both
// ends are 16-byte aligned (the KV blocks always are), byte by byte otherwise. The host side
// is page-locked memory the device reads and writes over the bus.
#include <cuda_runtime.h>

#include "cuda/kernel_launch.h"

namespace strata::cuda::detail {

namespace {

constexpr int kCopyThreads = 512;

__global__ void copy_spans_kernel(const CopySpanArg* __restrict__ spans, int32_t count) {
  for (int32_t s = blockIdx.x; s < count; s += gridDim.x) {
    const CopySpanArg span = spans[s];
    const char* src = static_cast<const char*>(span.src);
    char* dst = static_cast<char*>(span.dst);
    uint64_t head = 0;
    if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0) {
      const uint64_t words = span.bytes / 16;
      const uint4* s4 = reinterpret_cast<const uint4*>(src);
      uint4* d4 = reinterpret_cast<uint4*>(dst);
      for (uint64_t i = threadIdx.x; i < words; i += blockDim.x) d4[i] = s4[i];
      head = words * 16;
    }
    for (uint64_t i = head + threadIdx.x; i < span.bytes; i += blockDim.x) dst[i] = src[i];
  }
}

}  // namespace

int launch_copy_spans(const CopySpanArg* spans, int32_t count, int32_t blocks,
                      StreamHandle stream) {
  if (count == 0) return 0;
  copy_spans_kernel<<<blocks, kCopyThreads, 0, static_cast<cudaStream_t>(stream)>>>(spans, count);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace strata::cuda::detail
