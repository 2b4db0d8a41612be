#include "model/gguf.h"

#include <cstring>
#include <fstream>
#include <limits>

namespace strata {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr int kMaxDims = 4;
constexpr int kMaxArrayDepth = 8;

// A cursor over the file's bytes; every read checks the bytes left and reports the
// offset of the failing read.
class Reader {
 public:
  Reader(std::span<const std::byte> bytes, const std::string& description)
      : bytes_(bytes), description_(description) {}

  uint64_t offset() const { return pos_; }
  uint64_t left() const { return bytes_.size() - pos_; }

  Error error(uint64_t at, const std::string& what, ErrorCode code = ErrorCode::kCorrupt) const {
    std::string message = description_;
    message.append(": GGUF at byte ").append(std::to_string(at)).append(": ").append(what);
    return Error{code, std::move(message)};
  }

  template <typename T>
  Result<T> read(const char* what) {
    if (left() < sizeof(T)) {
      return std::unexpected(error(pos_, std::string("truncated reading ") + what));
    }
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return v;
  }

  Result<std::string> read_string(const char* what) {
    const uint64_t at = pos_;
    auto len = read<uint64_t>(what);
    if (!len) return std::unexpected(len.error());
    if (*len > left()) {
      return std::unexpected(error(at, std::string(what) + ": length " + std::to_string(*len) +
                                           " exceeds the " + std::to_string(left()) +
                                           " bytes left"));
    }
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), *len);
    pos_ += *len;
    return s;
  }

  // A count of items of at least `min_item_bytes` each: refused when the bytes left
  // cannot hold them (an absurd count, before anything is allocated for it).
  Status check_count(uint64_t at, uint64_t count, uint64_t min_item_bytes, const char* what) {
    if (min_item_bytes > 0 && count > left() / min_item_bytes) {
      return std::unexpected(error(at, std::string(what) + " " + std::to_string(count) +
                                           " cannot fit in the " + std::to_string(left()) +
                                           " bytes left"));
    }
    return {};
  }

 private:
  std::span<const std::byte> bytes_;
  const std::string& description_;
  uint64_t pos_ = 0;
};

// Bytes of a scalar of `type` (strings, arrays: their minimum, 8).
std::optional<uint64_t> scalar_bytes(uint32_t type) {
  switch (static_cast<GgufValueType>(type)) {
    case GgufValueType::kU8:
    case GgufValueType::kI8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kU16:
    case GgufValueType::kI16:
      return 2;
    case GgufValueType::kU32:
    case GgufValueType::kI32:
    case GgufValueType::kF32:
      return 4;
    case GgufValueType::kU64:
    case GgufValueType::kI64:
    case GgufValueType::kF64:
    case GgufValueType::kString:
      return 8;
    case GgufValueType::kArray:
      return 12;
  }
  return std::nullopt;
}

Status read_value(Reader& r, uint32_t type, GgufValue& out, int depth);

