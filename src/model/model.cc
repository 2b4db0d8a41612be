#include "model/model.h"

#include <cmath>
#include <cstdio>
#include <new>
#include <thread>

#include "common/log.h"
#include "model/gguf_model.h"

namespace strata {

namespace {

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

}  // namespace

std::string ForwardProfile::to_string() const {
  const double total = total_s();
  std::string out;
  auto line = [&](const char* name, double s) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "  %-12s %9.3f ms  %5.1f%%\n", name, s * 1e3,
                  total > 0 ? 100.0 * s / total : 0.0);
    out += buf;
  };
  line("embed", embed_s);
  line("rmsnorm", norm_s);
  line("qkv_proj", qkv_s);
  line("rope+kv", rope_store_s);
  if (kv_wait_s > 0) line("kv_wait", kv_wait_s);
  line("attention", attention_s);
  line("o_proj", o_proj_s);
  line("gate_up", gate_up_s);
  line("silu_mul", silu_s);
  line("down_proj", down_s);
  line("logits", logits_s);
  line("total", total);
  return out;
}

Model::Model(const ModelConfig& config, ModelWeights weights, int num_threads)
    : config_(config),
      weights_(std::move(weights)),
      pool_(num_threads),
      matmul_(num_threads),
      attention_(AttentionShape{config.num_heads, config.num_kv_heads, config.head_dim,
                                config.sliding_window,
                                1.0f / std::sqrt(static_cast<float>(config.head_dim))},
                 num_threads),
      rope_(config) {}

Model::~Model() = default;

Result<std::unique_ptr<Model>> Model::from_tensors(const ModelConfig& config,
                                                   const TensorSource& tensors,
                                                   const ModelOptions& options) {
  if (auto s = validate_model_config(config); !s) return std::unexpected(s.error());
  WeightDtype dtype = WeightDtype::kF32;
  if (options.weight_dtype) {
    dtype = *options.weight_dtype;
  } else {
    auto natural = natural_weight_dtype(tensors);
    if (!natural) return std::unexpected(natural.error());
    dtype = *natural;
  }
  auto weights = load_weights(tensors, config, dtype);
  if (!weights) return std::unexpected(weights.error());
  try {
    return std::unique_ptr<Model>(
        new Model(config, std::move(*weights), resolve_threads(options.num_threads)));
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kResourceExhausted, "out of memory creating the model");
  }
}

Result<std::unique_ptr<Model>> Model::load_gguf(const std::filesystem::path& path,
                                                const ModelOptions& options) {
  auto file = GgufFile::open(path);
  if (!file) return std::unexpected(file.error());
  auto config = gguf_model_config(**file);
  if (!config) return std::unexpected(config.error());
  auto weights = load_gguf_weights(**file, *config, options.weight_dtype);
  if (!weights) return std::unexpected(weights.error());
  const double mb = static_cast<double>(weights->size_bytes()) / 1e6;
  std::string types;
  for (const WeightMatrix* m : std::initializer_list<const WeightMatrix*>{
           &weights->layers[0].qkv, &weights->layers[0].down, &weights->output()}) {
    if (!types.empty()) types.append("/");
    types.append(m->empty() ? "parts" : weight_dtype_name(m->dtype()));
  }
  try {
    std::unique_ptr<Model> model(
        new Model(*config, std::move(*weights), resolve_threads(options.num_threads)));
    STRATA_LOG_INFO(
        "loaded {} from {} (GGUF v{}): {} layers, hidden {}, vocab {}, weights qkv/down/output "
        "{} ({:.1f} MB)",
        architecture_class_name(config->architecture), path.string(), (*file)->version(),
        config->num_layers, config->hidden_size, config->vocab_size, types, mb);
    return model;
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kResourceExhausted, "out of memory creating the model");
  }
}

Result<std::unique_ptr<Model>> Model::load(const std::filesystem::path& dir,
                                           const ModelOptions& options) {
  if (is_gguf_file(dir)) return load_gguf(dir, options);
  auto config = load_model_config(dir);
  if (!config) return std::unexpected(config.error());
  auto tensors = SafetensorsModel::open(dir);
  if (!tensors) return std::unexpected(tensors.error());
  auto model = from_tensors(*config, **tensors, options);
  if (model) {
    STRATA_LOG_INFO("loaded {} from {}: {} layers, hidden {}, vocab {}, weights {} ({:.1f} MB)",
                    architecture_class_name(config->architecture), dir.string(), config->num_layers,
                    config->hidden_size, config->vocab_size,
                    weight_dtype_name((*model)->weights().embed.dtype()),
                    static_cast<double>((*model)->weights().size_bytes()) / 1e6);
  }
  return model;
}

KvPoolShape Model::kv_pool_shape(int32_t num_pages, int32_t page_size, KvDtype dtype) const {
  return KvPoolShape{
      config_.num_layers, config_.num_kv_heads, config_.head_dim, num_pages, page_size, dtype};
}

Status Model::forward(std::span<const ForwardSequence> batch, KvPool& pool, ForwardOutput& out) {
  out.tokens.clear();
  out.sampled.clear();
  return forward(batch, pool, out.logits);
}

}  // namespace strata
