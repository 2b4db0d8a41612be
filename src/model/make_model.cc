#include "model/make_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/gguf_tokenizer.h"
#include "model/make_gguf.h"
#include "model/make_tokenizer.h"
#include "model/model_files.h"
#include "model/rng.h"

namespace strata {

namespace {

using nlohmann::json;

uint64_t name_hash(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// One tensor to draw: values mean + std * N(0, 1) from a stream of its own, seeded by the
// model's seed and the tensor's name.
struct RandomTensor {
  std::string name;
  std::vector<int64_t> shape;
  double mean = 0;
  double std = 0;
};

std::vector<float> draw_values(const RandomTensor& t, uint64_t seed) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  Rng rng(seed ^ name_hash(t.name));
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = static_cast<float>(t.mean + t.std * rng.normal());
  return values;
}

// Draws the tensors on several threads, a window of them at a time (so that no more than a
// window's values wait in F32), and adds them to the store in order. Each tensor's stream is
// its own, so the bytes do not depend on the threads (the 8B shape has 8 billion values).
void add_random_tensors(TensorStore& store, const std::vector<RandomTensor>& tensors, uint64_t seed,
                        TensorDtype dtype) {
  const size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 64);
  for (size_t first = 0; first < tensors.size(); first += threads) {
    const size_t count = std::min(threads, tensors.size() - first);
    std::vector<std::vector<float>> values(count);
    if (count == 1) {
      values[0] = draw_values(tensors[first], seed);
    } else {
      std::vector<std::jthread> workers;
      for (size_t i = 0; i < count; ++i) {
        workers.emplace_back([&, i] { values[i] = draw_values(tensors[first + i], seed); });
      }
    }
    for (size_t i = 0; i < count; ++i) {
      const RandomTensor& t = tensors[first + i];
      store.add_f32(t.name, dtype, t.shape, values[i]);
      values[i] = {};
    }
  }
}

Status write_json(const std::filesystem::path& path, const json& j) {
  std::ofstream out(path, std::ios::trunc);
  if (!out) return make_error(ErrorCode::kIoError, "cannot create " + path.string());
  out << j.dump(2) << "\n";
  out.close();
  if (!out) return make_error(ErrorCode::kIoError, "cannot write " + path.string());
  return {};
}

Result<MadeModel> make_model_files(const MakeModelOptions& options);

}  // namespace

std::string_view model_preset_name(ModelPreset preset) {
  switch (preset) {
    case ModelPreset::kTiny:
      return "tiny";
    case ModelPreset::kDemo:
      return "demo";
    case ModelPreset::kBench:
      return "bench";
    case ModelPreset::kQwen3_0_6B:
      return "qwen3-0.6b";
    case ModelPreset::kQwen3_1_7B:
      return "qwen3-1.7b";
    case ModelPreset::kQwen3_8B:
      return "qwen3-8b";
  }
  return "unknown";
}

Result<ModelPreset> parse_model_preset(std::string_view name) {
  const std::string n = ascii_lower(name);
  if (n == "tiny") return ModelPreset::kTiny;
  if (n == "demo") return ModelPreset::kDemo;
  if (n == "bench") return ModelPreset::kBench;
  if (n == "qwen3-0.6b") return ModelPreset::kQwen3_0_6B;
  if (n == "qwen3-1.7b") return ModelPreset::kQwen3_1_7B;
  if (n == "qwen3-8b") return ModelPreset::kQwen3_8B;
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown preset '" + std::string(name) +
                        "' (tiny, demo, bench, qwen3-0.6b, qwen3-1.7b, qwen3-8b)");
}

bool is_shape_preset(ModelPreset preset) {
  return preset == ModelPreset::kQwen3_0_6B || preset == ModelPreset::kQwen3_1_7B ||
         preset == ModelPreset::kQwen3_8B;
}

Architecture preset_architecture(ModelPreset preset) {
  return is_shape_preset(preset) ? Architecture::kQwen3 : Architecture::kLlama;
}

Result<Architecture> parse_architecture(std::string_view name) {
  const std::string n = ascii_lower(name);
  if (n == "llama") return Architecture::kLlama;
  if (n == "mistral") return Architecture::kMistral;
  if (n == "qwen2") return Architecture::kQwen2;
  if (n == "qwen3") return Architecture::kQwen3;
  return make_error(ErrorCode::kInvalidArgument, "unknown architecture '" + std::string(name) +
                                                     "' (llama, mistral, qwen2, qwen3)");
}

