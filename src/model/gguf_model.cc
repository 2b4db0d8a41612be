#include "model/gguf_model.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <new>

namespace strata {

namespace {

Error config_error(const GgufFile& f, ErrorCode code, const std::string& what) {
  std::string m = f.description();
  m.append(": ").append(what);
  return Error{code, std::move(m)};
}

class GgufLoader {
 public:
  GgufLoader(const GgufFile& file, const ModelConfig& config, std::optional<WeightDtype> dtype)
      : file_(file), config_(config), dtype_(dtype) {}

  Result<ModelWeights> load() {
    const ModelConfig& c = config_;
    const int64_t hidden = c.hidden_size, q = c.q_size(), kv = c.kv_size();
    const int64_t ffn = c.intermediate_size;
    ModelWeights w;
    if (auto s = matrix({{"token_embd.weight", c.vocab_size, false}}, hidden, w.embed, nullptr);
        !s) {
      return std::unexpected(s.error());
    }
    w.layers.resize(static_cast<size_t>(c.num_layers));
    for (int32_t i = 0; i < c.num_layers; ++i) {
      LayerWeights& l = w.layers[static_cast<size_t>(i)];
      const std::string p = "blk." + std::to_string(i) + ".";
      if (auto s = vector(p + "attn_norm.weight", hidden, false, l.attn_norm); !s) return fail(s);
      if (auto s = vector(p + "ffn_norm.weight", hidden, false, l.mlp_norm); !s) return fail(s);
      if (auto s = matrix({{p + "attn_q.weight", q, permuted()},
                           {p + "attn_k.weight", kv, permuted()},
                           {p + "attn_v.weight", kv, false}},
                          hidden, l.qkv, &l.qkv_parts);
          !s) {
        return fail(s);
      }
      if (c.qkv_bias) {
        std::vector<float> b;
        for (const auto& [name, size, permute] :
             {Part{"attn_q.bias", q, permuted()}, Part{"attn_k.bias", kv, permuted()},
              Part{"attn_v.bias", kv, false}}) {
          if (auto s = vector(p + name, size, permute, b); !s) return fail(s);
          l.qkv_bias.insert(l.qkv_bias.end(), b.begin(), b.end());
        }
      }
      if (c.qk_norm) {
        if (auto s = vector(p + "attn_q_norm.weight", c.head_dim, false, l.q_norm); !s) {
          return fail(s);
        }
        if (auto s = vector(p + "attn_k_norm.weight", c.head_dim, false, l.k_norm); !s) {
          return fail(s);
        }
      }
      if (auto s = matrix({{p + "attn_output.weight", hidden, false}}, q, l.o, nullptr); !s) {
        return fail(s);
      }
      if (c.o_bias) {
        if (auto s = vector(p + "attn_output.bias", hidden, false, l.o_bias); !s) return fail(s);
      }
      if (auto s = matrix({{p + "ffn_gate.weight", ffn, false}, {p + "ffn_up.weight", ffn, false}},
                          hidden, l.gate_up, &l.gate_up_parts);
          !s) {
        return fail(s);
      }
      if (auto s = matrix({{p + "ffn_down.weight", hidden, false}}, ffn, l.down, nullptr); !s) {
        return fail(s);
      }
    }
    if (auto s = vector("output_norm.weight", hidden, false, w.final_norm); !s) return fail(s);
    if (!c.tie_word_embeddings) {
      if (auto s = matrix({{"output.weight", c.vocab_size, false}}, hidden, w.lm_head, nullptr);
          !s) {
        return fail(s);
      }
    }
    return w;
  }

 private:
  struct Part {
    std::string name;
    int64_t rows;
    bool permute;  // undo llama.cpp's rotary permutation of the rows
  };

  static std::unexpected<Error> fail(const Status& s) { return std::unexpected(s.error()); }

  bool permuted() const {
    return config_.architecture == Architecture::kLlama ||
           config_.architecture == Architecture::kMistral;
  }

  // The file's row of a matrix for our row r: identity, or the inverse of the rotary
  // permutation within heads of head_dim rows.
  int64_t source_row(int64_t r, bool permute) const {
    if (!permute) return r;
    const int64_t d = config_.head_dim, half = d / 2;
    const int64_t head = r / d, within = r % d;
    const int64_t j = within / half, i = within % half;
    return head * d + 2 * i + j;
  }

