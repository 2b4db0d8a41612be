#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "memory/kv_dtype.h"

namespace strata {

namespace {

using nlohmann::json;

// Header sizes above this are refused (the reference implementation uses 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

// Element sizes of the safetensors dtypes we recognise but do not load, so that their
// byte ranges can still be checked.
std::optional<size_t> any_dtype_size(std::string_view name) {
  static const std::map<std::string_view, size_t> kSizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2},    {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U64", 8},     {"U32", 4},
      {"U16", 2}, {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  auto it = kSizes.find(name);
  if (it == kSizes.end()) return std::nullopt;
  return it->second;
}

std::string errno_text() {
  return std::strerror(errno);
}

Error corrupt(const std::filesystem::path& path, const std::string& what) {
  return Error{ErrorCode::kCorrupt, path.string() + ": " + what};
}

Result<std::string> read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kIoError, "cannot open " + path.string());
  std::ostringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

}  // namespace

std::string_view tensor_dtype_name(TensorDtype dtype) {
  switch (dtype) {
    case TensorDtype::kF32:
      return "F32";
    case TensorDtype::kF16:
      return "F16";
    case TensorDtype::kBF16:
      return "BF16";
  }
  return "unknown";
}

Result<TensorDtype> parse_tensor_dtype(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "f32" || lower == "float32" || lower == "fp32") return TensorDtype::kF32;
  if (lower == "f16" || lower == "float16" || lower == "fp16") return TensorDtype::kF16;
  if (lower == "bf16" || lower == "bfloat16") return TensorDtype::kBF16;
  return make_error(ErrorCode::kUnsupported,
                    "dtype '" + std::string(name) + "' is not supported (F32, F16, BF16)");
}

int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// ---- MappedFile ----

MappedFile::~MappedFile() {
  if (data_ != nullptr && size_ > 0) {
    munmap(const_cast<std::byte*>(data_), size_);
  }
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr && size_ > 0) munmap(const_cast<std::byte*>(data_), size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

Result<MappedFile> MappedFile::open(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return make_error(errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIoError,
                      "cannot open " + path.string() + ": " + errno_text());
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    return make_error(ErrorCode::kIoError, "cannot stat " + path.string() + ": " + why);
  }
  MappedFile mapped;
  mapped.size_ = static_cast<size_t>(st.st_size);
  if (mapped.size_ > 0) {
    void* p = mmap(nullptr, mapped.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const std::string why = errno_text();
      ::close(fd);
      mapped.size_ = 0;
      return make_error(ErrorCode::kIoError, "cannot map " + path.string() + ": " + why);
    }
    madvise(p, mapped.size_, MADV_WILLNEED);
    mapped.data_ = static_cast<const std::byte*>(p);
  }
  ::close(fd);
  return mapped;
}

