// Matrix products on the GPU through cuBLASLt (BF16 in, F32 accumulation), for the model's
// projections and its LM head.
//
// cuBLASLt is loaded on the first Gemm::create, once per process (dlopen of the path in
// STRATA_CUBLASLT when set, then libcublasLt.so.13, then libcublasLt.so), not linked: the
// binary starts without it and a CPU-only run never loads its few hundred megabytes; a GPU
// run without it fails at start, naming every name tried, why each failed and
// LD_LIBRARY_PATH. The GPU machine's copy comes with its CUDA or PyTorch installation
// (LD_LIBRARY_PATH, or STRATA_CUBLASLT). The library and one cuBLASLt handle are shared by
// every Gemm of the process and kept until it ends.
//
// Layout: row-major BF16, weights in nn.Linear's [out_features][in_features], so
// y = x W^T as the CPU engine computes it (model/weights.h). Each shape (m, n, k, output
// type) is planned once per Gemm — descriptors and cuBLASLt's best algorithm for the
// workspace — and reused: the same shape gives the same algorithm, hence the same bits.
//
// Threads: a Gemm is used from one thread at a time (its model's forward thread); Gemms
// of different models may run at once (each has its own workspace and plans).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/result.h"
#include "cuda/kernel_args.h"

namespace strata::cuda {

// cuBLASLt's workspace unless told otherwise (device memory, allocated once).
inline constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;

class Gemm {
 public:
  // Loads cuBLASLt and makes its handle if this process has not yet (thread-safe), and a
  // workspace of `workspace_bytes` of device memory for this Gemm. kUnsupported naming what
  // is missing (a build without CUDA, the library, a device); a failed load is not retried.
  static Result<std::unique_ptr<Gemm>> create(size_t workspace_bytes = kGemmWorkspaceBytes);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // y[m][n] = x[m][k] . w[n][k]^T, queued on `stream`: x and w BF16 (device memory), y BF16
  // or, with y_f32, F32. kInvalidArgument for a size < 1 or a null pointer; kInternal with
  // cuBLASLt's status when it refuses.
  Status linear(const uint16_t* x, const uint16_t* w, void* y, bool y_f32, int64_t m, int64_t n,
                int64_t k, StreamHandle stream);

 private:
  Gemm();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::cuda
