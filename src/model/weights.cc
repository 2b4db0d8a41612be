#include "model/weights.h"

#include <cstring>
#include <new>
#include <utility>

#include "common/check.h"
#include "memory/kv_dtype.h"

namespace strata {

namespace {

// Widens `n` elements of `view` starting at element `first` to F32. Copies through an
// aligned temporary when the mapped data is not aligned to its element size (a legal
// but unusual safetensors layout).
void view_to_f32(const TensorView& view, int64_t first, int64_t n, float* out) {
  const size_t elem = tensor_dtype_size_bytes(*view.dtype);
  const std::byte* src = view.data.data() + static_cast<size_t>(first) * elem;
  std::vector<std::byte> aligned;
  if (reinterpret_cast<uintptr_t>(src) % elem != 0) {
    aligned.assign(src, src + static_cast<size_t>(n) * elem);
    src = aligned.data();
  }
  switch (*view.dtype) {
    case TensorDtype::kF32:
      std::memcpy(out, src, static_cast<size_t>(n) * sizeof(float));
      break;
    case TensorDtype::kF16:
      f16_to_f32_row(reinterpret_cast<const uint16_t*>(src), out, static_cast<size_t>(n));
      break;
    case TensorDtype::kBF16:
      bf16_to_f32_row(reinterpret_cast<const uint16_t*>(src), out, static_cast<size_t>(n));
      break;
  }
}

class Loader {
 public:
  Loader(const TensorSource& source, const ModelConfig& config, WeightDtype dtype)
      : source_(source), config_(config), dtype_(dtype) {}

  // The tensor `name` with the given shape and a supported dtype.
  Result<const TensorView*> get(const std::string& name, std::vector<int64_t> shape) {
    const TensorView* view = source_.find(name);
    if (view == nullptr) {
      return make_error(ErrorCode::kNotFound,
                        "missing tensor '" + name + "' in " + source_.description());
    }
    if (!view->dtype) {
      return make_error(ErrorCode::kUnsupported, "tensor '" + name + "' has dtype " +
                                                     view->dtype_name +
                                                     "; supported dtypes are F32, F16, BF16");
    }
    if (view->shape != shape) {
      TensorView expected;
      expected.shape = shape;
      return make_error(ErrorCode::kInvalidArgument,
                        "tensor '" + name + "' has shape " + view->shape_string() +
                            " but the config needs " + expected.shape_string());
    }
    return view;
  }

  Result<std::vector<float>> vector(const std::string& name, int64_t size) {
    auto view = get(name, {size});
    if (!view) return std::unexpected(view.error());
    std::vector<float> out(static_cast<size_t>(size));
    view_to_f32(**view, 0, size, out.data());
    return out;
  }

  // Fills rows [row_offset, row_offset + rows) of `matrix` from tensor `name`.
  Status rows_into(const std::string& name, int64_t rows, WeightMatrix& matrix,
                   int64_t row_offset) {
    auto view = get(name, {rows, matrix.cols()});
    if (!view) return std::unexpected(view.error());
    const int64_t cols = matrix.cols();
    if (matrix.dtype() == WeightDtype::kF32) {
      for (int64_t r = 0; r < rows; ++r) {
        view_to_f32(**view, r * cols, cols, matrix.f32() + (row_offset + r) * cols);
      }
      return {};
    }
    std::vector<float> row(static_cast<size_t>(cols));
    std::vector<uint16_t> bits(static_cast<size_t>(cols));
    const bool copy_bits =
        (*view)->dtype == TensorDtype::kBF16 && matrix.dtype() == WeightDtype::kBF16;
    for (int64_t r = 0; r < rows; ++r) {
      if (copy_bits) {
        // BF16 to BF16: the bits as they are (memcpy: the mapping may be unaligned).
        std::memcpy(bits.data(), (*view)->data.data() + static_cast<size_t>(r * cols) * 2,
                    static_cast<size_t>(cols) * 2);
        matrix.set_row_bf16(row_offset + r, bits.data());
      } else {
        view_to_f32(**view, r * cols, cols, row.data());
        matrix.set_row(row_offset + r, row.data());
      }
    }
    return {};
  }

