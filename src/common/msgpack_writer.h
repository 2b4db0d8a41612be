// Appends msgpack to a string with msgpuck, in the shortest forms the reference packers
// (msgpack-cxx, Python's msgpack) choose: an integer as a positive fixint or uint8..64 when
// >= 0 and as a negative fixint or int8..64 when < 0; a double always as float64; strings as
// fixstr/str8/16/32; arrays and maps in their fix/16/32 forms. The one msgpack writer of the
// house: the KV events vLLM's subscribers decode (server/kv_event_publisher.cc) and the P/D
// control messages (pd/pd_messages.cc).
//
// Thread: one writer per thread; take() hands the bytes over.
#pragma once

#include <msgpuck.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace strata {

class MsgpackWriter {
 public:
  void array(uint32_t size) { mp_encode_array(grow(mp_sizeof_array(size)), size); }
  void map(uint32_t size) { mp_encode_map(grow(mp_sizeof_map(size)), size); }
  // msgpuck memcpy()s the bytes: an empty view's data() may be null, which memcpy may not be
  // given even for no bytes (UBSan's nonnull-attribute check, seen at -O1).
  void str(std::string_view s) {
    const auto len = static_cast<uint32_t>(s.size());
    mp_encode_str(grow(mp_sizeof_str(len)), len == 0 ? "" : s.data(), len);
  }
  void bin(std::span<const std::byte> b) {
    const auto len = static_cast<uint32_t>(b.size());
    mp_encode_bin(grow(mp_sizeof_bin(len)), len == 0 ? "" : reinterpret_cast<const char*>(b.data()),
                  len);
  }
  void uint(uint64_t v) { mp_encode_uint(grow(mp_sizeof_uint(v)), v); }
  // mp_encode_int takes negative values only: non-negative ones are uints on the wire.
  void integer(int64_t v) {
    if (v >= 0) {
      uint(static_cast<uint64_t>(v));
    } else {
      mp_encode_int(grow(mp_sizeof_int(v)), v);
    }
  }
  void float64(double v) { mp_encode_double(grow(mp_sizeof_double(v)), v); }
  void nil() { mp_encode_nil(grow(mp_sizeof_nil())); }

  std::string take() && { return std::move(out_); }

 private:
  // Extends the output by `size_bytes` and returns where they start.
  char* grow(uint32_t size_bytes) {
    const size_t at = out_.size();
    out_.resize(at + size_bytes);
    return out_.data() + at;
  }
  std::string out_;
};

}  // namespace strata