  Result<const GgufTensor*> get(const std::string& name, int64_t rows, int64_t cols) {
    const GgufTensor* t = file_.tensor(name);
    if (t == nullptr) {
      return make_error(ErrorCode::kNotFound,
                        "missing tensor '" + name + "' in " + file_.description());
    }
    const std::vector<int64_t> want =
        cols == 0 ? std::vector<int64_t>{rows} : std::vector<int64_t>{rows, cols};
    if (t->shape() != want) {
      TensorView shown, expected;
      shown.shape = t->shape();
      expected.shape = want;
      return make_error(ErrorCode::kInvalidArgument,
                        "tensor '" + name + "' has shape " + shown.shape_string() +
                            " but the config needs " + expected.shape_string());
    }
    const auto info = ggml_type_info(t->type);
    if (!info->supported) {
      return make_error(ErrorCode::kUnsupported,
                        "tensor '" + name + "' has type " + std::string(info->name) +
                            "; supported: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K");
    }
    return t;
  }

  Status vector(const std::string& name, int64_t size, bool permute, std::vector<float>& out) {
    auto t = get(name, size, 0);
    if (!t) return std::unexpected(t.error());
    std::vector<float> values(static_cast<size_t>(size));
    dequantize_row(static_cast<GgmlType>((*t)->type), (*t)->data.data(), values.data(), size);
    out.resize(static_cast<size_t>(size));
    for (int64_t r = 0; r < size; ++r) {
      out[static_cast<size_t>(r)] = values[static_cast<size_t>(source_row(r, permute))];
    }
    return {};
  }

  // The in-memory dtype of a tensor of type `type`.
  WeightDtype dtype_of(uint32_t type, int64_t cols) const {
    if (dtype_) {
      // A quantized override needs whole blocks; otherwise F32, as load_weights does.
      return cols % weight_dtype_block(*dtype_) == 0 ? *dtype_ : WeightDtype::kF32;
    }
    const auto native = weight_dtype_of_ggml(static_cast<GgmlType>(type));
    return native ? *native : WeightDtype::kF32;
  }

  // The parts stacked into `fused` when they share a dtype, else one matrix each into
  // `parts` (nullptr: a single part).
  Status matrix(const std::vector<Part>& spec, int64_t cols, WeightMatrix& fused,
                std::vector<WeightMatrix>* parts) {
    std::vector<const GgufTensor*> tensors;
    int64_t total_rows = 0;
    for (const Part& p : spec) {
      auto t = get(p.name, p.rows, cols);
      if (!t) return std::unexpected(t.error());
      tensors.push_back(*t);
      total_rows += p.rows;
    }
    const WeightDtype first = dtype_of(tensors[0]->type, cols);
    bool same = true;
    for (const GgufTensor* t : tensors) same = same && dtype_of(t->type, cols) == first;
    if (same || parts == nullptr) {
      fused = WeightMatrix(total_rows, cols, first);
      int64_t row = 0;
      for (size_t i = 0; i < spec.size(); ++i) {
        fill(*tensors[i], spec[i], fused, row);
        row += spec[i].rows;
      }
      return {};
    }
    parts->clear();
    for (size_t i = 0; i < spec.size(); ++i) {
      parts->emplace_back(spec[i].rows, cols, dtype_of(tensors[i]->type, cols));
      fill(*tensors[i], spec[i], parts->back(), 0);
    }
    return {};
  }

  // Rows [row, row + part.rows) of m from tensor t: the bytes as they are when m keeps
  // t's type, else through F32.
  void fill(const GgufTensor& t, const Part& part, WeightMatrix& m, int64_t row) {
    const auto type = static_cast<GgmlType>(t.type);
    const int64_t cols = m.cols();
    const int64_t src_row_bytes = ggml_row_bytes(type, cols);
    const bool copy = is_quantized(m.dtype()) && weight_dtype_ggml_type(m.dtype()) == type;
    std::vector<float> values(copy ? 0 : static_cast<size_t>(cols));
    for (int64_t r = 0; r < part.rows; ++r) {
      const std::byte* src = t.data.data() + source_row(r, part.permute) * src_row_bytes;
      if (copy) {
        std::memcpy(m.quant_row(row + r), src, static_cast<size_t>(src_row_bytes));
      } else {
        dequantize_row(type, src, values.data(), cols);
        m.set_row(row + r, values.data());
      }
    }
  }

