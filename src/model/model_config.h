// The model's hyper-parameters, read from a Hugging Face `config.json`.
//
// Supported architectures: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM
// (q/k/v biases), Qwen3ForCausalLM (per-head RMSNorm on q and k). Everything the forward
// pass depends on is validated here once, so that later code can rely on it: positive
// sizes, num_heads a multiple of num_kv_heads, an even head_dim, SiLU activation, a
// known RoPE scaling.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/result.h"

namespace strata {

enum class Architecture : uint8_t {
  kLlama,    // LlamaForCausalLM
  kMistral,  // MistralForCausalLM (Llama plus an optional sliding window)
  kQwen2,    // Qwen2ForCausalLM: biases on q, k, v
  kQwen3,    // Qwen3ForCausalLM: RMSNorm over each head of q and k before RoPE
};

// "LlamaForCausalLM", ...
std::string_view architecture_class_name(Architecture arch);
// "llama", "mistral", "qwen2", "qwen3" (config.json's model_type).
std::string_view architecture_model_type(Architecture arch);

enum class RopeScalingType : uint8_t {
  kNone,
  kLinear,  // positions divided by `factor`
  kLlama3,  // Llama 3.1's frequency-dependent scaling
};

struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  double factor = 1.0;                              // linear and llama3
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  int32_t vocab_size = 0;
  int32_t hidden_size = 0;
  int32_t intermediate_size = 0;
  int32_t num_layers = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;  // may differ from hidden_size / num_heads (Qwen3)
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;       // q_proj, k_proj, v_proj carry biases (Qwen2; Llama attention_bias)
  bool o_bias = false;         // o_proj carries a bias (Llama attention_bias)
  bool qk_norm = false;        // q_norm and k_norm per head (Qwen3)
  int64_t sliding_window = 0;  // > 0: each token sees only the last `sliding_window` tokens
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;
  std::string torch_dtype = "float32";  // informational: the dtype the checkpoint declares

  int32_t q_size() const { return num_heads * head_dim; }
  int32_t kv_size() const { return num_kv_heads * head_dim; }
  int32_t group_size() const { return num_heads / num_kv_heads; }
};

// Checks the invariants listed at the top of this file.
Status validate_model_config(const ModelConfig& config);

// Parses a config.json document. Errors: kInvalidArgument for bad JSON or missing or
// ill-typed fields, kUnsupported for an unknown architecture, activation or RoPE
// scaling.
Result<ModelConfig> parse_model_config(std::string_view json_text);
Result<ModelConfig> model_config_from_json(const nlohmann::json& json);

// Reads `path`, or `path`/config.json when `path` is a directory. Also reads
// generation_config.json beside it when present, for eos ids the config lacks.
Result<ModelConfig> load_model_config(const std::filesystem::path& path);

// The config.json that a Hugging Face library would write for `config`.
nlohmann::json model_config_to_json(const ModelConfig& config);

}  // namespace strata