Status read_scalar(Reader& r, uint32_t type, GgufValue& out) {
  const uint64_t at = r.offset();
  auto fail = [](const Error& e) -> Status { return std::unexpected(e); };
  switch (static_cast<GgufValueType>(type)) {
    case GgufValueType::kU8: {
      auto v = r.read<uint8_t>("a u8 value");
      if (!v) return fail(v.error());
      out.integer = *v;
      return {};
    }
    case GgufValueType::kI8: {
      auto v = r.read<int8_t>("an i8 value");
      if (!v) return fail(v.error());
      out.integer = *v;
      return {};
    }
    case GgufValueType::kU16: {
      auto v = r.read<uint16_t>("a u16 value");
      if (!v) return fail(v.error());
      out.integer = *v;
      return {};
    }
    case GgufValueType::kI16: {
      auto v = r.read<int16_t>("an i16 value");
      if (!v) return fail(v.error());
      out.integer = *v;
      return {};
    }
    case GgufValueType::kU32: {
      auto v = r.read<uint32_t>("a u32 value");
      if (!v) return fail(v.error());
      out.integer = *v;
      return {};
    }
    case GgufValueType::kI32: {
      auto v = r.read<int32_t>("an i32 value");
      if (!v) return fail(v.error());
      out.integer = *v;
      return {};
    }
    case GgufValueType::kU64: {
      auto v = r.read<uint64_t>("a u64 value");
      if (!v) return fail(v.error());
      if (*v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return fail(r.error(at, "u64 value " + std::to_string(*v) + " out of range"));
      }
      out.integer = static_cast<int64_t>(*v);
      return {};
    }
    case GgufValueType::kI64: {
      auto v = r.read<int64_t>("an i64 value");
      if (!v) return fail(v.error());
      out.integer = *v;
      return {};
    }
    case GgufValueType::kF32: {
      auto v = r.read<float>("an f32 value");
      if (!v) return fail(v.error());
      out.real = *v;
      return {};
    }
    case GgufValueType::kF64: {
      auto v = r.read<double>("an f64 value");
      if (!v) return fail(v.error());
      out.real = *v;
      return {};
    }
    case GgufValueType::kBool: {
      auto v = r.read<uint8_t>("a bool value");
      if (!v) return fail(v.error());
      if (*v > 1) return fail(r.error(at, "bool value " + std::to_string(*v) + " is not 0 or 1"));
      out.integer = *v;
      return {};
    }
    case GgufValueType::kString: {
      auto v = r.read_string("a string value");
      if (!v) return fail(v.error());
      out.string = std::move(*v);
      return {};
    }
    case GgufValueType::kArray:
      break;
  }
  return fail(r.error(at, "unknown value type " + std::to_string(type)));
}

Status read_array(Reader& r, GgufValue& out, int depth) {
  const uint64_t at = r.offset();
  if (depth >= kMaxArrayDepth) {
    return std::unexpected(
        r.error(at, "arrays nested deeper than " + std::to_string(kMaxArrayDepth)));
  }
  auto element = r.read<uint32_t>("an array's element type");
  if (!element) return std::unexpected(element.error());
  const auto size = scalar_bytes(*element);
  if (!size) {
    return std::unexpected(r.error(at, "unknown array element type " + std::to_string(*element)));
  }
  const uint64_t count_at = r.offset();
  auto count = r.read<uint64_t>("an array's length");
  if (!count) return std::unexpected(count.error());
  if (auto s = r.check_count(count_at, *count, *size, "array length"); !s) return s;
  out.element_type = static_cast<GgufValueType>(*element);
  const auto n = static_cast<size_t>(*count);
  GgufValue item;
  switch (out.element_type) {
    case GgufValueType::kString:
      out.strings.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        auto s = r.read_string("an array's string");
        if (!s) return std::unexpected(s.error());
        out.strings.push_back(std::move(*s));
      }
      return {};
    case GgufValueType::kArray:
      out.items.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        GgufValue inner;
        if (auto s = read_value(r, *element, inner, depth + 1); !s) return s;
        out.items.push_back(std::move(inner));
      }
      return {};
    case GgufValueType::kF32:
    case GgufValueType::kF64:
      out.reals.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        if (auto s = read_scalar(r, *element, item); !s) return s;
        out.reals.push_back(item.real);
      }
      return {};
    default:
      out.integers.reserve(n);
      for (size_t i = 0; i < n; ++i) {
        if (auto s = read_scalar(r, *element, item); !s) return s;
        out.integers.push_back(item.integer);
      }
      return {};
  }
}

Status read_value(Reader& r, uint32_t type, GgufValue& out, int depth) {
  out.type = static_cast<GgufValueType>(type);
  if (out.type == GgufValueType::kArray) return read_array(r, out, depth);
  return read_scalar(r, type, out);
}

}  // namespace

bool GgufValue::is_integer() const {
  return !is_real() && !is_string() && !is_array();
}

size_t GgufValue::array_size() const {
  return integers.size() + reals.size() + strings.size() + items.size();
}

int64_t GgufTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

std::vector<int64_t> GgufTensor::shape() const {
  return std::vector<int64_t>(ne.rbegin(), ne.rend());
}

Result<std::unique_ptr<GgufFile>> GgufFile::open(const std::filesystem::path& path) {
  auto mapped = MappedFile::open(path);
  if (!mapped) return std::unexpected(mapped.error());
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->description_ = path.string();
  file->file_ = std::move(*mapped);
  file->bytes_ = file->file_.bytes();
  if (auto s = file->parse_all(); !s) return std::unexpected(s.error());
  return file;
}

