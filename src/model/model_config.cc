#include "model/model_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace strata {

namespace {

using nlohmann::json;

Result<std::string> read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kIoError, "cannot open " + path.string());
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) return make_error(ErrorCode::kIoError, "cannot read " + path.string());
  return buf.str();
}

Error field_error(std::string_view field, std::string_view what) {
  return Error{ErrorCode::kInvalidArgument,
               "config.json: field '" + std::string(field) + "' " + std::string(what)};
}

// An integer field; absent or null gives `fallback` (nullopt: required).
Result<int64_t> get_int(const json& j, std::string_view field, std::optional<int64_t> fallback) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    if (fallback) return *fallback;
    return std::unexpected(field_error(field, "is missing"));
  }
  if (it->is_number_integer() || it->is_number_unsigned()) return it->get<int64_t>();
  if (it->is_number_float()) {
    const double d = it->get<double>();
    if (std::floor(d) == d && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  }
  return std::unexpected(field_error(field, "must be an integer"));
}

Result<double> get_double(const json& j, std::string_view field, double fallback) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) return std::unexpected(field_error(field, "must be a number"));
  return it->get<double>();
}

Result<bool> get_bool(const json& j, std::string_view field, bool fallback) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return std::unexpected(field_error(field, "must be a boolean"));
  return it->get<bool>();
}

Result<int32_t> get_int32(const json& j, std::string_view field, std::optional<int64_t> fallback) {
  auto v = get_int(j, field, fallback);
  if (!v) return std::unexpected(v.error());
  if (*v < INT32_MIN || *v > INT32_MAX) {
    return std::unexpected(field_error(field, "is out of range"));
  }
  return static_cast<int32_t>(*v);
}

// Token id fields may be an integer, a list of integers, or null.
Result<std::vector<int32_t>> get_token_ids(const json& j, std::string_view field) {
  std::vector<int32_t> ids;
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return ids;
  auto one = [&](const json& v) -> Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      return std::unexpected(field_error(field, "must hold non-negative integer token ids"));
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    return {};
  };
  if (it->is_array()) {
    for (const json& v : *it) {
      if (auto s = one(v); !s) return std::unexpected(s.error());
    }
  } else if (auto s = one(*it); !s) {
    return std::unexpected(s.error());
  }
  return ids;
}

Result<RopeScaling> parse_rope_scaling(const json& j) {
  RopeScaling scaling;
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return scaling;
  if (!it->is_object()) return std::unexpected(field_error("rope_scaling", "must be an object"));
  const json& rs = *it;
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    auto t = rs.find(key);
    if (t != rs.end() && t->is_string()) {
      type = t->get<std::string>();
      break;
    }
  }
  auto factor = get_double(rs, "factor", 1.0);
  if (!factor) return std::unexpected(factor.error());
  if (type == "default" || type.empty()) return scaling;
  if (!(*factor > 0.0)) return std::unexpected(field_error("rope_scaling.factor", "must be > 0"));
  scaling.factor = *factor;
  if (type == "linear") {
    scaling.type = RopeScalingType::kLinear;
    return scaling;
  }
  if (type == "llama3") {
    scaling.type = RopeScalingType::kLlama3;
    auto low = get_double(rs, "low_freq_factor", 1.0);
    auto high = get_double(rs, "high_freq_factor", 4.0);
    auto original = get_int(rs, "original_max_position_embeddings", 8192);
    if (!low) return std::unexpected(low.error());
    if (!high) return std::unexpected(high.error());
    if (!original) return std::unexpected(original.error());
    if (!(*low > 0.0) || !(*high > *low) || *original < 1) {
      return std::unexpected(field_error("rope_scaling",
                                         "llama3 needs 0 < low_freq_factor < high_freq_factor and "
                                         "original_max_position_embeddings >= 1"));
    }
    scaling.low_freq_factor = *low;
    scaling.high_freq_factor = *high;
    scaling.original_max_position_embeddings = *original;
    return scaling;
  }
  return make_error(ErrorCode::kUnsupported,
                    "config.json: rope_scaling type '" + type +
                        "' is not supported (supported: default, linear, llama3)");
}

}  // namespace

