#include "cuda/gemm.h"

#include <fmt/format.h>

#include <cstdlib>
#include <map>
#include <string>
#include <tuple>
#include <vector>

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

// The names dlopen tries after STRATA_CUBLASLT (a full path), in order.
constexpr const char* kLibraries[] = {"libcublasLt.so.13", "libcublasLt.so"};

// cuBLASLt as this process loaded it: the library, its entry points and one handle. Made
// once, on the first Gemm::create, and kept until the process ends: neither dlclose'd nor
// destroyed, since at exit the CUDA runtime may already be torn down beneath it (and a
// library some thread may still call into must not be unloaded). The handle is shared by
// every Gemm (cuBLASLt's handle may be used from several threads at once); it belongs to
// device 0, the only one Strata uses.
struct LtLibrary {
  void* library = nullptr;
  LtApi api;
  cublasLtHandle_t handle = nullptr;
};

std::string status_name(const LtApi& api, cublasStatus_t st) {
  return api.status_name != nullptr ? api.status_name(st)
                                    : fmt::format("status {}", static_cast<int>(st));
}

Result<LtLibrary> load_lt_library() {
  LtLibrary lt;
  std::vector<std::string> names;
  if (const char* path = std::getenv("STRATA_CUBLASLT"); path != nullptr && *path != '\0') {
    names.emplace_back(path);
  }
  for (const char* name : kLibraries) names.emplace_back(name);
  std::string tried, loaded;
  for (const std::string& name : names) {
    lt.library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lt.library != nullptr) {
      loaded = name;
      break;
    }
    const char* why = dlerror();
    tried += fmt::format("{}{} ({})", tried.empty() ? "" : "; ", name,
                         why != nullptr ? why : "not found");
  }
  if (lt.library == nullptr) {
    const char* ld = std::getenv("LD_LIBRARY_PATH");
    return make_error(ErrorCode::kUnsupported,
                      fmt::format("cuBLASLt could not be loaded; tried {}; LD_LIBRARY_PATH={}: "
                                  "install CUDA's cuBLAS, put its library directory on "
                                  "LD_LIBRARY_PATH, or set STRATA_CUBLASLT to the library's path",
                                  tried, ld != nullptr ? ld : "(unset)"));
  }
  bool all = true;
  std::string missing;
  const auto resolve = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lt.library, symbol));
    if (fn == nullptr) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", symbol);
    all = all && fn != nullptr;
  };
  resolve(lt.api.create, "cublasLtCreate");
  resolve(lt.api.destroy, "cublasLtDestroy");
  resolve(lt.api.status_name, "cublasLtGetStatusName");
  resolve(lt.api.desc_create, "cublasLtMatmulDescCreate");
  resolve(lt.api.desc_destroy, "cublasLtMatmulDescDestroy");
  resolve(lt.api.desc_set, "cublasLtMatmulDescSetAttribute");
  resolve(lt.api.layout_create, "cublasLtMatrixLayoutCreate");
  resolve(lt.api.layout_destroy, "cublasLtMatrixLayoutDestroy");
  resolve(lt.api.pref_create, "cublasLtMatmulPreferenceCreate");
  resolve(lt.api.pref_destroy, "cublasLtMatmulPreferenceDestroy");
  resolve(lt.api.pref_set, "cublasLtMatmulPreferenceSetAttribute");
  resolve(lt.api.heuristic, "cublasLtMatmulAlgoGetHeuristic");
  resolve(lt.api.matmul, "cublasLtMatmul");
  if (!all) {
    return make_error(
        ErrorCode::kUnsupported,
        fmt::format("{} lacks cuBLASLt entry points Strata needs: {}", loaded, missing));
  }
  if (auto device = probe_device(0); !device) return std::unexpected(device.error());
  if (const cublasStatus_t st = lt.api.create(&lt.handle); st != CUBLAS_STATUS_SUCCESS) {
    return make_error(ErrorCode::kInternal,
                      fmt::format("cuBLASLt Create: {}", status_name(lt.api, st)));
  }
  return lt;
}

// The process's cuBLASLt: loaded on the first call (a function-local static, so two threads
// making models at once load it once), the same answer (or error) after.
const Result<LtLibrary>& lt_library() {
  static const Result<LtLibrary> loaded = load_lt_library();
  return loaded;
}

}  // namespace

// One planned shape: y (n x m, column-major) = op(w) x, cuBLASLt's view of row-major
// y = x w^T (w stored [n][k] row-major is k x n column-major, transposed; x [m][k] is
// k x m column-major).
struct GemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w = nullptr, x = nullptr, y = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// The process's library and handle (lt_library) with what is each Gemm's own: the plans and
// the workspace. Two models' streams may run products at once, and a workspace shared by two
// products in flight would be written by both; the plans are planned for this workspace's
// size and are cheap.
struct Gemm::Impl {
  LtApi api;                          // lt_library()'s
  cublasLtHandle_t handle = nullptr;  // lt_library()'s, not destroyed here
  DeviceBuffer workspace;
  std::map<std::tuple<int64_t, int64_t, int64_t, bool>, GemmPlan> plans;

  ~Impl() {
    for (auto& [shape, p] : plans) release(p);
  }

  void release(GemmPlan& p) const {
    if (p.w != nullptr) api.layout_destroy(p.w);
    if (p.x != nullptr) api.layout_destroy(p.x);
    if (p.y != nullptr) api.layout_destroy(p.y);
    if (p.op != nullptr) api.desc_destroy(p.op);
  }

  Status failed(cublasStatus_t st, const std::string& what) const {
    return make_error(ErrorCode::kInternal,
                      fmt::format("cuBLASLt {}: {}", what, status_name(api, st)));
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
  const Result<LtLibrary>& lt = lt_library();
  if (!lt) return std::unexpected(lt.error());
  std::unique_ptr<Gemm> g(new Gemm());
  Impl& i = *g->impl_;
  i.api = lt->api;
  i.handle = lt->handle;
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