// ---- SafetensorsFile ----

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::filesystem::path& path) {
  auto mapped = MappedFile::open(path);
  if (!mapped) return std::unexpected(mapped.error());
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->file_ = std::move(*mapped);
  const std::span<const std::byte> bytes = file->file_.bytes();
  if (bytes.size() < 8) {
    return std::unexpected(corrupt(path, "truncated: " + std::to_string(bytes.size()) +
                                             " bytes, shorter than the 8-byte header length"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | std::to_integer<uint64_t>(bytes[i]);
  if (header_len > bytes.size() - 8) {
    return std::unexpected(corrupt(path, "truncated: header length " + std::to_string(header_len) +
                                             " exceeds the file size " +
                                             std::to_string(bytes.size())));
  }
  if (header_len > kMaxHeaderBytes) {
    return std::unexpected(corrupt(path, "header of " + std::to_string(header_len) +
                                             " bytes is larger than the 100 MB limit"));
  }
  const char* header_begin = reinterpret_cast<const char*>(bytes.data() + 8);
  json header = json::parse(header_begin, header_begin + header_len, nullptr, false);
  if (header.is_discarded() || !header.is_object()) {
    return std::unexpected(corrupt(path, "the header is not a JSON object"));
  }
  const std::span<const std::byte> data = bytes.subspan(8 + header_len);
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (it->is_object()) {
        for (auto m = it->begin(); m != it->end(); ++m) {
          if (m->is_string()) file->metadata_[m.key()] = m->get<std::string>();
        }
      }
      continue;
    }
    const json& entry = *it;
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() ||
        !entry.contains("shape") || !entry["shape"].is_array() || !entry.contains("data_offsets") ||
        !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2) {
      return std::unexpected(
          corrupt(path, "tensor '" + name + "' needs dtype, shape and data_offsets [begin, end]"));
    }
    TensorView view;
    view.name = name;
    view.dtype_name = entry["dtype"].get<std::string>();
    if (auto dt = parse_tensor_dtype(view.dtype_name);
        dt && (view.dtype_name == "F32" || view.dtype_name == "F16" || view.dtype_name == "BF16")) {
      view.dtype = *dt;
    }
    uint64_t num_elements = 1;
    for (const json& d : entry["shape"]) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0)) {
        return std::unexpected(corrupt(path, "tensor '" + name + "' has a bad shape"));
      }
      const uint64_t dim = d.get<uint64_t>();
      if (dim > (1ull << 40) || __builtin_mul_overflow(num_elements, dim, &num_elements)) {
        return std::unexpected(corrupt(path, "tensor '" + name + "' has a bad shape"));
      }
      view.shape.push_back(static_cast<int64_t>(dim));
    }
    const json& offsets = entry["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
      return std::unexpected(corrupt(path, "tensor '" + name + "' has bad data_offsets"));
    }
    const uint64_t begin = offsets[0].get<uint64_t>();
    const uint64_t end = offsets[1].get<uint64_t>();
    if (begin > end) {
      return std::unexpected(corrupt(path, "tensor '" + name + "' has data_offsets begin > end"));
    }
    if (end > data.size()) {
      return std::unexpected(corrupt(path, "truncated: tensor '" + name + "' data [" +
                                               std::to_string(begin) + ", " + std::to_string(end) +
                                               ") lies beyond the " + std::to_string(data.size()) +
                                               " data bytes of the file"));
    }
    if (auto elem = any_dtype_size(view.dtype_name)) {
      uint64_t expected = 0;
      if (__builtin_mul_overflow(num_elements, *elem, &expected) || expected != end - begin) {
        return std::unexpected(corrupt(path, "tensor '" + name + "' holds " +
                                                 std::to_string(end - begin) + " bytes but its " +
                                                 view.dtype_name + " shape " + view.shape_string() +
                                                 " needs " + std::to_string(num_elements * *elem)));
      }
    }
    view.data = data.subspan(begin, end - begin);
    file->tensors_.emplace(name, std::move(view));
  }
  return file;
}

const TensorView* SafetensorsFile::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, view] : tensors_) out.push_back(name);
  return out;
}

// ---- SafetensorsModel ----

Result<std::unique_ptr<SafetensorsModel>> SafetensorsModel::open(const std::filesystem::path& dir) {
  std::unique_ptr<SafetensorsModel> model(new SafetensorsModel());
  model->dir_ = dir;
  std::error_code ec;
  const std::filesystem::path single = dir / "model.safetensors";
  const std::filesystem::path index_path = dir / "model.safetensors.index.json";
  if (std::filesystem::exists(index_path, ec)) {
    auto text = read_text(index_path);
    if (!text) return std::unexpected(text.error());
    json index = json::parse(*text, nullptr, false);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
        !index["weight_map"].is_object()) {
      return make_error(ErrorCode::kCorrupt,
                        index_path.string() + ": not valid JSON with a 'weight_map' object");
    }
    std::map<std::string, size_t> shard_of_file;
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      if (!it->is_string()) {
        return make_error(ErrorCode::kCorrupt,
                          index_path.string() + ": weight_map values must be file names");
      }
      const std::string shard_name = it->get<std::string>();
      if (shard_name.find('/') != std::string::npos || shard_name.find("..") != std::string::npos) {
        return make_error(ErrorCode::kCorrupt, index_path.string() + ": shard name '" + shard_name +
                                                   "' must be a plain file name");
      }
      auto [pos, inserted] = shard_of_file.emplace(shard_name, model->shards_.size());
      if (inserted) {
        auto shard = SafetensorsFile::open(dir / shard_name);
        if (!shard) return std::unexpected(shard.error());
        model->shards_.push_back(std::move(*shard));
      }
      const TensorView* view = model->shards_[pos->second]->find(it.key());
      if (view == nullptr) {
        return make_error(ErrorCode::kCorrupt, index_path.string() + ": tensor '" + it.key() +
                                                   "' is mapped to " + shard_name +
                                                   " but that shard does not hold it");
      }
      model->index_.emplace(it.key(), view);
    }
    return model;
  }
  if (!std::filesystem::exists(single, ec)) {
    return make_error(ErrorCode::kNotFound,
                      "no model.safetensors or model.safetensors.index.json in " + dir.string());
  }
  auto file = SafetensorsFile::open(single);
  if (!file) return std::unexpected(file.error());
  model->shards_.push_back(std::move(*file));
  for (const std::string& name : model->shards_[0]->names()) {
    model->index_.emplace(name, model->shards_[0]->find(name));
  }
  return model;
}

const TensorView* SafetensorsModel::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<std::string> SafetensorsModel::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, view] : index_) out.push_back(name);
  return out;
}

