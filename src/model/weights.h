// The model's weights in memory, in the layout the forward pass computes with, loaded
// from Hugging Face tensors with every name and shape checked.
//
// Matrices keep Hugging Face's nn.Linear layout, [out_features][in_features], so
// y = x W^T. Projections that read the same input are fused into one matrix so that
// one GEMM computes them: q, k, v rows stacked into `qkv`; gate and up rows stacked
// into `gate_up`. Norm weights and biases are always F32.
//
// A matrix is F32 (row-major, for OpenBLAS and the F32 decode kernel) or BF16. BF16
// matrices — BF16 checkpoints, or any checkpoint loaded with weight_dtype = BF16 — are
// stored packed for the AVX512-BF16 dot-product instruction: panels of 32 rows; inside
// a panel, for each pair of columns (2p, 2p + 1), the 32 rows' two values side by side
// (64 values, two vectors). One vdpbf16ps then multiplies 16 rows' pairs by a pair of
// activations. BF16 halves the memory traffic of decoding and doubles the arithmetic
// rate of prefill; activations are rounded to BF16 for these products, as llama.cpp
// does for BF16 models.
//
// Quantized matrices (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K: GGUF files, or a checkpoint quantized
// at load with --weight-dtype) keep ggml's block layout (model/quant.h), one row after
// another: a row is cols / block blocks. They are multiplied by model/quant_dot.h's
// kernels (decode) or dequantized a panel at a time into the BF16 layout (prefill,
// matmul.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"
#include "model/aligned_buffer.h"
#include "model/model_config.h"
#include "model/quant.h"
#include "model/safetensors.h"

namespace strata {

enum class WeightDtype : uint8_t {
  kF32,
  kBF16,
  kQ8_0,
  kQ4_0,
  kQ4_K,
  kQ5_K,
  kQ6_K,
};

// "f32", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k".
std::string_view weight_dtype_name(WeightDtype dtype);
std::optional<WeightDtype> parse_weight_dtype(std::string_view name);
bool is_quantized(WeightDtype dtype);
// The ggml type of a quantized dtype (or of F32 / BF16).
GgmlType weight_dtype_ggml_type(WeightDtype dtype);
// The WeightDtype holding a ggml type as it is: nullopt for F16 (held as F32 or BF16)
// and types Strata does not multiply.
std::optional<WeightDtype> weight_dtype_of_ggml(GgmlType type);
// Values per block of a dtype (1 for F32 / BF16): a matrix's columns must be a multiple.
int64_t weight_dtype_block(WeightDtype dtype);

// A [rows][cols] matrix of F32 values (row-major), BF16 values (packed, see above) or
// quantized blocks (rows of ggml blocks; cols a multiple of the block).
class WeightMatrix {
 public:
  static constexpr int64_t kPanelRows = 32;

  WeightMatrix() = default;
  // Zero-filled.
  WeightMatrix(int64_t rows, int64_t cols, WeightDtype dtype);

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  WeightDtype dtype() const { return dtype_; }
  bool empty() const { return rows_ == 0; }
  size_t size_bytes() const { return buffer_.size_bytes(); }

  // F32: row-major data. BF16: the packed panels.
  float* f32() { return buffer_.as<float>(); }
  const float* f32() const { return buffer_.as<float>(); }
  const uint16_t* packed_bf16() const { return buffer_.as<uint16_t>(); }
  // Quantized: the bytes of a row of blocks.
  int64_t row_bytes() const { return row_bytes_; }
  const std::byte* quant_row(int64_t r) const { return buffer_.as<std::byte>() + r * row_bytes_; }
  std::byte* quant_row(int64_t r) { return buffer_.as<std::byte>() + r * row_bytes_; }
  // BF16 packing: columns rounded up to even, elements per panel.
  int64_t padded_cols() const { return (cols_ + 1) / 2 * 2; }
  int64_t panel_elements() const { return kPanelRows * padded_cols(); }
  int64_t num_panels() const { return (rows_ + kPanelRows - 1) / kPanelRows; }

  // Sets row r from F32 values (rounded to nearest even for BF16, quantized to nearest
  // for the quantized dtypes) or BF16 bits.
  void set_row(int64_t r, const float* values);
  void set_row_bf16(int64_t r, const uint16_t* values);

  // Element (r, c) widened to F32.
  float at(int64_t r, int64_t c) const;
  // Row r widened to F32 into out[0..cols).
  void row_to_f32(int64_t r, float* out) const;
  // Rows [row_begin, row_begin + num_rows) widened to F32, row-major, into out.
  void rows_to_f32(int64_t row_begin, int64_t num_rows, float* out) const;

 private:
  // Offset of element (r, c) in the packed BF16 layout.
  int64_t packed_index(int64_t r, int64_t c) const {
    const int64_t lane = r % kPanelRows;
    return (r / kPanelRows) * panel_elements() + (c / 2) * (2 * kPanelRows) + (lane / 16) * 32 +
           (lane % 16) * 2 + c % 2;
  }

  int64_t rows_ = 0;
  int64_t cols_ = 0;
  int64_t row_bytes_ = 0;  // quantized only
  WeightDtype dtype_ = WeightDtype::kF32;
  AlignedBuffer buffer_;
};

// A fused projection may come as parts when they cannot share one matrix (a GGUF file
// whose q, k and v have different types, as Q4_K_M files do): then `qkv` (or `gate_up`)
// is empty and the parts, in order, give its rows.
struct LayerWeights {
  std::vector<float> attn_norm;             // [hidden]
  WeightMatrix qkv;                         // [q_size + 2 kv_size][hidden]: q rows, then k, then v
  std::vector<WeightMatrix> qkv_parts;      // q, k, v when not fused
  std::vector<float> qkv_bias;              // [q_size + 2 kv_size], empty without biases
  std::vector<float> q_norm;                // [head_dim], Qwen3 only
  std::vector<float> k_norm;                // [head_dim], Qwen3 only
  WeightMatrix o;                           // [hidden][q_size]
  std::vector<float> o_bias;                // [hidden], empty without bias
  std::vector<float> mlp_norm;              // [hidden]
  WeightMatrix gate_up;                     // [2 intermediate][hidden]: gate rows, then up rows
  std::vector<WeightMatrix> gate_up_parts;  // gate, up when not fused
  WeightMatrix down;                        // [hidden][intermediate]
};

struct ModelWeights {
  WeightMatrix embed;  // [vocab][hidden]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;  // [hidden]
  WeightMatrix lm_head;           // [vocab][hidden]; empty when tied to embed

  const WeightMatrix& output() const { return lm_head.empty() ? embed : lm_head; }
  size_t size_bytes() const;
};

// The dtype of the checkpoint's matrices (that of layer 0's q_proj), to choose the
// in-memory dtype: BF16 checkpoints stay BF16, F32 and F16 ones become F32.
Result<WeightDtype> natural_weight_dtype(const TensorSource& source);

// Loads and checks every tensor `config` needs. Errors name the tensor and the source:
// kNotFound for a missing tensor, kInvalidArgument for a wrong shape, kUnsupported for
// an unsupported dtype. Tensors the model does not use are ignored.
Result<ModelWeights> load_weights(const TensorSource& source, const ModelConfig& config,
                                  WeightDtype dtype);

}  // namespace strata