ModelConfig preset_config(ModelPreset preset, Architecture arch,
                          std::optional<int32_t> vocab_size) {
  ModelConfig c;
  c.architecture = arch;
  switch (preset) {
    case ModelPreset::kTiny:
      c.hidden_size = 64;
      c.num_layers = 2;
      c.num_heads = 4;
      c.num_kv_heads = 2;
      c.intermediate_size = 128;
      c.max_position_embeddings = 8192;
      c.vocab_size = kGeneratedVocabSize;
      break;
    case ModelPreset::kDemo:
      c.hidden_size = 256;
      c.num_layers = 4;
      c.num_heads = 8;
      c.num_kv_heads = 4;
      c.intermediate_size = 768;
      c.max_position_embeddings = 32768;
      c.vocab_size = kGeneratedVocabSize;
      break;
    case ModelPreset::kBench:
      c.hidden_size = 512;
      c.num_layers = 8;
      c.num_heads = 8;
      c.num_kv_heads = 4;
      c.intermediate_size = 1536;
      c.max_position_embeddings = 32768;
      c.vocab_size = 32000;
      break;
    // Qwen3's published configs (Qwen/Qwen3-*/config.json): head_dim 128, vocabulary 151,936,
    // 40,960 positions; the two small ones tie the LM head to the embedding.
    case ModelPreset::kQwen3_0_6B:
      c.hidden_size = 1024;
      c.num_layers = 28;
      c.num_heads = 16;
      c.num_kv_heads = 8;
      c.intermediate_size = 3072;
      break;
    case ModelPreset::kQwen3_1_7B:
      c.hidden_size = 2048;
      c.num_layers = 28;
      c.num_heads = 16;
      c.num_kv_heads = 8;
      c.intermediate_size = 6144;
      break;
    case ModelPreset::kQwen3_8B:
      c.hidden_size = 4096;
      c.num_layers = 36;
      c.num_heads = 32;
      c.num_kv_heads = 8;
      c.intermediate_size = 12288;
      break;
  }
  if (is_shape_preset(preset)) {
    c.max_position_embeddings = 40960;
    c.vocab_size = 151936;
  }
  c.head_dim = is_shape_preset(preset) ? 128 : c.hidden_size / c.num_heads;
  if (vocab_size) c.vocab_size = *vocab_size;
  switch (arch) {
    case Architecture::kLlama:
    case Architecture::kMistral:
      c.rope_theta = 500000.0;
      c.rms_norm_eps = 1e-5;
      c.tie_word_embeddings = false;
      break;
    case Architecture::kQwen2:
      c.rope_theta = 1000000.0;
      c.rms_norm_eps = 1e-6;
      c.qkv_bias = true;
      c.tie_word_embeddings = false;
      break;
    case Architecture::kQwen3:
      c.rope_theta = 1000000.0;
      c.rms_norm_eps = 1e-6;
      c.qk_norm = true;
      // Untied: with a random embedding shared by input and output, the residual stream
      // carries the input token's embedding straight to the logits and greedy decoding
      // repeats the input token forever.
      c.tie_word_embeddings = false;
      // Qwen3 decouples head_dim from hidden / heads; the presets do too.
      if (!is_shape_preset(preset)) c.head_dim = preset == ModelPreset::kTiny ? 32 : 64;
      break;
  }
  // The shapes' own tying (the real checkpoints'), whatever the architecture.
  if (is_shape_preset(preset)) c.tie_word_embeddings = preset != ModelPreset::kQwen3_8B;
  // The generated tokenizer's special ids (make_tokenizer.h).
  c.bos_token_id = kGeneratedRegularTokens + 3;
  c.eos_token_ids = {kGeneratedRegularTokens + 2, kGeneratedRegularTokens};
  return c;
}

