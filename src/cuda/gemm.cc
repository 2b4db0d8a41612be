#include "cuda/gemm.h"

#include <fmt/format.h>

#include <map>
#include <tuple>

#ifdef STRATA_HAVE_CUDA
#include <cublasLt.h>
#include <dlfcn.h>

#include "cuda/cuda_device.h"
#endif

namespace strata::cuda {

#ifdef STRATA_HAVE_CUDA

namespace {

// The cuBLASLt entry points Gemm calls, resolved from the loaded library.
struct LtApi {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtDestroy) destroy = nullptr;
  decltype(&cublasLtGetStatusName) status_name = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
};

constexpr const char* kLibraries[] = {"libcublasLt.so.13", "libcublasLt.so"};

}  // namespace

// One planned shape: y (n x m, column-major) = op(w) x, cuBLASLt's view of row-major
// y = x w^T (w stored [n][k] row-major is k x n column-major, transposed; x [m][k] is
// k x m column-major).
struct GemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w = nullptr, x = nullptr, y = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

struct Gemm::Impl {
  void* library = nullptr;
  LtApi api;
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace;
  std::map<std::tuple<int64_t, int64_t, int64_t, bool>, GemmPlan> plans;

  ~Impl() {
    for (auto& [shape, p] : plans) release(p);
    if (handle != nullptr) api.destroy(handle);
    if (library != nullptr) dlclose(library);
  }

  void release(GemmPlan& p) const {
    if (p.w != nullptr) api.layout_destroy(p.w);
    if (p.x != nullptr) api.layout_destroy(p.x);
    if (p.y != nullptr) api.layout_destroy(p.y);
    if (p.op != nullptr) api.desc_destroy(p.op);
  }

  Status failed(cublasStatus_t st, const std::string& what) const {
    return make_error(ErrorCode::kInternal,
                      fmt::format("cuBLASLt {}: {}", what, api.status_name(st)));
  }

  Result<const GemmPlan*> plan(int64_t m, int64_t n, int64_t k, bool y_f32) {
    const auto key = std::make_tuple(m, n, k, y_f32);
    if (auto it = plans.find(key); it != plans.end()) return &it->second;
    GemmPlan p;
    const auto fail = [&](cublasStatus_t st, const char* what) {
      release(p);
      return std::unexpected(failed(st, fmt::format("{} ({} x {} x {})", what, m, n, k)).error());
    };
    cublasStatus_t st = api.desc_create(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    if (st != CUBLAS_STATUS_SUCCESS) return fail(st, "MatmulDescCreate");
    const cublasOperation_t transpose = CUBLAS_OP_T, none = CUBLAS_OP_N;
    st = api.desc_set(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose);
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = api.desc_set(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof none);
    }
    if (st != CUBLAS_STATUS_SUCCESS) return fail(st, "MatmulDescSetAttribute");
    st =
        api.layout_create(&p.w, CUDA_R_16BF, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k);
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = api.layout_create(&p.x, CUDA_R_16BF, static_cast<uint64_t>(k), static_cast<uint64_t>(m),
                             k);
    }
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = api.layout_create(&p.y, y_f32 ? CUDA_R_32F : CUDA_R_16BF, static_cast<uint64_t>(n),
                             static_cast<uint64_t>(m), n);
    }
    if (st != CUBLAS_STATUS_SUCCESS) return fail(st, "MatrixLayoutCreate");
    cublasLtMatmulPreference_t pref = nullptr;
    st = api.pref_create(&pref);
    if (st != CUBLAS_STATUS_SUCCESS) return fail(st, "MatmulPreferenceCreate");
    const size_t bytes = workspace.size();
    st = api.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof bytes);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS) {
      st = api.heuristic(handle, p.op, p.w, p.x, p.y, p.y, pref, 1, &result, &found);
    }
    api.pref_destroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS) return fail(st, "MatmulAlgoGetHeuristic");
    if (found < 1) return fail(CUBLAS_STATUS_NOT_SUPPORTED, "no algorithm for");
    p.algo = result.algo;
    return &plans.emplace(key, p).first->second;
  }
};

Gemm::Gemm() : impl_(std::make_unique<Impl>()) {}
Gemm::~Gemm() = default;

