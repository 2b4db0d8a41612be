// GGUF files (versions 2 and 3), the format llama.cpp and every local runtime ship
// models in: a reader over the memory-mapped file and a writer (`strata make-model
// --gguf`).
//
// The format (little-endian throughout):
//   uint32 magic "GGUF"; uint32 version; uint64 tensor_count; uint64 kv_count;
//   kv_count entries: string key; uint32 value type; the value;
//   tensor_count infos: string name; uint32 n_dims (1..4); uint64 ne[n_dims]
//       (ne[0] the innermost, contiguous dimension); uint32 ggml type; uint64 offset;
//   padding to `general.alignment` (default 32); the data: each tensor at its offset
//   from here, a multiple of the alignment.
// A string is uint64 length + bytes (no terminator). Value types: 0 u8, 1 i8, 2 u16,
// 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array (uint32 element type, uint64
// count, the elements), 10 u64, 11 i64, 12 f64.
//
// Opening checks everything before any tensor is read: a truncated file, a wrong magic
// or version, an unknown value or tensor type, a count or length larger than the bytes
// left could hold, a tensor whose data is misaligned or runs past the end. Each refusal
// (kCorrupt; kUnsupported for a version or type Strata does not know) names the byte
// offset and the reason.
//
// Thread: a GgufFile is immutable after open(); any thread may read it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "model/quant.h"
#include "model/safetensors.h"

namespace strata {

enum class GgufValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// One metadata value. Integers (and bools) are held in `integer`, floats in `real`;
// arrays hold their elements in the vector of their kind (integers, reals, strings) or,
// for arrays of arrays, in `items`.
struct GgufValue {
  GgufValueType type = GgufValueType::kU8;
  GgufValueType element_type = GgufValueType::kU8;  // arrays only
  int64_t integer = 0;  // u64 values above INT64_MAX are refused at open
  double real = 0;
  std::string string;
  std::vector<int64_t> integers;
  std::vector<double> reals;
  std::vector<std::string> strings;
  std::vector<GgufValue> items;

  bool is_integer() const;  // any integer type or bool
  bool is_real() const { return type == GgufValueType::kF32 || type == GgufValueType::kF64; }
  bool is_string() const { return type == GgufValueType::kString; }
  bool is_array() const { return type == GgufValueType::kArray; }
  size_t array_size() const;
};

struct GgufTensor {
  std::string name;
  std::vector<int64_t> ne;  // ne[0] innermost (a matrix's columns)
  uint32_t type = 0;        // a ggml type id known to ggml_type_info()
  uint64_t offset = 0;      // from the start of the data section
  std::span<const std::byte> data;

  int64_t num_elements() const;
  // [ne[n-1], ..., ne[0]]: row-major order, as Hugging Face writes shapes.
  std::vector<int64_t> shape() const;
};

class GgufFile {
 public:
  static Result<std::unique_ptr<GgufFile>> open(const std::filesystem::path& path);
  // The same checks over bytes in memory (the tests' malformed files); `bytes` must
  // outlive the object.
  static Result<std::unique_ptr<GgufFile>> parse(std::span<const std::byte> bytes,
                                                 std::string description);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::string& description() const { return description_; }
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* tensor(std::string_view name) const;
  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;

  // Typed reads of metadata; kNotFound when absent, kInvalidArgument when of another type.
  Result<std::string> get_string(std::string_view key) const;
  Result<int64_t> get_int(std::string_view key) const;
  Result<double> get_real(std::string_view key) const;  // integers widen
  // The bytes of the whole file (the mapping).
  std::span<const std::byte> bytes() const { return bytes_; }

 private:
  GgufFile() = default;
  Status parse_all();

  std::string description_;
  MappedFile file_;
  std::span<const std::byte> bytes_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Builds a GGUF file (version 3) in memory: metadata in insertion order, then tensors in
// insertion order, each aligned to 32 bytes.
class GgufWriter {
 public:
  void set_string(std::string key, std::string value);
  void set_u32(std::string key, uint32_t value);
  void set_i32(std::string key, int32_t value);
  void set_f32(std::string key, float value);
  void set_bool(std::string key, bool value);
  void set_strings(std::string key, const std::vector<std::string>& values);
  void set_i32s(std::string key, const std::vector<int32_t>& values);
  // A tensor of `type` with dims ne (ne[0] innermost); `data` must hold exactly its bytes.
  void add_tensor(std::string name, std::vector<int64_t> ne, GgmlType type,
                  std::vector<std::byte> data);

  std::vector<std::byte> bytes() const;
  // Streams the file (the tensors are not copied again).
  Status write(const std::filesystem::path& path) const;

 private:
  static constexpr uint64_t kAlign = 32;
  // Everything before the tensors' data, padded to the alignment.
  std::vector<std::byte> header() const;

  struct Tensor {
    std::string name;
    std::vector<int64_t> ne;
    GgmlType type;
    std::vector<std::byte> data;
  };
  std::vector<std::byte> kv_;  // the encoded metadata entries
  uint64_t kv_count_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace strata