TensorStore make_random_tensors(const ModelConfig& c, uint64_t seed, TensorDtype dtype,
                                double lm_head_scale) {
  std::vector<RandomTensor> tensors;
  auto add_random = [&](std::string name, std::vector<int64_t> shape, double mean, double std) {
    tensors.push_back(RandomTensor{std::move(name), std::move(shape), mean, std});
  };
  const int64_t hidden = c.hidden_size;
  const double inv_sqrt_hidden = 1.0 / std::sqrt(static_cast<double>(hidden));
  const double std_w = 0.02;
  add_random("model.embed_tokens.weight", {c.vocab_size, hidden}, 0.0,
             inv_sqrt_hidden * (c.tie_word_embeddings ? lm_head_scale : 1.0));
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add_random(p + "input_layernorm.weight", {hidden}, 1.0, 0.1);
    add_random(p + "post_attention_layernorm.weight", {hidden}, 1.0, 0.1);
    add_random(p + "self_attn.q_proj.weight", {c.q_size(), hidden}, 0.0, inv_sqrt_hidden);
    add_random(p + "self_attn.k_proj.weight", {c.kv_size(), hidden}, 0.0, inv_sqrt_hidden);
    add_random(p + "self_attn.v_proj.weight", {c.kv_size(), hidden}, 0.0, std_w);
    add_random(p + "self_attn.o_proj.weight", {hidden, c.q_size()}, 0.0, std_w);
    if (c.qkv_bias) {
      add_random(p + "self_attn.q_proj.bias", {c.q_size()}, 0.0, 0.1);
      add_random(p + "self_attn.k_proj.bias", {c.kv_size()}, 0.0, 0.1);
      add_random(p + "self_attn.v_proj.bias", {c.kv_size()}, 0.0, 0.1);
    }
    if (c.o_bias) {
      add_random(p + "self_attn.o_proj.bias", {hidden}, 0.0, 0.1);
    }
    if (c.qk_norm) {
      add_random(p + "self_attn.q_norm.weight", {c.head_dim}, 1.0, 0.1);
      add_random(p + "self_attn.k_norm.weight", {c.head_dim}, 1.0, 0.1);
    }
    add_random(p + "mlp.gate_proj.weight", {c.intermediate_size, hidden}, 0.0, std_w);
    add_random(p + "mlp.up_proj.weight", {c.intermediate_size, hidden}, 0.0, std_w);
    add_random(p + "mlp.down_proj.weight", {hidden, c.intermediate_size}, 0.0, std_w);
  }
  add_random("model.norm.weight", {hidden}, 1.0, 0.1);
  if (!c.tie_word_embeddings) {
    add_random("lm_head.weight", {c.vocab_size, hidden}, 0.0,
               2.0 * inv_sqrt_hidden * lm_head_scale);
  }
  TensorStore store;
  add_random_tensors(store, tensors, seed, dtype);
  return store;
}

Result<std::unique_ptr<Model>> make_preset_model(ModelPreset preset, Architecture arch,
                                                 uint64_t seed, const ModelOptions& options,
                                                 std::optional<int32_t> vocab_size) {
  const ModelConfig config = preset_config(preset, arch, vocab_size);
  if (auto s = validate_model_config(config); !s) return std::unexpected(s.error());
  try {
    const TensorStore tensors = make_random_tensors(config, seed, TensorDtype::kF32);
    return Model::from_tensors(config, tensors, options);
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kResourceExhausted, "out of memory making the random weights");
  }
}

Result<MadeModel> make_model(const MakeModelOptions& options) {
  try {
    return make_model_files(options);
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kResourceExhausted, "out of memory making the random weights");
  } catch (const std::filesystem::filesystem_error& e) {
    return make_error(ErrorCode::kIoError, e.what());
  }
}

