// The bytes that the KV transfer exchanges through the control plane (the room
// handshake): a UCX worker address, a registered region (address, size, packed remote
// key), a pool descriptor. Each travels as a frame that lets the receiver refuse
// truncated, damaged or foreign bytes before any of them reaches UCX, whose unpack
// routines trust their input and may crash on garbage.
//
// Frame (little-endian, 32-byte header then payload):
//
//   offset  0  u32  magic "SKVX"
//   offset  4  u16  format version (1)
//   offset  6  u16  kind (WireKind)
//   offset  8  u32  payload bytes, <= kMaxWirePayloadBytes
//   offset 12  u32  zero
//   offset 16  u64  XXH3-64 of the payload
//   offset 24  u64  XXH3-64 of bytes 0..23 (so a damaged length is never trusted)
//
// The checksums catch corruption and mix-ups, not forgery: a peer that crafts a valid
// frame around bad UCX bytes can still crash UCX, so the control plane must only accept
// handshakes from workers it trusts (docs/kv-transfer.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "memory/kv_pool.h"

namespace strata {

enum class WireKind : uint16_t {
  kUcxWorkerAddress = 1,  // payload: ucp_worker_get_address bytes
  kUcxRegion = 2,         // payload: u64 base, u64 size, u32 n, n bytes of packed rkey
  kUcxPool = 3,           // payload: pool shape, framed address, framed region
  kStoragePool = 4,       // payload: pool shape
};

inline constexpr size_t kWireHeaderBytes = 32;
inline constexpr size_t kMaxWirePayloadBytes = size_t{1} << 20;

// Header then payload. `payload` must not exceed kMaxWirePayloadBytes (checked).
std::vector<std::byte> frame_wire(WireKind kind, std::span<const std::byte> payload);

// The payload of a frame of `kind`, a view into `frame`. kCorrupt, saying what is wrong,
// for a short or long buffer, a bad magic, version or header checksum, another kind, or a
// payload that fails its checksum.
Result<std::span<const std::byte>> unframe_wire(WireKind kind, std::span<const std::byte> frame);

// Appends little-endian fields to a payload.
class WireWriter {
 public:
  void u8(uint8_t v) { bytes_.push_back(static_cast<std::byte>(v)); }
  void u32(uint32_t v);
  void u64(uint64_t v);
  void i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
  // u32 length, then the bytes.
  void blob(std::span<const std::byte> b);
  void pool_shape(const KvPoolShape& shape);
  const std::vector<std::byte>& bytes() const { return bytes_; }
  std::vector<std::byte> take() { return std::move(bytes_); }

 private:
  std::vector<std::byte> bytes_;
};

// Reads fields back; every read is bounds-checked and fails with kCorrupt naming `what`.
class WireReader {
 public:
  explicit WireReader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  Result<uint8_t> u8(const char* what);
  Result<uint32_t> u32(const char* what);
  Result<uint64_t> u64(const char* what);
  Result<int32_t> i32(const char* what);
  Result<std::span<const std::byte>> blob(const char* what);
  // A shape that validate_kv_pool_shape accepts, else kCorrupt.
  Result<KvPoolShape> pool_shape();
  // kCorrupt unless every byte was read.
  Status finish(const char* what) const;

 private:
  Result<std::span<const std::byte>> take(size_t n, const char* what);
  std::span<const std::byte> bytes_;
  size_t pos_ = 0;
};

}  // namespace strata
