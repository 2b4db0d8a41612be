#include "model/make_gguf.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "memory/kv_dtype.h"
#include "model/model_files.h"
#include "model/quant.h"

namespace strata {

namespace {

// llama.cpp's use_more_bits: the layers Q4_K_M gives Q6_K for attn_v and ffn_down.
bool more_bits_layer(int layer, int num_layers) {
  return layer < num_layers / 8 || layer >= 7 * num_layers / 8 || (layer - num_layers / 8) % 3 == 2;
}

// llama.cpp's general.file_type (llama_ftype) for a make type.
uint32_t file_type(const std::string& t) {
  if (t == "f32") return 0;
  if (t == "f16") return 1;
  if (t == "q4_0") return 2;
  if (t == "q8_0") return 7;
  if (t == "q4_k") return 15;  // stored as Q4_K_M's id: llama.cpp has no plain Q4_K type
  if (t == "q4_k_m") return 15;
  if (t == "q6_k") return 18;
  if (t == "bf16") return 32;
  return 0;
}

std::vector<float> to_f32(const TensorView& view) {
  const int64_t n = view.num_elements();
  std::vector<float> out(static_cast<size_t>(n));
  std::vector<std::byte> aligned(view.data.begin(), view.data.end());
  switch (*view.dtype) {
    case TensorDtype::kF32:
      std::memcpy(out.data(), aligned.data(), out.size() * 4);
      break;
    case TensorDtype::kF16:
      f16_to_f32_row(reinterpret_cast<const uint16_t*>(aligned.data()), out.data(), out.size());
      break;
    case TensorDtype::kBF16:
      bf16_to_f32_row(reinterpret_cast<const uint16_t*>(aligned.data()), out.data(), out.size());
      break;
  }
  return out;
}

}  // namespace

int64_t gguf_permuted_source_row(int64_t r, int64_t head_dim) {
  // numpy: w.reshape(n_head, 2, d / 2, cols).swapaxes(1, 2).reshape(w.shape): file row
  // (head, i, j) with i < d/2, j < 2 holds HF row (head, j, i).
  const int64_t half = head_dim / 2;
  const int64_t head = r / head_dim, within = r % head_dim;
  const int64_t i = within / 2, j = within % 2;
  return head * head_dim + j * half + i;
}

bool is_gguf_make_type(std::string_view name) {
  const std::string t = ascii_lower(name);
  return t == "f32" || t == "f16" || t == "bf16" || t == "q8_0" || t == "q4_0" || t == "q4_k" ||
         t == "q6_k" || t == "q4_k_m";
}

GgmlType gguf_tensor_type(std::string_view make_type, std::string_view gguf_name, int64_t cols,
                          int layer, int num_layers, bool tied) {
  const std::string t = ascii_lower(make_type);
  GgmlType type = GgmlType::kF32;
  if (t == "q4_k_m") {
    const bool output = gguf_name == "output.weight" || (tied && gguf_name == "token_embd.weight");
    const bool v_or_down = gguf_name.find("attn_v.") != std::string_view::npos ||
                           gguf_name.find("ffn_down.") != std::string_view::npos;
    type = output || (v_or_down && more_bits_layer(layer, num_layers)) ? GgmlType::kQ6_K
                                                                       : GgmlType::kQ4_K;
  } else {
    type = *parse_ggml_type(t);
  }
  const int64_t block = ggml_type_info(static_cast<uint32_t>(type))->block_values;
  if (cols % block == 0) return type;
  return cols % kQK == 0 && block == kQKK ? GgmlType::kQ8_0 : GgmlType::kF32;
}

Status write_gguf_model(const std::filesystem::path& path, const ModelConfig& c,
                        const TensorSource& tensors, std::string_view make_type,
                        const GgufTokenizerData* tokenizer, const std::string& name) {
  if (!is_gguf_make_type(make_type)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "GGUF type '" + std::string(make_type) +
                          "' is not one of f32, f16, bf16, q8_0, q4_0, q4_k, q6_k, q4_k_m");
  }
  // Mistral's files are llama's to llama.cpp.
  const std::string arch = c.architecture == Architecture::kMistral
                               ? "llama"
                               : std::string(architecture_model_type(c.architecture));
  const bool permute = arch == "llama";
  GgufWriter w;
  w.set_string("general.architecture", arch);
  w.set_string("general.name", name);
  w.set_u32("general.alignment", 32);
  w.set_u32("general.file_type", file_type(ascii_lower(make_type)));
  const std::string p = arch + ".";
  w.set_u32(p + "context_length", static_cast<uint32_t>(c.max_position_embeddings));
  w.set_u32(p + "embedding_length", static_cast<uint32_t>(c.hidden_size));
  w.set_u32(p + "block_count", static_cast<uint32_t>(c.num_layers));
  w.set_u32(p + "feed_forward_length", static_cast<uint32_t>(c.intermediate_size));
  w.set_u32(p + "attention.head_count", static_cast<uint32_t>(c.num_heads));
  w.set_u32(p + "attention.head_count_kv", static_cast<uint32_t>(c.num_kv_heads));
  w.set_u32(p + "attention.key_length", static_cast<uint32_t>(c.head_dim));
  w.set_u32(p + "attention.value_length", static_cast<uint32_t>(c.head_dim));
  w.set_u32(p + "rope.dimension_count", static_cast<uint32_t>(c.head_dim));
  w.set_f32(p + "attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  w.set_f32(p + "rope.freq_base", static_cast<float>(c.rope_theta));
  if (c.rope_scaling.type == RopeScalingType::kLinear) {
    w.set_string(p + "rope.scaling.type", "linear");
    w.set_f32(p + "rope.scaling.factor", static_cast<float>(c.rope_scaling.factor));
  } else if (c.rope_scaling.type != RopeScalingType::kNone) {
    return make_error(ErrorCode::kUnsupported,
                      "write_gguf_model: only linear RoPE scaling is written");
  }
  if (tokenizer != nullptr) {
    const GgufTokenizerData& t = *tokenizer;
    w.set_string("tokenizer.ggml.model", t.model);
    w.set_string("tokenizer.ggml.pre", t.pre);
    w.set_strings("tokenizer.ggml.tokens", t.tokens);
    w.set_i32s("tokenizer.ggml.token_type", t.token_types);
    w.set_strings("tokenizer.ggml.merges", t.merges);
    if (t.bos_id) w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(*t.bos_id));
    if (t.eos_id) w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(*t.eos_id));
    if (t.padding_id) {
      w.set_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(*t.padding_id));
    }
    w.set_bool("tokenizer.ggml.add_bos_token", t.add_bos);
    if (!t.chat_template.empty()) w.set_string("tokenizer.chat_template", t.chat_template);
  }

  // (HF name, GGUF name, layer, permute rows with head_dim) for every tensor, in GGUF's order.
  struct Entry {
    std::string hf, gguf;
    int layer;
    bool permute;
  };
  std::vector<Entry> entries = {{"model.embed_tokens.weight", "token_embd.weight", -1, false}};
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string h = "model.layers." + std::to_string(i) + ".";
    const std::string g = "blk." + std::to_string(i) + ".";
    entries.push_back({h + "input_layernorm.weight", g + "attn_norm.weight", i, false});
    entries.push_back({h + "self_attn.q_proj.weight", g + "attn_q.weight", i, permute});
    entries.push_back({h + "self_attn.k_proj.weight", g + "attn_k.weight", i, permute});
    entries.push_back({h + "self_attn.v_proj.weight", g + "attn_v.weight", i, false});
    if (c.qkv_bias) {
      entries.push_back({h + "self_attn.q_proj.bias", g + "attn_q.bias", i, permute});
      entries.push_back({h + "self_attn.k_proj.bias", g + "attn_k.bias", i, permute});
      entries.push_back({h + "self_attn.v_proj.bias", g + "attn_v.bias", i, false});
    }
    if (c.qk_norm) {
      entries.push_back({h + "self_attn.q_norm.weight", g + "attn_q_norm.weight", i, false});
      entries.push_back({h + "self_attn.k_norm.weight", g + "attn_k_norm.weight", i, false});
    }
    entries.push_back({h + "self_attn.o_proj.weight", g + "attn_output.weight", i, false});
    if (c.o_bias) {
      entries.push_back({h + "self_attn.o_proj.bias", g + "attn_output.bias", i, false});
    }
    entries.push_back({h + "post_attention_layernorm.weight", g + "ffn_norm.weight", i, false});
    entries.push_back({h + "mlp.gate_proj.weight", g + "ffn_gate.weight", i, false});
    entries.push_back({h + "mlp.up_proj.weight", g + "ffn_up.weight", i, false});
    entries.push_back({h + "mlp.down_proj.weight", g + "ffn_down.weight", i, false});
  }
  entries.push_back({"model.norm.weight", "output_norm.weight", -1, false});
  if (!c.tie_word_embeddings) entries.push_back({"lm_head.weight", "output.weight", -1, false});

  for (const Entry& e : entries) {
    const TensorView* view = tensors.find(e.hf);
    if (view == nullptr || !view->dtype) {
      return make_error(ErrorCode::kNotFound, "write_gguf_model: missing or unsupported tensor '" +
                                                  e.hf + "' in " + tensors.description());
    }
    const std::vector<float> values = to_f32(*view);
    if (view->shape.size() == 1) {
      // Vectors (norms, biases) in F32, q / k biases permuted like their rows.
      const int64_t n = view->shape[0];
      std::vector<float> out(values.size());
      for (int64_t r = 0; r < n; ++r) {
        out[static_cast<size_t>(r)] =
            values[static_cast<size_t>(e.permute ? gguf_permuted_source_row(r, c.head_dim) : r)];
      }
      std::vector<std::byte> bytes(out.size() * 4);
      std::memcpy(bytes.data(), out.data(), bytes.size());
      w.add_tensor(e.gguf, {n}, GgmlType::kF32, std::move(bytes));
      continue;
    }
    const int64_t rows = view->shape[0], cols = view->shape[1];
    const GgmlType type =
        gguf_tensor_type(make_type, e.gguf, cols, e.layer, c.num_layers, c.tie_word_embeddings);
    const int64_t row_bytes = ggml_row_bytes(type, cols);
    std::vector<std::byte> bytes(static_cast<size_t>(rows * row_bytes));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t src = e.permute ? gguf_permuted_source_row(r, c.head_dim) : r;
      quantize_row(type, values.data() + src * cols, bytes.data() + r * row_bytes, cols);
    }
    w.add_tensor(e.gguf, {cols, rows}, type, std::move(bytes));
  }
  return w.write(path);
}

}  // namespace strata