  // The dtype of a matrix of `cols` columns: the one asked for, or for a quantized one
  // whose block does not divide the row, Q8_0 (K-quants) or F32 (as llama.cpp's
  // quantizer falls back for such tensors).
  WeightDtype dtype_for(int64_t cols) const {
    if (cols % weight_dtype_block(dtype_) == 0) return dtype_;
    if (cols % weight_dtype_block(WeightDtype::kQ8_0) == 0) return WeightDtype::kQ8_0;
    return WeightDtype::kF32;
  }

  Result<ModelWeights> load() {
    const ModelConfig& c = config_;
    const int64_t hidden = c.hidden_size;
    const int64_t q = c.q_size();
    const int64_t kv = c.kv_size();
    const int64_t ffn = c.intermediate_size;
    ModelWeights w;
    w.embed = WeightMatrix(c.vocab_size, hidden, dtype_for(hidden));
    if (auto s = rows_into("model.embed_tokens.weight", c.vocab_size, w.embed, 0); !s) {
      return std::unexpected(s.error());
    }
    w.layers.resize(static_cast<size_t>(c.num_layers));
    for (int32_t i = 0; i < c.num_layers; ++i) {
      LayerWeights& l = w.layers[static_cast<size_t>(i)];
      const std::string p = "model.layers." + std::to_string(i) + ".";
      auto norm = vector(p + "input_layernorm.weight", hidden);
      if (!norm) return std::unexpected(norm.error());
      l.attn_norm = std::move(*norm);
      auto mlp_norm = vector(p + "post_attention_layernorm.weight", hidden);
      if (!mlp_norm) return std::unexpected(mlp_norm.error());
      l.mlp_norm = std::move(*mlp_norm);

      l.qkv = WeightMatrix(q + 2 * kv, hidden, dtype_for(hidden));
      if (auto s = rows_into(p + "self_attn.q_proj.weight", q, l.qkv, 0); !s) {
        return std::unexpected(s.error());
      }
      if (auto s = rows_into(p + "self_attn.k_proj.weight", kv, l.qkv, q); !s) {
        return std::unexpected(s.error());
      }
      if (auto s = rows_into(p + "self_attn.v_proj.weight", kv, l.qkv, q + kv); !s) {
        return std::unexpected(s.error());
      }
      if (c.qkv_bias) {
        l.qkv_bias.reserve(static_cast<size_t>(q + 2 * kv));
        for (auto [name, size] : {std::pair{"q_proj", q}, {"k_proj", kv}, {"v_proj", kv}}) {
          auto bias = vector(p + "self_attn." + name + ".bias", size);
          if (!bias) return std::unexpected(bias.error());
          l.qkv_bias.insert(l.qkv_bias.end(), bias->begin(), bias->end());
        }
      }
      if (c.qk_norm) {
        auto qn = vector(p + "self_attn.q_norm.weight", c.head_dim);
        if (!qn) return std::unexpected(qn.error());
        l.q_norm = std::move(*qn);
        auto kn = vector(p + "self_attn.k_norm.weight", c.head_dim);
        if (!kn) return std::unexpected(kn.error());
        l.k_norm = std::move(*kn);
      }
      l.o = WeightMatrix(hidden, q, dtype_for(q));
      if (auto s = rows_into(p + "self_attn.o_proj.weight", hidden, l.o, 0); !s) {
        return std::unexpected(s.error());
      }
      if (c.o_bias) {
        auto bias = vector(p + "self_attn.o_proj.bias", hidden);
        if (!bias) return std::unexpected(bias.error());
        l.o_bias = std::move(*bias);
      }
      l.gate_up = WeightMatrix(2 * ffn, hidden, dtype_for(hidden));
      if (auto s = rows_into(p + "mlp.gate_proj.weight", ffn, l.gate_up, 0); !s) {
        return std::unexpected(s.error());
      }
      if (auto s = rows_into(p + "mlp.up_proj.weight", ffn, l.gate_up, ffn); !s) {
        return std::unexpected(s.error());
      }
      l.down = WeightMatrix(hidden, ffn, dtype_for(ffn));
      if (auto s = rows_into(p + "mlp.down_proj.weight", hidden, l.down, 0); !s) {
        return std::unexpected(s.error());
      }
    }
    auto final_norm = vector("model.norm.weight", hidden);
    if (!final_norm) return std::unexpected(final_norm.error());
    w.final_norm = std::move(*final_norm);
    if (!c.tie_word_embeddings) {
      w.lm_head = WeightMatrix(c.vocab_size, hidden, dtype_for(hidden));
      if (auto s = rows_into("lm_head.weight", c.vocab_size, w.lm_head, 0); !s) {
        return std::unexpected(s.error());
      }
    }
    return w;
  }