Result<std::unique_ptr<GgufFile>> GgufFile::parse(std::span<const std::byte> bytes,
                                                  std::string description) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->description_ = std::move(description);
  file->bytes_ = bytes;
  if (auto s = file->parse_all(); !s) return std::unexpected(s.error());
  return file;
}

Status GgufFile::parse_all() {
  Reader r(bytes_, description_);
  auto magic = r.read<uint32_t>("the magic");
  if (!magic) return std::unexpected(magic.error());
  if (*magic != kMagic) return std::unexpected(r.error(0, "wrong magic (not a GGUF file)"));
  auto version = r.read<uint32_t>("the version");
  if (!version) return std::unexpected(version.error());
  if (*version != 2 && *version != 3) {
    return std::unexpected(r.error(
        4, "version " + std::to_string(*version) + " is not supported (versions 2 and 3 are)",
        ErrorCode::kUnsupported));
  }
  version_ = *version;
  auto tensor_count = r.read<uint64_t>("the tensor count");
  if (!tensor_count) return std::unexpected(tensor_count.error());
  auto kv_count = r.read<uint64_t>("the metadata count");
  if (!kv_count) return std::unexpected(kv_count.error());
  // A metadata entry takes at least 8 + 4 + 1 bytes, a tensor info 8 + 4 + 8 + 4 + 8.
  if (auto s = r.check_count(16, *kv_count, 13, "metadata count"); !s) return s;
  if (auto s = r.check_count(8, *tensor_count, 32, "tensor count"); !s) return s;

  for (uint64_t i = 0; i < *kv_count; ++i) {
    const uint64_t at = r.offset();
    auto key = r.read_string("a metadata key");
    if (!key) return std::unexpected(key.error());
    auto type = r.read<uint32_t>("a metadata value type");
    if (!type) return std::unexpected(type.error());
    GgufValue value;
    if (auto s = read_value(r, *type, value, 0); !s) return s;
    if (metadata_.count(*key) != 0) {
      return std::unexpected(r.error(at, "metadata key '" + *key + "' appears twice"));
    }
    metadata_.emplace(std::move(*key), std::move(value));
  }
  if (const GgufValue* a = find("general.alignment"); a != nullptr) {
    if (!a->is_integer() || a->integer <= 0 || (a->integer & (a->integer - 1)) != 0 ||
        a->integer > (1 << 20)) {
      return std::unexpected(
          r.error(r.offset(), "general.alignment must be a power of two up to 1 MiB"));
    }
    alignment_ = static_cast<uint64_t>(a->integer);
  }

  tensors_.reserve(static_cast<size_t>(*tensor_count));
  std::vector<uint64_t> info_at;
  std::vector<uint64_t> sizes;
  for (uint64_t i = 0; i < *tensor_count; ++i) {
    const uint64_t at = r.offset();
    info_at.push_back(at);
    GgufTensor t;
    auto name = r.read_string("a tensor name");
    if (!name) return std::unexpected(name.error());
    t.name = std::move(*name);
    const uint64_t dims_at = r.offset();
    auto n_dims = r.read<uint32_t>("a tensor's dimension count");
    if (!n_dims) return std::unexpected(n_dims.error());
    if (*n_dims < 1 || *n_dims > kMaxDims) {
      return std::unexpected(r.error(dims_at, "tensor '" + t.name + "' has " +
                                                  std::to_string(*n_dims) +
                                                  " dimensions (1 to 4 allowed)"));
    }
    uint64_t elements = 1;
    for (uint32_t d = 0; d < *n_dims; ++d) {
      const uint64_t ne_at = r.offset();
      auto ne = r.read<uint64_t>("a tensor dimension");
      if (!ne) return std::unexpected(ne.error());
      if (*ne == 0 || *ne > (uint64_t{1} << 40) || elements > (uint64_t{1} << 48) / *ne) {
        return std::unexpected(r.error(ne_at, "tensor '" + t.name + "' has dimension " +
                                                  std::to_string(*ne) + " (out of range)"));
      }
      elements *= *ne;
      t.ne.push_back(static_cast<int64_t>(*ne));
    }
    const uint64_t type_at = r.offset();
    auto type = r.read<uint32_t>("a tensor type");
    if (!type) return std::unexpected(type.error());
    const auto info = ggml_type_info(*type);
    if (!info) {
      return std::unexpected(
          r.error(type_at, "tensor '" + t.name + "' has unknown type " + std::to_string(*type),
                  ErrorCode::kUnsupported));
    }
    if (t.ne[0] % info->block_values != 0) {
      return std::unexpected(r.error(
          dims_at, "tensor '" + t.name + "' of type " + std::string(info->name) + " has a row of " +
                       std::to_string(t.ne[0]) + " values, not a multiple of its block (" +
                       std::to_string(info->block_values) + ")"));
    }
    t.type = *type;
    const uint64_t offset_at = r.offset();
    auto offset = r.read<uint64_t>("a tensor offset");
    if (!offset) return std::unexpected(offset.error());
    if (*offset % alignment_ != 0) {
      return std::unexpected(r.error(
          offset_at, "tensor '" + t.name + "' offset " + std::to_string(*offset) +
                         " is not a multiple of the alignment " + std::to_string(alignment_)));
    }
    t.offset = *offset;
    // Bytes: elements / block * block bytes (exact: ne[0] is a multiple of the block).
    const uint64_t size = elements / static_cast<uint64_t>(info->block_values) *
                          static_cast<uint64_t>(info->block_bytes);
    sizes.push_back(size);  // the span is placed below, once the data's start is known
    if (tensor_index_.count(t.name) != 0) {
      return std::unexpected(r.error(at, "tensor '" + t.name + "' appears twice"));
    }
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }
  const uint64_t data_start = (r.offset() + alignment_ - 1) / alignment_ * alignment_;
  if (data_start > bytes_.size() && !tensors_.empty()) {
    return std::unexpected(r.error(r.offset(),
                                   "truncated: the data section's padding runs past "
                                   "the end of the file"));
  }
  const uint64_t data_size = data_start <= bytes_.size() ? bytes_.size() - data_start : 0;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    GgufTensor& t = tensors_[i];
    const uint64_t size = sizes[i];
    if (t.offset > data_size || size > data_size - t.offset) {
      return std::unexpected(
          r.error(info_at[i], "tensor '" + t.name + "' (" + std::to_string(size) +
                                  " bytes at data offset " + std::to_string(t.offset) +
                                  ") runs past the end of the file (" + std::to_string(data_size) +
                                  " data bytes)"));
    }
    t.data = bytes_.subspan(static_cast<size_t>(data_start + t.offset), static_cast<size_t>(size));
  }
  return {};
}

