// Models from GGUF files: the config from the `<arch>.*` metadata and the weights by
// GGUF's tensor names, for the llama, mistral, qwen2 and qwen3 architectures.
//
// Tensor names: token_embd, output_norm, output (absent: tied to token_embd), and per
// layer blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, attn_q_norm, attn_k_norm
// (qwen3), ffn_norm, ffn_gate, ffn_up, ffn_down} with .weight (and .bias for q, k, v,
// output when present: qwen2). A GGUF matrix has ne = [in, out]: out rows of in values,
// Hugging Face's [out][in].
//
// Rotary layout: llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel) permutes the
// rows of attn_q and attn_k for the llama architecture (mistral's files are llama too), so
// that its "normal" RoPE rotates adjacent pairs: within each head of d rows, row 2i + j
// of the file is Hugging Face's row j * d/2 + i (i < d/2, j in {0, 1}); q with the
// query heads, k with the KV heads. Strata rotates Hugging Face's halves, so the loader
// undoes it (rows are whole blocks: a permutation of rows is exact for every type).
// qwen2 and qwen3 files are not permuted (llama.cpp's NEOX RoPE rotates halves).
//
// Weights: each matrix keeps its file type when Strata multiplies it (Q8_0, Q4_0, Q4_K,
// Q5_K, Q6_K, BF16, F32); F16 matrices become F32. With a dtype override every matrix is
// converted to it instead (F32: Strata's own F32 forward on the dequantized weights).
// The weights are copied once out of the mapping into Strata's fused layout (q, k, v
// stacked; gate, up stacked; parts when their types differ), and the file unmapped.
#pragma once

#include <filesystem>
#include <optional>

#include "common/result.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/weights.h"

namespace strata {

// kUnsupported for another architecture, a RoPE scaling other than none/linear, or Llama
// 3's rope_freqs tensor; kNotFound / kInvalidArgument for a missing or ill-typed key.
Result<ModelConfig> gguf_model_config(const GgufFile& file);

// kNotFound for a missing tensor, kInvalidArgument for a wrong shape, kUnsupported for a
// type Strata does not multiply (each naming the tensor and its type).
Result<ModelWeights> load_gguf_weights(const GgufFile& file, const ModelConfig& config,
                                       std::optional<WeightDtype> dtype = std::nullopt);

// Whether `path` is a file that starts with GGUF's magic.
bool is_gguf_file(const std::filesystem::path& path);

}  // namespace strata
