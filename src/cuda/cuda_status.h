// Internal to src/cuda (the .cc files built with CUDA): CUDA's error codes as Strata's errors,
// "what: CUDA's description (its name)"; an allocation failure is kResourceExhausted, the
// rest kInternal.
#pragma once

#ifdef STRATA_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <string_view>

#include "common/result.h"

namespace strata::cuda::detail {

Error cuda_error(cudaError_t e, std::string_view what);

}  // namespace strata::cuda::detail
#endif
