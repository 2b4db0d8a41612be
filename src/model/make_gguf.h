// Writing a model as a GGUF file as llama.cpp's converter and quantizer would
// (`strata make-model --gguf TYPE`): the `<arch>.*` metadata, tensors under GGUF's names
// (model/gguf_model.h) with attn_q / attn_k rows permuted for the llama architecture,
// norms and biases in F32, and the matrices quantized (round to nearest, model/quant.h).
//
// Types: f32, f16, bf16, q8_0, q4_0, q4_k, q6_k, and q4_k_m, a mix like llama.cpp's
// Q4_K_M: Q6_K for the output matrix (token_embd when tied) and for attn_v and ffn_down
// in llama.cpp's "more bits" layers (the first and last eighth and every third between),
// Q4_K elsewhere. A matrix whose rows are not whole blocks of its type falls back to Q8_0
// (K-quants) or F32, as llama.cpp falls back for such tensors.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/safetensors.h"

namespace strata {

// The tokenizer as GGUF's `tokenizer.ggml.*` and `tokenizer.chat_template` keys hold it.
struct GgufTokenizerData {
  std::string model = "gpt2";  // tokenizer.ggml.model
  std::string pre;             // tokenizer.ggml.pre: the pre-tokenizer's name ("qwen2", ...)
  std::vector<std::string> tokens;
  std::vector<int32_t> token_types;  // 1 normal, 3 control, 4 user-defined, ... per token
  std::vector<std::string> merges;   // "a b"
  std::optional<int32_t> bos_id;
  std::optional<int32_t> eos_id;
  std::optional<int32_t> padding_id;
  bool add_bos = false;
  std::string chat_template;
};

// "f32", ..., "q4_k_m" (any case).
bool is_gguf_make_type(std::string_view name);

// The GGUF tensor type of HF tensor `name` (a matrix of `cols` columns) in a file of
// `make_type`; layer and num_layers pick Q4_K_M's more-bits layers.
GgmlType gguf_tensor_type(std::string_view make_type, std::string_view gguf_name, int64_t cols,
                          int layer, int num_layers, bool tied);

// Writes `tensors` (Hugging Face names and shapes, F32/F16/BF16) of a model of `config`
// as a GGUF file at `path`.
Status write_gguf_model(const std::filesystem::path& path, const ModelConfig& config,
                        const TensorSource& tensors, std::string_view make_type,
                        const GgufTokenizerData* tokenizer, const std::string& name);

// llama.cpp's converter's row order for attn_q / attn_k (llama): the HF row that row r
// of the file holds, within heads of head_dim rows.
int64_t gguf_permuted_source_row(int64_t r, int64_t head_dim);

}  // namespace strata