std::string_view architecture_class_name(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "LlamaForCausalLM";
    case Architecture::kMistral:
      return "MistralForCausalLM";
    case Architecture::kQwen2:
      return "Qwen2ForCausalLM";
    case Architecture::kQwen3:
      return "Qwen3ForCausalLM";
  }
  return "unknown";
}

std::string_view architecture_model_type(Architecture arch) {
  switch (arch) {
    case Architecture::kLlama:
      return "llama";
    case Architecture::kMistral:
      return "mistral";
    case Architecture::kQwen2:
      return "qwen2";
    case Architecture::kQwen3:
      return "qwen3";
  }
  return "unknown";
}

Status validate_model_config(const ModelConfig& c) {
  auto bad = [](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "config.json: " + what);
  };
  auto positive = [&](const char* name, int64_t v) -> Status {
    if (v < 1) return bad(std::string(name) + " must be >= 1, got " + std::to_string(v));
    return {};
  };
  if (auto s = positive("vocab_size", c.vocab_size); !s) return s;
  if (auto s = positive("hidden_size", c.hidden_size); !s) return s;
  if (auto s = positive("intermediate_size", c.intermediate_size); !s) return s;
  if (auto s = positive("num_hidden_layers", c.num_layers); !s) return s;
  if (auto s = positive("num_attention_heads", c.num_heads); !s) return s;
  if (auto s = positive("num_key_value_heads", c.num_kv_heads); !s) return s;
  if (auto s = positive("head_dim", c.head_dim); !s) return s;
  if (auto s = positive("max_position_embeddings", c.max_position_embeddings); !s) return s;
  if (c.num_heads % c.num_kv_heads != 0) {
    return bad("num_attention_heads (" + std::to_string(c.num_heads) +
               ") must be a multiple of num_key_value_heads (" + std::to_string(c.num_kv_heads) +
               ")");
  }
  if (c.head_dim % 2 != 0) return bad("head_dim must be even for RoPE");
  // Bounds that keep every product below in 64 bits and reject absurd files early.
  if (c.hidden_size > 65536 || c.intermediate_size > 1 << 20 || c.num_layers > 1024 ||
      c.num_heads > 1024 || c.head_dim > 1024 || c.vocab_size > 1 << 24) {
    return bad("a dimension is implausibly large");
  }
  if (!(c.rms_norm_eps > 0.0) || !std::isfinite(c.rms_norm_eps)) {
    return bad("rms_norm_eps must be > 0");
  }
  if (!(c.rope_theta > 0.0) || !std::isfinite(c.rope_theta)) return bad("rope_theta must be > 0");
  if (c.sliding_window < 0) return bad("sliding_window must be >= 0");
  for (int32_t id : c.eos_token_ids) {
    if (id < 0) return bad("eos_token_id must be >= 0");
  }
  return {};
}