namespace {

Result<MadeModel> make_model_files(const MakeModelOptions& options) {
  std::error_code ec;
  std::filesystem::create_directories(options.out_dir, ec);
  if (ec) {
    return make_error(ErrorCode::kIoError,
                      "cannot create " + options.out_dir.string() + ": " + ec.message());
  }
  if (options.num_shards < 1) {
    return make_error(ErrorCode::kInvalidArgument, "num_shards must be >= 1");
  }
  if (!(options.lm_head_scale > 0)) {
    return make_error(ErrorCode::kInvalidArgument, "lm_head_scale must be > 0");
  }
  ModelConfig config = preset_config(options.preset, options.arch);
  if (options.head_dim) config.head_dim = *options.head_dim;
  TokenizerInfo tokenizer;
  std::optional<GeneratedTokenizer> generated;
  if (options.tokenizer_dir) {
    auto info = inspect_tokenizer_dir(*options.tokenizer_dir);
    if (!info) return std::unexpected(info.error());
    tokenizer = *info;
    config.vocab_size = tokenizer.vocab_size;
  } else {
    generated = make_byte_level_bpe_tokenizer(config.max_position_embeddings);
    tokenizer = generated->info;
    config.vocab_size = std::max(config.vocab_size, tokenizer.vocab_size);
  }
  if (options.vocab_size) {
    if (*options.vocab_size < tokenizer.vocab_size) {
      return make_error(ErrorCode::kInvalidArgument,
                        "vocab size " + std::to_string(*options.vocab_size) +
                            " does not cover the tokenizer's " +
                            std::to_string(tokenizer.vocab_size) + " tokens");
    }
    config.vocab_size = *options.vocab_size;
  }
  config.bos_token_id = tokenizer.bos_id;
  config.eos_token_ids = tokenizer.eos_ids;
  config.torch_dtype = options.dtype == TensorDtype::kF32
                           ? "float32"
                           : (options.dtype == TensorDtype::kF16 ? "float16" : "bfloat16");
  if (auto s = validate_model_config(config); !s) return std::unexpected(s.error());

  const TensorStore tensors =
      make_random_tensors(config, options.seed, options.dtype, options.lm_head_scale);
  MadeModel made;
  made.config = config;
  for (const std::string& name : tensors.names()) {
    const TensorView* view = tensors.find(name);
    made.num_parameters += view->num_elements();
    made.weight_bytes += view->data.size();
  }

  // Remove weight files of an earlier model in the same folder, so that a stale
  // index or shard is never mixed with the new weights.
  for (const auto& entry : std::filesystem::directory_iterator(options.out_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == "model.safetensors" || name == "model.safetensors.index.json" ||
        (name.rfind("model-", 0) == 0 && name.ends_with(".safetensors"))) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
  if (options.gguf_type) {
    if (!is_gguf_make_type(*options.gguf_type)) {
      return make_error(ErrorCode::kInvalidArgument,
                        "--gguf " + *options.gguf_type +
                            ": not one of f32, f16, bf16, q8_0, q4_0, q4_k, q6_k, q4_k_m");
    }
  } else if (options.num_shards == 1) {
    if (auto s = write_safetensors(options.out_dir / "model.safetensors", tensors); !s) {
      return std::unexpected(s.error());
    }
  } else if (auto s = write_sharded_safetensors(options.out_dir, tensors, options.num_shards); !s) {
    return std::unexpected(s.error());
  }

  if (options.gguf_type) {
    // The GGUF file carries the config; a config.json would make the folder look like a
    // Hugging Face model without weights.
    std::filesystem::remove(options.out_dir / "config.json", ec);
  } else if (auto s = write_json(options.out_dir / "config.json", model_config_to_json(config));
             !s) {
    return std::unexpected(s.error());
  }
  json generation = {{"bos_token_id", config.bos_token_id ? json(*config.bos_token_id) : json()},
                     {"eos_token_id", config.eos_token_ids},
                     {"do_sample", true},
                     {"temperature", 0.7},
                     {"top_p", 0.9}};
  if (tokenizer.pad_id) generation["pad_token_id"] = *tokenizer.pad_id;
  if (auto s = write_json(options.out_dir / "generation_config.json", generation); !s) {
    return std::unexpected(s.error());
  }
  if (generated) {
    if (auto s = write_json(options.out_dir / "tokenizer.json", generated->tokenizer); !s) {
      return std::unexpected(s.error());
    }
    if (auto s = write_json(options.out_dir / "tokenizer_config.json", generated->tokenizer_config);
        !s) {
      return std::unexpected(s.error());
    }
  } else if (auto s = copy_tokenizer_files(*options.tokenizer_dir, options.out_dir); !s) {
    return std::unexpected(s.error());
  }
  if (options.gguf_type) {
    auto gguf_tokenizer = gguf_tokenizer_from_hf(options.out_dir, config.vocab_size);
    if (!gguf_tokenizer) return std::unexpected(gguf_tokenizer.error());
    const auto path = options.out_dir / "model.gguf";
    if (auto s = write_gguf_model(path, config, tensors, *options.gguf_type, &*gguf_tokenizer,
                                  std::string(model_preset_name(options.preset)));
        !s) {
      return std::unexpected(s.error());
    }
    made.weight_bytes = std::filesystem::file_size(path, ec);
  }
  return made;
}

}  // namespace

}  // namespace strata
