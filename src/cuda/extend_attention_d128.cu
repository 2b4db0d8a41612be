// extend_attention for head_dim 128 (extend_attention.cuh): one instantiation per file.
#include "cuda/extend_attention.cuh"

namespace strata::cuda::detail {

int launch_extend_attention_d128(const ExtendAttentionArgs& args, StreamHandle stream) {
  return launch_extend_attention<128>(args, stream);
}

}  // namespace strata::cuda::detail