const GgufTensor* GgufFile::tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

Result<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) {
    return make_error(ErrorCode::kNotFound,
                      description_ + ": missing metadata '" + std::string(key) + "'");
  }
  if (!v->is_string()) {
    return make_error(ErrorCode::kInvalidArgument,
                      description_ + ": metadata '" + std::string(key) + "' is not a string");
  }
  return v->string;
}

Result<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) {
    return make_error(ErrorCode::kNotFound,
                      description_ + ": missing metadata '" + std::string(key) + "'");
  }
  if (!v->is_integer()) {
    return make_error(ErrorCode::kInvalidArgument,
                      description_ + ": metadata '" + std::string(key) + "' is not an integer");
  }
  return v->integer;
}

Result<double> GgufFile::get_real(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) {
    return make_error(ErrorCode::kNotFound,
                      description_ + ": missing metadata '" + std::string(key) + "'");
  }
  if (v->is_real()) return v->real;
  if (v->is_integer()) return static_cast<double>(v->integer);
  return make_error(ErrorCode::kInvalidArgument,
                    description_ + ": metadata '" + std::string(key) + "' is not a number");
}

// ---- GgufWriter ----

namespace {

template <typename T>
void put(std::vector<std::byte>& out, T v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}

void put_string(std::vector<std::byte>& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  const auto* p = reinterpret_cast<const std::byte*>(s.data());
  out.insert(out.end(), p, p + s.size());
}

}  // namespace

