// Tensors by name: safetensors files (memory-mapped, read-only), sharded model folders
// (model.safetensors.index.json), and an owning in-memory store; plus the writer that
// `strata make-model` uses.
//
// The safetensors format: an 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the data; offsets are relative to the first byte after the header. Opening a
// file checks every entry against the file's size, so a truncated or inconsistent file
// is refused at open, before any tensor is read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace strata {

// The element types the model can load. Other safetensors dtypes are listed by the
// reader (TensorView::dtype is empty) and refused when a tensor of that type is needed.
enum class TensorDtype : uint8_t {
  kF32,
  kF16,
  kBF16,
};

constexpr size_t tensor_dtype_size_bytes(TensorDtype dtype) {
  return dtype == TensorDtype::kF32 ? 4 : 2;
}
// "F32", "F16", "BF16": the names safetensors uses.
std::string_view tensor_dtype_name(TensorDtype dtype);
// Accepts safetensors names and f32/f16/bf16/float32/float16/bfloat16.
Result<TensorDtype> parse_tensor_dtype(std::string_view name);

// A read-only view of one tensor. `data` stays valid as long as its source.
struct TensorView {
  std::string name;
  std::string dtype_name;            // as written in the file ("BF16", "I64", ...)
  std::optional<TensorDtype> dtype;  // empty when the dtype is not supported
  std::vector<int64_t> shape;
  std::span<const std::byte> data;

  int64_t num_elements() const;
  std::string shape_string() const;  // "[4096, 512]"
};

// Something that holds tensors by name.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // The tensor, or nullptr when absent.
  virtual const TensorView* find(std::string_view name) const = 0;
  // All tensor names, sorted.
  virtual std::vector<std::string> names() const = 0;
  // Where the tensors come from, for error messages.
  virtual std::string description() const = 0;
};

// A read-only memory mapping of a whole file.
class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  static Result<MappedFile> open(const std::filesystem::path& path);

  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// One .safetensors file.
class SafetensorsFile final : public TensorSource {
 public:
  // Maps and validates the file. kIoError when it cannot be read; kCorrupt for a
  // truncated file, a bad header or offsets outside the file.
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::filesystem::path& path);

  const TensorView* find(std::string_view name) const override;
  std::vector<std::string> names() const override;
  std::string description() const override { return path_.string(); }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::filesystem::path path_;
  MappedFile file_;
  std::map<std::string, TensorView, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The weights of a Hugging Face model folder: model.safetensors, or the shards that
// model.safetensors.index.json names (every shard is opened and every name the index
// maps is checked to be in its shard).
class SafetensorsModel final : public TensorSource {
 public:
  static Result<std::unique_ptr<SafetensorsModel>> open(const std::filesystem::path& dir);

  const TensorView* find(std::string_view name) const override;
  std::vector<std::string> names() const override;
  std::string description() const override { return dir_.string(); }

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, const TensorView*, std::less<>> index_;
};

// Tensors held in memory (random weights before they are written, tests).
class TensorStore final : public TensorSource {
 public:
  // Adds or replaces a tensor; `bytes` must hold exactly num_elements * element size.
  void add(std::string name, TensorDtype dtype, std::vector<int64_t> shape,
           std::vector<std::byte> bytes);
  // Adds an F32 tensor converted to `dtype` (round to nearest even).
  void add_f32(std::string name, TensorDtype dtype, std::vector<int64_t> shape,
               std::span<const float> values);
  bool remove(std::string_view name);

  const TensorView* find(std::string_view name) const override;
  std::vector<std::string> names() const override;
  std::string description() const override { return "in-memory tensors"; }

 private:
  struct Entry {
    TensorView view;
    std::vector<std::byte> bytes;
  };
  std::map<std::string, Entry, std::less<>> tensors_;
};

// Writes the named tensors of `source` (all of them when `names` is empty) as one
// safetensors file. The output is deterministic: tensors in name order, keys sorted,
// the header padded with spaces to a multiple of 8 bytes.
Status write_safetensors(const std::filesystem::path& path, const TensorSource& source,
                         std::span<const std::string> names = {},
                         const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Writes `source` as `num_shards` files model-0000i-of-0000n.safetensors (tensors in
// name order, split into runs of about equal bytes) and model.safetensors.index.json.
Status write_sharded_safetensors(const std::filesystem::path& dir, const TensorSource& source,
                                 int num_shards);

}  // namespace strata
