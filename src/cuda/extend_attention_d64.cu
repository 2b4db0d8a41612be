// extend_attention for head_dim 64 (extend_attention.cuh): one instantiation per file.
#include "cuda/extend_attention.cuh"

namespace strata::cuda::detail {

int launch_extend_attention_d64(const ExtendAttentionArgs& args, StreamHandle stream) {
  return launch_extend_attention<64>(args, stream);
}

}  // namespace strata::cuda::detail