// ---- TensorStore ----

void TensorStore::add(std::string name, TensorDtype dtype, std::vector<int64_t> shape,
                      std::vector<std::byte> bytes) {
  Entry entry;
  entry.bytes = std::move(bytes);
  entry.view.name = name;
  entry.view.dtype = dtype;
  entry.view.dtype_name = std::string(tensor_dtype_name(dtype));
  entry.view.shape = std::move(shape);
  auto [it, inserted] = tensors_.insert_or_assign(std::move(name), std::move(entry));
  // The span must point into the stored vector, not the moved-from local.
  it->second.view.data = std::span<const std::byte>(it->second.bytes);
}

void TensorStore::add_f32(std::string name, TensorDtype dtype, std::vector<int64_t> shape,
                          std::span<const float> values) {
  std::vector<std::byte> bytes(values.size() * tensor_dtype_size_bytes(dtype));
  switch (dtype) {
    case TensorDtype::kF32:
      std::memcpy(bytes.data(), values.data(), bytes.size());
      break;
    case TensorDtype::kF16:
      f32_to_f16_row(values.data(), reinterpret_cast<uint16_t*>(bytes.data()), values.size());
      break;
    case TensorDtype::kBF16:
      f32_to_bf16_row(values.data(), reinterpret_cast<uint16_t*>(bytes.data()), values.size());
      break;
  }
  add(std::move(name), dtype, std::move(shape), std::move(bytes));
}

bool TensorStore::remove(std::string_view name) {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return false;
  tensors_.erase(it);
  return true;
}

const TensorView* TensorStore::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second.view;
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, entry] : tensors_) out.push_back(name);
  return out;
}

// ---- writers ----

Status write_safetensors(const std::filesystem::path& path, const TensorSource& source,
                         std::span<const std::string> names,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<std::string> order(names.begin(), names.end());
  if (order.empty()) order = source.names();
  std::sort(order.begin(), order.end());
  order.erase(std::unique(order.begin(), order.end()), order.end());
  json header = json::object();
  uint64_t offset = 0;
  std::vector<const TensorView*> views;
  for (const std::string& name : order) {
    const TensorView* view = source.find(name);
    if (view == nullptr) {
      return make_error(ErrorCode::kNotFound, "write_safetensors: no tensor '" + name + "'");
    }
    views.push_back(view);
    header[name] = {{"dtype", view->dtype_name},
                    {"shape", view->shape},
                    {"data_offsets", {offset, offset + view->data.size()}}};
    offset += view->data.size();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string header_text = header.dump();
  while (header_text.size() % 8 != 0) header_text.push_back(' ');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return make_error(ErrorCode::kIoError, "cannot create " + path.string());
  char len_bytes[8];
  uint64_t len = header_text.size();
  for (char& b : len_bytes) {
    b = static_cast<char>(len & 0xff);
    len >>= 8;
  }
  out.write(len_bytes, 8);
  out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
  for (const TensorView* view : views) {
    out.write(reinterpret_cast<const char*>(view->data.data()),
              static_cast<std::streamsize>(view->data.size()));
  }
  out.close();
  if (!out) return make_error(ErrorCode::kIoError, "cannot write " + path.string());
  return {};
}

Status write_sharded_safetensors(const std::filesystem::path& dir, const TensorSource& source,
                                 int num_shards) {
  if (num_shards < 1) {
    return make_error(ErrorCode::kInvalidArgument, "num_shards must be >= 1");
  }
  const std::vector<std::string> all = source.names();
  uint64_t total_bytes = 0;
  for (const std::string& name : all) total_bytes += source.find(name)->data.size();
  const uint64_t target = total_bytes / static_cast<uint64_t>(num_shards) + 1;
  std::vector<std::vector<std::string>> shards(1);
  uint64_t in_shard = 0;
  for (const std::string& name : all) {
    const uint64_t size = source.find(name)->data.size();
    if (in_shard > 0 && in_shard + size > target && static_cast<int>(shards.size()) < num_shards) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(name);
    in_shard += size;
  }
  const int n = static_cast<int>(shards.size());
  json weight_map = json::object();
  for (int i = 0; i < n; ++i) {
    char file_name[64];
    std::snprintf(file_name, sizeof file_name, "model-%05d-of-%05d.safetensors", i + 1, n);
    if (auto s = write_safetensors(dir / file_name, source, shards[i]); !s) return s;
    for (const std::string& name : shards[i]) weight_map[name] = file_name;
  }
  json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  std::ofstream out(dir / "model.safetensors.index.json", std::ios::trunc);
  out << index.dump(2) << "\n";
  out.close();
  if (!out) return make_error(ErrorCode::kIoError, "cannot write the safetensors index");
  return {};
}

}  // namespace strata