Result<ModelConfig> model_config_from_json(const json& j) {
  if (!j.is_object()) return make_error(ErrorCode::kInvalidArgument, "config.json: not an object");
  ModelConfig c;
  std::string arch_name;
  if (auto it = j.find("architectures");
      it != j.end() && it->is_array() && !it->empty() && (*it)[0].is_string()) {
    arch_name = (*it)[0].get<std::string>();
  } else if (auto mt = j.find("model_type"); mt != j.end() && mt->is_string()) {
    arch_name = mt->get<std::string>();
  } else {
    return make_error(ErrorCode::kInvalidArgument,
                      "config.json: 'architectures' (or 'model_type') is missing");
  }
  if (arch_name == "LlamaForCausalLM" || arch_name == "llama") {
    c.architecture = Architecture::kLlama;
  } else if (arch_name == "MistralForCausalLM" || arch_name == "mistral") {
    c.architecture = Architecture::kMistral;
  } else if (arch_name == "Qwen2ForCausalLM" || arch_name == "qwen2") {
    c.architecture = Architecture::kQwen2;
  } else if (arch_name == "Qwen3ForCausalLM" || arch_name == "qwen3") {
    c.architecture = Architecture::kQwen3;
  } else {
    return make_error(ErrorCode::kUnsupported,
                      "config.json: architecture '" + arch_name +
                          "' is not supported (supported: LlamaForCausalLM, MistralForCausalLM, "
                          "Qwen2ForCausalLM, Qwen3ForCausalLM)");
  }

#define STRATA_ASSIGN(lhs, expr)                 \
  do {                                           \
    auto v_ = (expr);                            \
    if (!v_) return std::unexpected(v_.error()); \
    lhs = *v_;                                   \
  } while (0)

  STRATA_ASSIGN(c.vocab_size, get_int32(j, "vocab_size", std::nullopt));
  STRATA_ASSIGN(c.hidden_size, get_int32(j, "hidden_size", std::nullopt));
  STRATA_ASSIGN(c.intermediate_size, get_int32(j, "intermediate_size", std::nullopt));
  STRATA_ASSIGN(c.num_layers, get_int32(j, "num_hidden_layers", std::nullopt));
  STRATA_ASSIGN(c.num_heads, get_int32(j, "num_attention_heads", std::nullopt));
  STRATA_ASSIGN(c.num_kv_heads, get_int32(j, "num_key_value_heads", c.num_heads));
  if (c.num_heads < 1) {
    return std::unexpected(field_error("num_attention_heads", "must be >= 1"));
  }
  STRATA_ASSIGN(c.head_dim, get_int32(j, "head_dim", c.hidden_size / c.num_heads));
  STRATA_ASSIGN(c.rms_norm_eps, get_double(j, "rms_norm_eps", 1e-6));
  STRATA_ASSIGN(c.rope_theta, get_double(j, "rope_theta", 10000.0));
  STRATA_ASSIGN(c.rope_scaling, parse_rope_scaling(j));
  STRATA_ASSIGN(c.max_position_embeddings, get_int(j, "max_position_embeddings", 2048));
  STRATA_ASSIGN(c.tie_word_embeddings, get_bool(j, "tie_word_embeddings", false));
  bool attention_bias = false;
  STRATA_ASSIGN(attention_bias, get_bool(j, "attention_bias", false));
  bool mlp_bias = false;
  STRATA_ASSIGN(mlp_bias, get_bool(j, "mlp_bias", false));
  if (mlp_bias) {
    return make_error(ErrorCode::kUnsupported, "config.json: mlp_bias = true is not supported");
  }
  switch (c.architecture) {
    case Architecture::kLlama:
    case Architecture::kMistral:
      c.qkv_bias = attention_bias;
      c.o_bias = attention_bias;
      break;
    case Architecture::kQwen2:
      c.qkv_bias = true;
      break;
    case Architecture::kQwen3:
      c.qkv_bias = attention_bias;
      c.qk_norm = true;
      break;
  }
  if (auto act = j.find("hidden_act"); act != j.end() && !act->is_null()) {
    if (!act->is_string() ||
        (act->get<std::string>() != "silu" && act->get<std::string>() != "swish")) {
      return make_error(ErrorCode::kUnsupported,
                        "config.json: hidden_act '" + act->dump() + "' is not supported (silu)");
    }
  }
  // Sliding windows: Mistral applies `sliding_window` to every layer when set; Qwen2/3
  // only when use_sliding_window is true, and then to a subset of layers, which this
  // engine does not implement.
  int64_t window = 0;
  STRATA_ASSIGN(window, get_int(j, "sliding_window", 0));
  if (c.architecture == Architecture::kMistral) {
    c.sliding_window = window;
  } else if (c.architecture == Architecture::kQwen2 || c.architecture == Architecture::kQwen3) {
    bool use_window = false;
    STRATA_ASSIGN(use_window, get_bool(j, "use_sliding_window", false));
    if (use_window) {
      return make_error(ErrorCode::kUnsupported,
                        "config.json: use_sliding_window = true is not supported");
    }
  }
  if (auto bos = get_token_ids(j, "bos_token_id"); !bos) {
    return std::unexpected(bos.error());
  } else if (!bos->empty()) {
    c.bos_token_id = bos->front();
  }
  STRATA_ASSIGN(c.eos_token_ids, get_token_ids(j, "eos_token_id"));
  if (auto dt = j.find("torch_dtype"); dt != j.end() && dt->is_string()) {
    c.torch_dtype = dt->get<std::string>();
  }
#undef STRATA_ASSIGN

  if (auto s = validate_model_config(c); !s) return std::unexpected(s.error());
  return c;
}

