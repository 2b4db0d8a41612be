// ggml's tensor types as GGUF files store them: their ids, block sizes and bytes, and
// their dequantization and (round-to-nearest) quantization. Written from the formats'
// specification (ggml-common.h's block structs, ggml-quants.c's dequantizers); every
// dequantizer evaluates in the order the specification does, so that it is exact
// (bit for bit) against an F32 reference written from the same formulas.
//
// Block layouts (little-endian; "f16" an IEEE half):
//   Q8_0 (32 values, 34 bytes):  f16 d; int8 q[32].                       x = d * q
//   Q4_0 (32 values, 18 bytes):  f16 d; uint8 qs[16]: value j in the low nibble of qs[j],
//                                value j + 16 in its high nibble.           x = d * (q - 8)
//   Q4_K (256 values, 144 bytes): f16 d; f16 dmin; uint8 scales[12]; uint8 qs[128].
//       8 sub-blocks of 32, each with a 6-bit scale sc and a 6-bit min m packed in
//       `scales` (see k_scale_min); values 64i .. 64i+31 in the low nibbles of
//       qs[32i .. 32i+31], 64i+32 .. 64i+63 in the high nibbles.
//                                                x = (d * sc) * q - (dmin * m)
//   Q5_K (256 values, 176 bytes): Q4_K plus qh[32] (after scales, before qs): the fifth
//       bit of value 64i + l is bit 2i of qh[l], of 64i + 32 + l bit 2i + 1.
//   Q6_K (256 values, 210 bytes): uint8 ql[128]; uint8 qh[64]; int8 scales[16]; f16 d.
//       16 groups of 16 values, group g scaled by scales[g]; q = 6-bit value - 32.
//       In each half h (128 values), for l < 32: values l, l+32, l+64, l+96 take their
//       low 4 bits from ql[64h + l] (low nibble), ql[64h + l + 32] (low), ql[64h + l]
//       (high), ql[64h + l + 32] (high), and their top 2 bits from bits 0-1, 2-3, 4-5,
//       6-7 of qh[32h + l].                     x = (d * scales[g]) * q
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

// ggml_type ids (the numbers GGUF files store).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
};

struct GgmlTypeInfo {
  std::string_view name;  // "Q4_K", as ggml names it
  int64_t block_values;   // values per block (1 for plain types)
  int64_t block_bytes;    // bytes per block
  bool supported;         // Strata dequantizes it (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K)
};

// The type's layout; nullopt for an id this table does not know (its size is unknown, so
// a file holding it cannot be checked).
std::optional<GgmlTypeInfo> ggml_type_info(uint32_t type);
// "Q4_K", or "type 99".
std::string ggml_type_name(uint32_t type);
// Parses q8_0, q4_0, q4_k, q5_k, q6_k, f32, f16, bf16 (any case).
std::optional<GgmlType> parse_ggml_type(std::string_view name);

constexpr int64_t kQK = 32;    // values per Q8_0 / Q4_0 block
constexpr int64_t kQKK = 256;  // values per K-quant super-block

// Bytes of a row of n values (n a multiple of the block).
int64_t ggml_row_bytes(GgmlType type, int64_t n);

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
inline void k_scale_min(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// n values of `type` at src (n a multiple of its block) into dst. `type` must be supported.
void dequantize_row(GgmlType type, const std::byte* src, float* dst, int64_t n);

// n values into `type` at dst (ggml_row_bytes(type, n) bytes), round to nearest: each
// block's scale from its largest magnitude, each value to the nearest level (Q4_0 as
// ggml's reference quantizer: the signed extreme maps to -8). The K-quants' sub-block
// scales and mins are rounded to 6 bits of the super-block's scale, not searched.
// Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K.
bool can_quantize(GgmlType type);
void quantize_row(GgmlType type, const float* src, std::byte* dst, int64_t n);

}  // namespace strata