Result<std::unique_ptr<Gemm>> Gemm::create(size_t workspace_bytes) {
  std::unique_ptr<Gemm> g(new Gemm());
  Impl& i = *g->impl_;
  std::string tried;
  for (const char* name : kLibraries) {
    i.library = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (i.library != nullptr) break;
    tried += tried.empty() ? name : fmt::format(", {}", name);
  }
  if (i.library == nullptr) {
    return make_error(ErrorCode::kUnsupported,
                      fmt::format("cuBLASLt not found ({}): install CUDA's cuBLAS, or put its "
                                  "library directory on LD_LIBRARY_PATH",
                                  tried));
  }
  bool all = true;
  const auto resolve = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(i.library, symbol));
    all = all && fn != nullptr;
  };
  resolve(i.api.create, "cublasLtCreate");
  resolve(i.api.destroy, "cublasLtDestroy");
  resolve(i.api.status_name, "cublasLtGetStatusName");
  resolve(i.api.desc_create, "cublasLtMatmulDescCreate");
  resolve(i.api.desc_destroy, "cublasLtMatmulDescDestroy");
  resolve(i.api.desc_set, "cublasLtMatmulDescSetAttribute");
  resolve(i.api.layout_create, "cublasLtMatrixLayoutCreate");
  resolve(i.api.layout_destroy, "cublasLtMatrixLayoutDestroy");
  resolve(i.api.pref_create, "cublasLtMatmulPreferenceCreate");
  resolve(i.api.pref_destroy, "cublasLtMatmulPreferenceDestroy");
  resolve(i.api.pref_set, "cublasLtMatmulPreferenceSetAttribute");
  resolve(i.api.heuristic, "cublasLtMatmulAlgoGetHeuristic");
  resolve(i.api.matmul, "cublasLtMatmul");
  if (!all)
    return make_error(ErrorCode::kUnsupported, "cuBLASLt lacks an entry point Strata needs");
  if (auto device = probe_device(0); !device) return std::unexpected(device.error());
  if (const cublasStatus_t st = i.api.create(&i.handle); st != CUBLAS_STATUS_SUCCESS) {
    i.handle = nullptr;
    return std::unexpected(i.failed(st, "Create").error());
  }
  auto ws = DeviceBuffer::allocate(workspace_bytes);
  if (!ws) return std::unexpected(ws.error());
  i.workspace = std::move(*ws);
  return g;
}

Status Gemm::linear(const uint16_t* x, const uint16_t* w, void* y, bool y_f32, int64_t m, int64_t n,
                    int64_t k, StreamHandle stream) {
  if (m < 1 || n < 1 || k < 1) {
    return bad_argument(fmt::format("Gemm::linear: sizes {} x {} x {} (>= 1)", m, n, k));
  }
  if (x == nullptr || w == nullptr || y == nullptr) {
    return bad_argument("Gemm::linear: a null pointer");
  }
  auto p = impl_->plan(m, n, k, y_f32);
  if (!p) return std::unexpected(p.error());
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t st =
      impl_->api.matmul(impl_->handle, (*p)->op, &alpha, w, (*p)->w, x, (*p)->x, &beta, y, (*p)->y,
                        y, (*p)->y, &(*p)->algo, impl_->workspace.data(), impl_->workspace.size(),
                        static_cast<cudaStream_t>(stream));
  if (st != CUBLAS_STATUS_SUCCESS) {
    return impl_->failed(st, fmt::format("Matmul ({} x {} x {})", m, n, k));
  }
  return {};
}

#else  // without CUDA

struct Gemm::Impl {};

Gemm::Gemm() : impl_(std::make_unique<Impl>()) {}
Gemm::~Gemm() = default;

Result<std::unique_ptr<Gemm>> Gemm::create(size_t /*workspace_bytes*/) {
  return make_error(ErrorCode::kUnsupported,
                    "this strata was built without CUDA (STRATA_CUDA=OFF, or nvcc was not found "
                    "when it was configured)");
}

Status Gemm::linear(const uint16_t*, const uint16_t*, void*, bool, int64_t, int64_t, int64_t,
                    StreamHandle) {
  return make_error(ErrorCode::kUnsupported, "this strata was built without CUDA");
}

#endif

}  // namespace strata::cuda
