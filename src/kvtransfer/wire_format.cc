#include "kvtransfer/wire_format.h"

#include <xxhash.h>

#include <fmt/format.h>
#include <cstring>

#include "common/check.h"

namespace strata {

namespace {

constexpr uint32_t kMagic = 0x58564B53;  // "SKVX" in little-endian byte order
constexpr uint16_t kVersion = 1;

void store_u16(std::byte* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void store_u32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void store_u64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
uint64_t load_le(const std::byte* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

uint64_t xxh3(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

}  // namespace

std::vector<std::byte> frame_wire(WireKind kind, std::span<const std::byte> payload) {
  STRATA_CHECK_MSG(payload.size() <= kMaxWirePayloadBytes,
                   fmt::format("wire payload of {} bytes", payload.size()));
  std::vector<std::byte> out(kWireHeaderBytes + payload.size());
  std::byte* h = out.data();
  store_u32(h, kMagic);
  store_u16(h + 4, kVersion);
  store_u16(h + 6, static_cast<uint16_t>(kind));
  store_u32(h + 8, static_cast<uint32_t>(payload.size()));
  store_u32(h + 12, 0);
  store_u64(h + 16, xxh3(payload));
  store_u64(h + 24, xxh3(std::span<const std::byte>(h, 24)));
  if (!payload.empty()) std::memcpy(h + kWireHeaderBytes, payload.data(), payload.size());
  return out;
}

Result<std::span<const std::byte>> unframe_wire(WireKind kind, std::span<const std::byte> frame) {
  auto corrupt = [&](const std::string& what) {
    return make_error(ErrorCode::kCorrupt,
                      fmt::format("bad KV transfer frame ({} bytes, kind {} expected): {}",
                                  frame.size(), static_cast<int>(kind), what));
  };
  if (frame.size() < kWireHeaderBytes) return corrupt("shorter than its header");
  const std::byte* h = frame.data();
  if (load_le(h, 4) != kMagic) return corrupt("bad magic");
  if (load_le(h + 24, 8) != xxh3(frame.first(24))) return corrupt("header checksum mismatch");
  if (load_le(h + 4, 2) != kVersion) {
    return corrupt(
        fmt::format("format version {}, this build reads {}", load_le(h + 4, 2), kVersion));
  }
  if (load_le(h + 6, 2) != static_cast<uint16_t>(kind)) {
    return corrupt(fmt::format("frame of kind {}", load_le(h + 6, 2)));
  }
  const uint64_t payload_bytes = load_le(h + 8, 4);
  if (payload_bytes > kMaxWirePayloadBytes) {
    return corrupt(fmt::format("payload of {} bytes is over the limit", payload_bytes));
  }
  if (load_le(h + 12, 4) != 0) return corrupt("reserved field not zero");
  if (frame.size() != kWireHeaderBytes + payload_bytes) {
    return corrupt(fmt::format("header says {} payload bytes, {} follow", payload_bytes,
                               frame.size() - kWireHeaderBytes));
  }
  const auto payload = frame.subspan(kWireHeaderBytes);
  if (load_le(h + 16, 8) != xxh3(payload)) return corrupt("payload checksum mismatch");
  return payload;
}

void WireWriter::u32(uint32_t v) {
  const size_t at = bytes_.size();
  bytes_.resize(at + 4);
  store_u32(bytes_.data() + at, v);
}

void WireWriter::u64(uint64_t v) {
  const size_t at = bytes_.size();
  bytes_.resize(at + 8);
  store_u64(bytes_.data() + at, v);
}

void WireWriter::blob(std::span<const std::byte> b) {
  STRATA_CHECK(b.size() <= kMaxWirePayloadBytes);
  u32(static_cast<uint32_t>(b.size()));
  bytes_.insert(bytes_.end(), b.begin(), b.end());
}

void WireWriter::pool_shape(const KvPoolShape& shape) {
  i32(shape.num_layers);
  i32(shape.num_kv_heads);
  i32(shape.head_dim);
  i32(shape.num_pages);
  i32(shape.page_size);
  u8(static_cast<uint8_t>(shape.dtype));
}

Result<std::span<const std::byte>> WireReader::take(size_t n, const char* what) {
  if (bytes_.size() - pos_ < n) {
    return make_error(ErrorCode::kCorrupt,
                      fmt::format("KV transfer payload ends inside {} ({} of {} bytes left)", what,
                                  bytes_.size() - pos_, n));
  }
  auto out = bytes_.subspan(pos_, n);
  pos_ += n;
  return out;
}

Result<uint8_t> WireReader::u8(const char* what) {
  auto b = take(1, what);
  if (!b) return std::unexpected(b.error());
  return static_cast<uint8_t>((*b)[0]);
}

Result<uint32_t> WireReader::u32(const char* what) {
  auto b = take(4, what);
  if (!b) return std::unexpected(b.error());
  return static_cast<uint32_t>(load_le(b->data(), 4));
}

Result<uint64_t> WireReader::u64(const char* what) {
  auto b = take(8, what);
  if (!b) return std::unexpected(b.error());
  return load_le(b->data(), 8);
}

Result<int32_t> WireReader::i32(const char* what) {
  auto v = u32(what);
  if (!v) return std::unexpected(v.error());
  return static_cast<int32_t>(*v);
}

Result<std::span<const std::byte>> WireReader::blob(const char* what) {
  auto n = u32(what);
  if (!n) return std::unexpected(n.error());
  return take(*n, what);
}

Result<KvPoolShape> WireReader::pool_shape() {
  KvPoolShape shape;
  const std::pair<int32_t*, const char*> fields[] = {{&shape.num_layers, "num_layers"},
                                                     {&shape.num_kv_heads, "num_kv_heads"},
                                                     {&shape.head_dim, "head_dim"},
                                                     {&shape.num_pages, "num_pages"},
                                                     {&shape.page_size, "page_size"}};
  for (const auto& [field, name] : fields) {
    auto v = i32(name);
    if (!v) return std::unexpected(v.error());
    *field = *v;
  }
  auto dtype = u8("dtype");
  if (!dtype) return std::unexpected(dtype.error());
  if (*dtype > static_cast<uint8_t>(kLastKvDtype)) {
    return make_error(ErrorCode::kCorrupt, fmt::format("unknown KV dtype {}", *dtype));
  }
  shape.dtype = static_cast<KvDtype>(*dtype);
  if (auto s = validate_kv_pool_shape(shape); !s) {
    return make_error(ErrorCode::kCorrupt, "peer's pool shape: " + s.error().message);
  }
  return shape;
}

Status WireReader::finish(const char* what) const {
  if (pos_ != bytes_.size()) {
    return make_error(ErrorCode::kCorrupt, fmt::format("{} has {} unexpected trailing bytes", what,
                                                       bytes_.size() - pos_));
  }
  return {};
}

}  // namespace strata