void GgufWriter::set_string(std::string key, std::string value) {
  put_string(kv_, key);
  put<uint32_t>(kv_, static_cast<uint32_t>(GgufValueType::kString));
  put_string(kv_, value);
  ++kv_count_;
}

void GgufWriter::set_u32(std::string key, uint32_t value) {
  put_string(kv_, key);
  put<uint32_t>(kv_, static_cast<uint32_t>(GgufValueType::kU32));
  put<uint32_t>(kv_, value);
  ++kv_count_;
}

void GgufWriter::set_i32(std::string key, int32_t value) {
  put_string(kv_, key);
  put<uint32_t>(kv_, static_cast<uint32_t>(GgufValueType::kI32));
  put<int32_t>(kv_, value);
  ++kv_count_;
}

void GgufWriter::set_f32(std::string key, float value) {
  put_string(kv_, key);
  put<uint32_t>(kv_, static_cast<uint32_t>(GgufValueType::kF32));
  put<float>(kv_, value);
  ++kv_count_;
}

void GgufWriter::set_bool(std::string key, bool value) {
  put_string(kv_, key);
  put<uint32_t>(kv_, static_cast<uint32_t>(GgufValueType::kBool));
  put<uint8_t>(kv_, value ? 1 : 0);
  ++kv_count_;
}

void GgufWriter::set_strings(std::string key, const std::vector<std::string>& values) {
  put_string(kv_, key);
  put<uint32_t>(kv_, static_cast<uint32_t>(GgufValueType::kArray));
  put<uint32_t>(kv_, static_cast<uint32_t>(GgufValueType::kString));
  put<uint64_t>(kv_, values.size());
  for (const std::string& v : values) put_string(kv_, v);
  ++kv_count_;
}

void GgufWriter::set_i32s(std::string key, const std::vector<int32_t>& values) {
  put_string(kv_, key);
  put<uint32_t>(kv_, static_cast<uint32_t>(GgufValueType::kArray));
  put<uint32_t>(kv_, static_cast<uint32_t>(GgufValueType::kI32));
  put<uint64_t>(kv_, values.size());
  for (int32_t v : values) put<int32_t>(kv_, v);
  ++kv_count_;
}

void GgufWriter::add_tensor(std::string name, std::vector<int64_t> ne, GgmlType type,
                            std::vector<std::byte> data) {
  tensors_.push_back(Tensor{std::move(name), std::move(ne), type, std::move(data)});
}

std::vector<std::byte> GgufWriter::header() const {
  std::vector<std::byte> out;
  put<uint32_t>(out, kMagic);
  put<uint32_t>(out, 3);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, kv_count_);
  out.insert(out.end(), kv_.begin(), kv_.end());
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_string(out, t.name);
    put<uint32_t>(out, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) put<uint64_t>(out, static_cast<uint64_t>(d));
    put<uint32_t>(out, static_cast<uint32_t>(t.type));
    put<uint64_t>(out, offset);
    offset += (t.data.size() + kAlign - 1) / kAlign * kAlign;
  }
  out.resize((out.size() + kAlign - 1) / kAlign * kAlign);
  return out;
}

std::vector<std::byte> GgufWriter::bytes() const {
  std::vector<std::byte> out = header();
  for (const Tensor& t : tensors_) {
    out.insert(out.end(), t.data.begin(), t.data.end());
    out.resize((out.size() + kAlign - 1) / kAlign * kAlign);
  }
  return out;
}

Status GgufWriter::write(const std::filesystem::path& path) const {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return make_error(ErrorCode::kIoError, "cannot create " + path.string());
  auto put_bytes = [&](const std::byte* p, size_t n) {
    out.write(reinterpret_cast<const char*>(p), static_cast<std::streamsize>(n));
  };
  const std::vector<std::byte> head = header();
  put_bytes(head.data(), head.size());
  const std::byte zeros[kAlign] = {};
  for (const Tensor& t : tensors_) {
    put_bytes(t.data.data(), t.data.size());
    put_bytes(zeros, (kAlign - t.data.size() % kAlign) % kAlign);
  }
  out.flush();
  if (!out) return make_error(ErrorCode::kIoError, "cannot write " + path.string());
  return {};
}

}  // namespace strata