 private:
  const TensorSource& source_;
  const ModelConfig& config_;
  WeightDtype dtype_;
};

}  // namespace

namespace {

constexpr std::pair<WeightDtype, GgmlType> kDtypeTypes[] = {
    {WeightDtype::kF32, GgmlType::kF32},   {WeightDtype::kBF16, GgmlType::kBF16},
    {WeightDtype::kQ8_0, GgmlType::kQ8_0}, {WeightDtype::kQ4_0, GgmlType::kQ4_0},
    {WeightDtype::kQ4_K, GgmlType::kQ4_K}, {WeightDtype::kQ5_K, GgmlType::kQ5_K},
    {WeightDtype::kQ6_K, GgmlType::kQ6_K},
};

}  // namespace

GgmlType weight_dtype_ggml_type(WeightDtype dtype) {
  for (const auto& [d, t] : kDtypeTypes) {
    if (d == dtype) return t;
  }
  return GgmlType::kF32;
}

std::optional<WeightDtype> weight_dtype_of_ggml(GgmlType type) {
  for (const auto& [d, t] : kDtypeTypes) {
    if (t == type) return d;
  }
  return std::nullopt;
}

std::string_view weight_dtype_name(WeightDtype dtype) {
  switch (dtype) {
    case WeightDtype::kF32:
      return "f32";
    case WeightDtype::kBF16:
      return "bf16";
    case WeightDtype::kQ8_0:
      return "q8_0";
    case WeightDtype::kQ4_0:
      return "q4_0";
    case WeightDtype::kQ4_K:
      return "q4_k";
    case WeightDtype::kQ5_K:
      return "q5_k";
    case WeightDtype::kQ6_K:
      return "q6_k";
  }
  return "?";
}

std::optional<WeightDtype> parse_weight_dtype(std::string_view name) {
  for (const auto& [d, t] : kDtypeTypes) {
    if (weight_dtype_name(d) == name) return d;
  }
  return std::nullopt;
}

bool is_quantized(WeightDtype dtype) {
  return dtype != WeightDtype::kF32 && dtype != WeightDtype::kBF16;
}

int64_t weight_dtype_block(WeightDtype dtype) {
  return ggml_type_info(static_cast<uint32_t>(weight_dtype_ggml_type(dtype)))->block_values;
}

WeightMatrix::WeightMatrix(int64_t rows, int64_t cols, WeightDtype dtype)
    : rows_(rows), cols_(cols), dtype_(dtype) {
  STRATA_CHECK(rows >= 0 && cols >= 0);
  if (dtype == WeightDtype::kF32) {
    buffer_.resize(static_cast<size_t>(rows) * static_cast<size_t>(cols) * sizeof(float));
  } else if (dtype == WeightDtype::kBF16) {
    buffer_.resize(static_cast<size_t>(num_panels() * panel_elements()) * sizeof(uint16_t));
  } else {
    STRATA_CHECK(cols % weight_dtype_block(dtype) == 0);
    row_bytes_ = ggml_row_bytes(weight_dtype_ggml_type(dtype), cols);
    buffer_.resize(static_cast<size_t>(rows * row_bytes_));
  }
}

void WeightMatrix::set_row(int64_t r, const float* values) {
  STRATA_CHECK(r >= 0 && r < rows_);
  if (dtype_ == WeightDtype::kF32) {
    std::memcpy(f32() + r * cols_, values, static_cast<size_t>(cols_) * sizeof(float));
    return;
  }
  if (is_quantized(dtype_)) {
    quantize_row(weight_dtype_ggml_type(dtype_), values, quant_row(r), cols_);
    return;
  }
  uint16_t* data = buffer_.as<uint16_t>();
  for (int64_t c = 0; c < cols_; ++c) data[packed_index(r, c)] = f32_to_bf16(values[c]);
}

void WeightMatrix::set_row_bf16(int64_t r, const uint16_t* values) {
  STRATA_CHECK(r >= 0 && r < rows_);
  if (dtype_ == WeightDtype::kF32) {
    bf16_to_f32_row(values, f32() + r * cols_, static_cast<size_t>(cols_));
    return;
  }
  if (is_quantized(dtype_)) {
    std::vector<float> row(static_cast<size_t>(cols_));
    bf16_to_f32_row(values, row.data(), row.size());
    set_row(r, row.data());
    return;
  }
  uint16_t* data = buffer_.as<uint16_t>();
  for (int64_t c = 0; c < cols_; ++c) data[packed_index(r, c)] = values[c];
}

float WeightMatrix::at(int64_t r, int64_t c) const {
  if (is_quantized(dtype_)) {
    std::vector<float> row(static_cast<size_t>(cols_));
    row_to_f32(r, row.data());
    return row[static_cast<size_t>(c)];
  }
  return dtype_ == WeightDtype::kF32 ? f32()[r * cols_ + c]
                                     : bf16_to_f32(packed_bf16()[packed_index(r, c)]);
}

void WeightMatrix::row_to_f32(int64_t r, float* out) const {
  rows_to_f32(r, 1, out);
}

void WeightMatrix::rows_to_f32(int64_t row_begin, int64_t num_rows, float* out) const {
  if (dtype_ == WeightDtype::kF32) {
    std::memcpy(out, f32() + row_begin * cols_,
                static_cast<size_t>(num_rows * cols_) * sizeof(float));
    return;
  }
  if (is_quantized(dtype_)) {
    for (int64_t r = 0; r < num_rows; ++r) {
      dequantize_row(weight_dtype_ggml_type(dtype_), quant_row(row_begin + r), out + r * cols_,
                     cols_);
    }
    return;
  }
  const uint16_t* data = packed_bf16();
  for (int64_t r = 0; r < num_rows; ++r) {
    for (int64_t c = 0; c < cols_; ++c) {
      out[r * cols_ + c] = bf16_to_f32(data[packed_index(row_begin + r, c)]);
    }
  }
}

size_t ModelWeights::size_bytes() const {
  size_t total = embed.size_bytes() + lm_head.size_bytes() + final_norm.size() * 4;
  for (const LayerWeights& l : layers) {
    for (const WeightMatrix& m : l.qkv_parts) total += m.size_bytes();
    for (const WeightMatrix& m : l.gate_up_parts) total += m.size_bytes();
    total += l.qkv.size_bytes() + l.o.size_bytes() + l.gate_up.size_bytes() + l.down.size_bytes() +
             (l.attn_norm.size() + l.mlp_norm.size() + l.qkv_bias.size() + l.o_bias.size() +
              l.q_norm.size() + l.k_norm.size()) *
                 4;
  }
  return total;
}

Result<WeightDtype> natural_weight_dtype(const TensorSource& source) {
  const TensorView* view = source.find("model.layers.0.self_attn.q_proj.weight");
  if (view == nullptr) {
    return make_error(
        ErrorCode::kNotFound,
        "missing tensor 'model.layers.0.self_attn.q_proj.weight' in " + source.description());
  }
  if (!view->dtype) {
    return make_error(ErrorCode::kUnsupported,
                      "tensor 'model.layers.0.self_attn.q_proj.weight' has dtype " +
                          view->dtype_name + "; supported dtypes are F32, F16, BF16");
  }
  return *view->dtype == TensorDtype::kBF16 ? WeightDtype::kBF16 : WeightDtype::kF32;
}

Result<ModelWeights> load_weights(const TensorSource& source, const ModelConfig& config,
                                  WeightDtype dtype) {
  if (auto s = validate_model_config(config); !s) return std::unexpected(s.error());
  try {
    return Loader(source, config, dtype).load();
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kResourceExhausted,
                      "out of memory loading the weights of " + source.description());
  }
}

}  // namespace strata
