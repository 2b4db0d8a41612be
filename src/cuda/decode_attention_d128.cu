// decode_attention for head_dim 128 (decode_attention.cuh): one instantiation per file.
#include "cuda/decode_attention.cuh"

namespace strata::cuda::detail {

int launch_decode_attention_d128(const DecodeAttentionArgs& args, StreamHandle stream) {
  return launch_decode_attention<128>(args, stream);
}

}  // namespace strata::cuda::detail
