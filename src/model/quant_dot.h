// Dot products of quantized weight rows (ggml's block formats, model/quant.h) with
// activation rows quantized once to 8-bit blocks, as llama.cpp does:
//   Q8_0 and Q4_0 weights: the activation in blocks of 32 (an F32 scale d, the 32 int8
//     values, and d times their sum for Q4_0's offset of 8);
//   Q4_K, Q5_K, Q6_K weights: blocks of 256 (an F32 scale, the sums of each 16 values
//     for the K-quants' mins and Q6_K's offset of 32, the 256 int8 values).
// Integer products within a block (u8 x s8 pairs summed into int32), then one F32
// multiply-add per block: the products differ from F32 products of the dequantized
// weights only by the activation's 8-bit rounding (relative error about 2^-8 per value).
//
// Implementations, chosen at run time by the processor (quant_isa_best()): AVX-512 VNNI
// (vpdpbusd on 256-bit vectors, with AVX-512VL), AVX2 (vpmaddubsw + vpmaddwd), and a
// scalar one that runs anywhere. Each is compiled for its own instruction set
// (`#pragma GCC target`), so one binary runs on any x86-64 machine and uses what it has.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "model/quant.h"

namespace strata {

enum class QuantIsa : uint8_t {
  kScalar,
  kAvx2,        // AVX2 + FMA + F16C
  kAvx512Vnni,  // the above + AVX-512 F/BW/VL + VNNI
};

std::string_view quant_isa_name(QuantIsa isa);
bool quant_isa_supported(QuantIsa isa);
// The fastest implementation this processor runs (checked once).
QuantIsa quant_isa_best();

// Whether `type` has dot-product kernels (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K).
bool has_quant_dot(GgmlType type);
// Bytes of an activation row of n values quantized for weights of `type`.
int64_t quant_activation_bytes(GgmlType type, int64_t n);

struct QuantKernels {
  // Quantizes n activations (n a multiple of the weight type's block) into `out`.
  void (*quantize)(const float* x, std::byte* out, int64_t n);
  // The dot product of a weight row and a quantized activation row of n values.
  float (*dot)(const std::byte* w, const std::byte* a, int64_t n);
};

// The kernels for weights of `type` (has_quant_dot) in `isa` (quant_isa_supported).
QuantKernels quant_kernels(GgmlType type, QuantIsa isa = quant_isa_best());

}  // namespace strata
