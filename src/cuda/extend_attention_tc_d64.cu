// extend_attention on tensor cores for head_dim 64 (extend_attention_tc.cuh): one
// instantiation per file.
#include "cuda/extend_attention_tc.cuh"

namespace strata::cuda::detail {

int launch_extend_attention_tc_d64(const ExtendAttentionArgs& args, StreamHandle stream) {
  return launch_extend_attention_tc<64>(args, stream);
}

}  // namespace strata::cuda::detail
