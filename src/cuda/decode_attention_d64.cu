// decode_attention for head_dim 64 (decode_attention.cuh): one instantiation per file.
#include "cuda/decode_attention.cuh"

namespace strata::cuda::detail {

int launch_decode_attention_d64(const DecodeAttentionArgs& args, StreamHandle stream) {
  return launch_decode_attention<64>(args, stream);
}

}  // namespace strata::cuda::detail
