// extend_attention on tensor cores for head_dim 128 (extend_attention_tc.cuh): one
// instantiation per file.
#include "cuda/extend_attention_tc.cuh"

namespace strata::cuda::detail {

int launch_extend_attention_tc_d128(const ExtendAttentionArgs& args, StreamHandle stream) {
  return launch_extend_attention_tc<128>(args, stream);
}

}  // namespace strata::cuda::detail
