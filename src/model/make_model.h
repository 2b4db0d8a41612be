// Random-weight models in Hugging Face format, for tests, demos and benchmarks (no model
// can be downloaded on the machines Strata is built on). Same seed, same bytes.
//
// Presets (every architecture):
//   tiny   hidden 64, 2 layers, 4 heads, 2 KV heads, FFN 128 (Qwen3: head_dim 32) —
//          builds and runs in milliseconds; the tests' model.
//   demo   hidden 256, 4 layers, 8 heads, 4 KV heads, FFN 768 (Qwen3: head_dim 64).
//   bench  hidden 512, 8 layers, 8 heads, 4 KV heads, FFN 1536, SwiGLU, vocabulary
//          32,000 unless a tokenizer needs more — the performance-target model.
//   qwen3-0.6b, qwen3-1.7b, qwen3-8b  the shapes of Qwen3's published configs (hidden
//          1024/2048/4096, 28/28/36 layers, 16/16/32 heads, 8 KV heads, head_dim 128, FFN
//          3072/6144/12288, vocabulary 151,936, the two small ones with a tied LM head),
//          random weights: the GPU benchmarks' models (issue 30).
//
// Initialisation keeps activations sane and sampling non-degenerate: matrices normal
// with std 0.02, except q/k projections (1/sqrt(hidden): attention is neither uniform
// nor one-hot), the embedding (1/sqrt(hidden)) and lm_head (2/sqrt(hidden): logits of
// standard deviation about 2); norm weights 1 + N(0, 0.1^2); biases N(0, 0.1^2). Every
// tensor has its own random stream derived from the seed and its name, so the bytes of
// one tensor do not depend on the others.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"
#include "model/model.h"
#include "model/model_config.h"
#include "model/safetensors.h"

namespace strata {

enum class ModelPreset : uint8_t {
  kTiny,
  kDemo,
  kBench,
  kQwen3_0_6B,
  kQwen3_1_7B,
  kQwen3_8B,
};

std::string_view model_preset_name(ModelPreset preset);
// "tiny", "demo", "bench", "qwen3-0.6b", "qwen3-1.7b", "qwen3-8b" (any case).
Result<ModelPreset> parse_model_preset(std::string_view name);
// The Qwen3 shapes (qwen3-*): the published models' sizes with random weights, for the GPU
// benchmarks (an 8B folder is 16 GB in BF16, made where it runs).
bool is_shape_preset(ModelPreset preset);
// The architecture a preset is made in when none is named: Qwen3 for its shapes, Llama
// otherwise.
Architecture preset_architecture(ModelPreset preset);
// "llama", "mistral", "qwen2", "qwen3".
Result<Architecture> parse_architecture(std::string_view name);

// The preset's config for `arch`. The vocabulary defaults to the generated tokenizer's
// (tiny, demo) or 32,000 (bench); special ids are the generated tokenizer's.
ModelConfig preset_config(ModelPreset preset, Architecture arch,
                          std::optional<int32_t> vocab_size = std::nullopt);

// Random weights for `config` under their Hugging Face names, stored as `dtype`.
// `lm_head_scale` multiplies the LM head's standard deviation (the embedding's when they are
// tied): logits of standard deviation about 2 × it, a sharper softmax at a given
// temperature (the GPU tests use 8). It does not keep a GPU's BF16 rounding from flipping a
// greedy choice between two runs that should agree: scaling the logits scales their rounding
// errors alike (exactly, for a power of two), so the top two tokens' margin relative to the
// error is what it was. Greedy comparisons across devices count near-ties instead
// (tests/cuda/gpu_test_util.h, expect_greedy_choices).
TensorStore make_random_tensors(const ModelConfig& config, uint64_t seed, TensorDtype dtype,
                                double lm_head_scale = 1.0);

// The preset's model in memory, without files.
Result<std::unique_ptr<Model>> make_preset_model(ModelPreset preset, Architecture arch,
                                                 uint64_t seed, const ModelOptions& options = {},
                                                 std::optional<int32_t> vocab_size = std::nullopt);

struct MakeModelOptions {
  std::filesystem::path out_dir;  // created if missing; existing model files are replaced
  ModelPreset preset = ModelPreset::kTiny;
  Architecture arch = Architecture::kLlama;
  uint64_t seed = 0;
  TensorDtype dtype = TensorDtype::kF32;
  // Copy this tokenizer (its vocabulary size and special ids then rule the config);
  // empty: generate the small byte-level BPE tokenizer.
  std::optional<std::filesystem::path> tokenizer_dir;
  // Overrides the vocabulary size; must cover the tokenizer's largest id.
  std::optional<int32_t> vocab_size;
  int num_shards = 1;  // > 1: model-0000i-of-0000n.safetensors + index
  // Overrides the preset's head size (the GPU kernels take 64 and 128; the tiny preset's is
  // 16 or 32): the query and KV widths follow it, the hidden size stays.
  std::optional<int32_t> head_dim;
  double lm_head_scale = 1.0;  // make_random_tensors'; > 0
  // Write <out_dir>/model.gguf of this type (model/make_gguf.h: f32 ... q4_k_m) with the
  // tokenizer and chat template in its metadata, instead of safetensors and config.json
  // (the tokenizer files are written beside it all the same).
  std::optional<std::string> gguf_type;
};

struct MadeModel {
  ModelConfig config;
  int64_t num_parameters = 0;
  uint64_t weight_bytes = 0;
};

// Writes config.json, generation_config.json, the weights and the tokenizer files (or,
// with gguf_type, model.gguf and the tokenizer files).
Result<MadeModel> make_model(const MakeModelOptions& options);

}  // namespace strata