  const GgufFile& file_;
  const ModelConfig& config_;
  std::optional<WeightDtype> dtype_;
};

}  // namespace

Result<ModelConfig> gguf_model_config(const GgufFile& f) {
  auto arch_name = f.get_string("general.architecture");
  if (!arch_name) return std::unexpected(arch_name.error());
  ModelConfig c;
  if (*arch_name == "llama") {
    c.architecture = Architecture::kLlama;
  } else if (*arch_name == "mistral") {
    c.architecture = Architecture::kMistral;
  } else if (*arch_name == "qwen2") {
    c.architecture = Architecture::kQwen2;
  } else if (*arch_name == "qwen3") {
    c.architecture = Architecture::kQwen3;
  } else {
    return std::unexpected(config_error(
        f, ErrorCode::kUnsupported,
        "architecture '" + *arch_name + "' is not supported (llama, mistral, qwen2, qwen3)"));
  }
  const std::string p = *arch_name + ".";
  auto required = [&](const std::string& key, int32_t& out) -> Status {
    auto v = f.get_int(p + key);
    if (!v) return std::unexpected(v.error());
    if (*v < 1 || *v > INT32_MAX) {
      return std::unexpected(config_error(f, ErrorCode::kInvalidArgument,
                                          "metadata '" + p + key + "' is out of range"));
    }
    out = static_cast<int32_t>(*v);
    return {};
  };
  for (auto [key, out] : {std::pair<const char*, int32_t*>{"embedding_length", &c.hidden_size},
                          {"block_count", &c.num_layers},
                          {"feed_forward_length", &c.intermediate_size},
                          {"attention.head_count", &c.num_heads}}) {
    if (auto s = required(key, *out); !s) return std::unexpected(s.error());
  }
  c.num_kv_heads = c.num_heads;
  if (f.find(p + "attention.head_count_kv") != nullptr) {
    if (auto s = required("attention.head_count_kv", c.num_kv_heads); !s) {
      return std::unexpected(s.error());
    }
  }
  c.head_dim = c.hidden_size / c.num_heads;
  if (f.find(p + "attention.key_length") != nullptr) {
    if (auto s = required("attention.key_length", c.head_dim); !s) {
      return std::unexpected(s.error());
    }
  }
  if (auto ctx = f.get_int(p + "context_length"); ctx) {
    c.max_position_embeddings = *ctx;
  } else if (ctx.error().code != ErrorCode::kNotFound) {
    return std::unexpected(ctx.error());
  }
  if (auto eps = f.get_real(p + "attention.layer_norm_rms_epsilon"); eps) c.rms_norm_eps = *eps;
  if (auto theta = f.get_real(p + "rope.freq_base"); theta) c.rope_theta = *theta;
  if (auto window = f.get_int(p + "attention.sliding_window"); window) c.sliding_window = *window;
  if (auto type = f.get_string(p + "rope.scaling.type"); type && *type != "none") {
    if (*type != "linear") {
      return std::unexpected(
          config_error(f, ErrorCode::kUnsupported,
                       "RoPE scaling '" + *type + "' is not supported (none, linear)"));
    }
    auto factor = f.get_real(p + "rope.scaling.factor");
    if (!factor) return std::unexpected(factor.error());
    c.rope_scaling.type = RopeScalingType::kLinear;
    c.rope_scaling.factor = *factor;
  }
  if (f.tensor("rope_freqs.weight") != nullptr) {
    return std::unexpected(config_error(
        f, ErrorCode::kUnsupported,
        "the rope_freqs tensor (Llama 3.1's RoPE scaling as GGUF stores it) is not supported"));
  }
  const GgufTensor* embed = f.tensor("token_embd.weight");
  if (embed == nullptr || embed->ne.size() != 2) {
    return std::unexpected(
        config_error(f, ErrorCode::kNotFound, "missing tensor 'token_embd.weight' (a matrix)"));
  }
  if (embed->ne[1] > INT32_MAX) {
    return std::unexpected(config_error(f, ErrorCode::kInvalidArgument, "vocabulary too large"));
  }
  c.vocab_size = static_cast<int32_t>(embed->ne[1]);
  c.tie_word_embeddings = f.tensor("output.weight") == nullptr;
  c.qkv_bias = f.tensor("blk.0.attn_q.bias") != nullptr;
  c.o_bias = f.tensor("blk.0.attn_output.bias") != nullptr;
  c.qk_norm = f.tensor("blk.0.attn_q_norm.weight") != nullptr;
  if (auto bos = f.get_int("tokenizer.ggml.bos_token_id"); bos && *bos >= 0 && *bos <= INT32_MAX) {
    c.bos_token_id = static_cast<int32_t>(*bos);
  }
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    auto id = f.get_int(key);
    if (!id || *id < 0 || *id > INT32_MAX) continue;
    const auto v = static_cast<int32_t>(*id);
    if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), v) == c.eos_token_ids.end()) {
      c.eos_token_ids.push_back(v);
    }
  }
  c.torch_dtype = "gguf";
  if (auto s = validate_model_config(c); !s) return std::unexpected(s.error());
  return c;
}

Result<ModelWeights> load_gguf_weights(const GgufFile& file, const ModelConfig& config,
                                       std::optional<WeightDtype> dtype) {
  try {
    return GgufLoader(file, config, dtype).load();
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kResourceExhausted,
                      "out of memory loading the weights of " + file.description());
  }
}

bool is_gguf_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace strata