Result<ModelConfig> parse_model_config(std::string_view json_text) {
  json j = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return make_error(ErrorCode::kInvalidArgument, "config.json is not valid JSON");
  }
  return model_config_from_json(j);
}

Result<ModelConfig> load_model_config(const std::filesystem::path& path) {
  std::error_code ec;
  const bool is_dir = std::filesystem::is_directory(path, ec);
  const std::filesystem::path file = is_dir ? path / "config.json" : path;
  if (!std::filesystem::exists(file, ec)) {
    return make_error(ErrorCode::kNotFound, "no config.json at " + file.string());
  }
  auto text = read_text_file(file);
  if (!text) return std::unexpected(text.error());
  auto config = parse_model_config(*text);
  if (!config) {
    return make_error(config.error().code, file.string() + ": " + config.error().message);
  }
  // generation_config.json may list more eos ids (Llama 3 instruct: <|eot_id|>).
  const std::filesystem::path gen = file.parent_path() / "generation_config.json";
  if (std::filesystem::exists(gen, ec)) {
    if (auto gen_text = read_text_file(gen); gen_text) {
      json g = json::parse(*gen_text, nullptr, false);
      if (g.is_object()) {
        if (auto ids = get_token_ids(g, "eos_token_id"); ids) {
          for (int32_t id : *ids) {
            if (std::find(config->eos_token_ids.begin(), config->eos_token_ids.end(), id) ==
                config->eos_token_ids.end()) {
              config->eos_token_ids.push_back(id);
            }
          }
        }
        if (!config->bos_token_id) {
          if (auto bos = get_token_ids(g, "bos_token_id"); bos && !bos->empty()) {
            config->bos_token_id = bos->front();
          }
        }
      }
    }
  }
  return config;
}

json model_config_to_json(const ModelConfig& c) {
  json j;
  j["architectures"] = json::array({std::string(architecture_class_name(c.architecture))});
  j["model_type"] = std::string(architecture_model_type(c.architecture));
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["torch_dtype"] = c.torch_dtype;
  if (c.architecture == Architecture::kLlama || c.architecture == Architecture::kMistral) {
    j["attention_bias"] = c.qkv_bias;
    j["mlp_bias"] = false;
  }
  if (c.architecture == Architecture::kQwen3) j["attention_bias"] = c.qkv_bias;
  if (c.architecture == Architecture::kQwen2 || c.architecture == Architecture::kQwen3) {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
  }
  if (c.architecture == Architecture::kMistral) {
    j["sliding_window"] = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  }
  switch (c.rope_scaling.type) {
    case RopeScalingType::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScalingType::kLinear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", c.rope_scaling.factor}};
      break;
    case RopeScalingType::kLlama3:
      j["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", c.rope_scaling.factor},
          {"low_freq_factor", c.rope_scaling.low_freq_factor},
          {"high_freq_factor", c.rope_scaling.high_freq_factor},
          {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
      break;
  }
  j["bos_token_id"] = c.bos_token_id ? json(*c.bos_token_id) : json(nullptr);
  if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids[0];
  } else if (c.eos_token_ids.empty()) {
    j["eos_token_id"] = nullptr;
  } else {
    j["eos_token_id"] = c.eos_token_ids;
  }
  return j;
}

}  // namespace strata
