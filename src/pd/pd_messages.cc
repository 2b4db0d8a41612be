#include "pd/pd_messages.h"

#include <msgpuck.h>

#include <fmt/format.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>

#include "common/msgpack_writer.h"

namespace strata::pd {
namespace {

// Field counts of each kind's array, header (version, kind) included.
constexpr uint32_t kHeaderFields = 2;
constexpr uint32_t kHelloFields = kHeaderFields + 5;
constexpr uint32_t kHeartbeatFields = kHeaderFields + 2;
constexpr uint32_t kOrderFields = kHeaderFields + 9;
constexpr uint32_t kTransportFields = 6;
constexpr uint32_t kAcceptedFields = kHeaderFields + 1;
constexpr uint32_t kRejectedFields = kHeaderFields + 3;
constexpr uint32_t kPagesWrittenFields = kHeaderFields + 3;
constexpr uint32_t kDoneFields = kHeaderFields + 5;
constexpr uint32_t kFailedFields = kHeaderFields + 2;
constexpr uint32_t kCancelFields = kHeaderFields + 1;

// The kinds' wire names, in the variant's order.
constexpr std::string_view kKindNames[] = {"Hello",         "Heartbeat",     "PrefillOrder",
                                           "OrderAccepted", "OrderRejected", "PagesWritten",
                                           "PrefillDone",   "PrefillFailed", "Cancel"};
static_assert(std::size(kKindNames) == std::variant_size_v<Message>);

std::unexpected<Error> invalid(std::string message) {
  return make_error(ErrorCode::kInvalidArgument, "PD message: " + std::move(message));
}

std::unexpected<Error> corrupt(std::string message) {
  return make_error(ErrorCode::kCorrupt, "PD message: " + std::move(message));
}

// `s` cut to at most `max_bytes`, never inside a UTF-8 sequence.
std::string cut_utf8(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return std::string(s);
  size_t n = max_bytes;
  while (n > 0 && (static_cast<uint8_t>(s[n]) & 0xc0) == 0x80) --n;
  return std::string(s.substr(0, n));
}

// ---------------------------------------------------------------------------------------
// Validation (shared by encode and decode).

Status check_room(RoomId room, std::string_view kind) {
  if (room_value(room) == 0) return invalid(fmt::format("{}.room is 0", kind));
  return {};
}

Status check_reason(std::string_view reason, std::string_view kind) {
  if (reason.size() > kMaxReasonBytes) {
    return invalid(
        fmt::format("{}.reason is {} bytes, more than {}", kind, reason.size(), kMaxReasonBytes));
  }
  return {};
}

Status check_transport(const TransportInfo& t) {
  if (t.kind == TransportKind::kUcx) {
    if (t.ucx_worker_address.empty() || t.ucx_worker_address.size() > kMaxUcxBlobBytes) {
      return invalid(fmt::format("transport.ucx_worker_address must be 1..{} bytes, is {}",
                                 kMaxUcxBlobBytes, t.ucx_worker_address.size()));
    }
    if (t.ucx_rkey.empty() || t.ucx_rkey.size() > kMaxUcxBlobBytes) {
      return invalid(fmt::format("transport.ucx_rkey must be 1..{} bytes, is {}", kMaxUcxBlobBytes,
                                 t.ucx_rkey.size()));
    }
    if (t.region_bytes == 0) return invalid("transport.region_bytes is 0");
    if (!t.storage_prefix.empty()) return invalid("transport.storage_prefix is set for ucx");
    return {};
  }
  if (t.storage_prefix.empty() || t.storage_prefix.size() > kMaxStoragePrefixBytes) {
    return invalid(fmt::format("transport.storage_prefix must be 1..{} bytes, is {}",
                               kMaxStoragePrefixBytes, t.storage_prefix.size()));
  }
  if (!t.ucx_worker_address.empty() || !t.ucx_rkey.empty() || t.remote_base != 0 ||
      t.region_bytes != 0) {
    return invalid("transport has UCX fields set for storage");
  }
  return {};
}

Status check_sampling(const SamplingMap& sampling) {
  if (sampling.size() > kMaxSamplingEntries) {
    return invalid(
        fmt::format("sampling has {} entries, more than {}", sampling.size(), kMaxSamplingEntries));
  }
  for (const auto& [key, value] : sampling) {
    if (key.empty() || key.size() > kMaxSamplingKeyBytes) {
      return invalid(fmt::format("a sampling key must be 1..{} bytes", kMaxSamplingKeyBytes));
    }
    if (const auto* d = std::get_if<double>(&value); d != nullptr && !std::isfinite(*d)) {
      return invalid(fmt::format("sampling.{} is not finite", key));
    }
  }
  return {};
}

Status check_order(const PrefillOrder& o) {
  if (auto s = check_room(o.room, "PrefillOrder"); !s) return s;
  if (!valid_worker_id(o.decode_worker_id)) {
    return invalid("PrefillOrder.decode_worker_id is not a valid worker id");
  }
  if (o.tokens.empty() || o.tokens.size() > kMaxTokens) {
    return invalid(
        fmt::format("PrefillOrder.tokens must hold 1..{}, holds {}", kMaxTokens, o.tokens.size()));
  }
  if (std::any_of(o.tokens.begin(), o.tokens.end(), [](int32_t t) { return t < 0; })) {
    return invalid("PrefillOrder.tokens has a negative token id");
  }
  if (o.page_size < 1 || o.page_size > kMaxPageSize) {
    return invalid(
        fmt::format("PrefillOrder.page_size must be 1..{}, is {}", kMaxPageSize, o.page_size));
  }
  const auto n_tokens = static_cast<int64_t>(o.tokens.size());
  if (o.cached_tokens < 0 || o.cached_tokens >= n_tokens || o.cached_tokens % o.page_size != 0) {
    return invalid(fmt::format(
        "PrefillOrder.cached_tokens ({}) must be a multiple of page_size ({}) below the {} tokens",
        o.cached_tokens, o.page_size, n_tokens));
  }
  const int64_t want_pages =
      (n_tokens + o.page_size - 1) / o.page_size - o.cached_tokens / o.page_size;
  if (static_cast<int64_t>(o.dst_pages.size()) != want_pages) {
    return invalid(fmt::format("PrefillOrder.dst_pages has {} pages, the order needs {}",
                               o.dst_pages.size(), want_pages));
  }
  std::vector<uint32_t> sorted = o.dst_pages;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return invalid("PrefillOrder.dst_pages names a page twice");
  }
  if (auto s = check_transport(o.transport); !s) return s;
  if (auto s = check_sampling(o.sampling); !s) return s;
  if (o.deadline_ms < 1 || o.deadline_ms > kMaxDeadlineMs) {
    return invalid(fmt::format("PrefillOrder.deadline_ms must be 1..{}, is {}", kMaxDeadlineMs,
                               o.deadline_ms));
  }
  return {};
}

Status check(const Hello& m) {
  if (!valid_worker_id(m.worker_id)) return invalid("Hello.worker_id is not a valid worker id");
  if (m.incarnation == 0) return invalid("Hello.incarnation is 0");
  if (m.kv_layout.size() > kMaxKvLayoutBytes) {
    return invalid(fmt::format("Hello.kv_layout is more than {} bytes", kMaxKvLayoutBytes));
  }
  return {};
}
Status check(const Heartbeat& m) {
  if (!valid_worker_id(m.worker_id)) {
    return invalid("Heartbeat.worker_id is not a valid worker id");
  }
  return {};
}
Status check(const PrefillOrder& m) {
  return check_order(m);
}
Status check(const OrderAccepted& m) {
  return check_room(m.room, "OrderAccepted");
}
Status check(const OrderRejected& m) {
  if (auto s = check_room(m.room, "OrderRejected"); !s) return s;
  if (auto s = check_reason(m.reason, "OrderRejected"); !s) return s;
  if (m.retry_after_ms < 0 || m.retry_after_ms > kMaxRetryAfterMs) {
    return invalid(fmt::format("OrderRejected.retry_after_ms must be 0..{}", kMaxRetryAfterMs));
  }
  return {};
}
Status check(const PagesWritten& m) {
  if (auto s = check_room(m.room, "PagesWritten"); !s) return s;
  if (uint64_t{m.first_page_index} + m.n_pages > kMaxTokens) {
    return invalid("PagesWritten's page range ends past the largest order");
  }
  return {};
}
Status check(const PrefillDone& m) {
  if (auto s = check_room(m.room, "PrefillDone"); !s) return s;
  if (m.first_token < 0) return invalid("PrefillDone.first_token is negative");
  if (m.tokens_transferred > kMaxTokens) {
    return invalid("PrefillDone.tokens_transferred exceeds the largest order");
  }
  return {};
}
Status check(const PrefillFailed& m) {
  if (auto s = check_room(m.room, "PrefillFailed"); !s) return s;
  return check_reason(m.reason, "PrefillFailed");
}
Status check(const Cancel& m) {
  return check_room(m.room, "Cancel");
}

// ---------------------------------------------------------------------------------------
// Encoding.

// The room id as the wire carries it.
void write_room(MsgpackWriter& w, RoomId r) {
  w.uint(room_value(r));
}

void write_body(MsgpackWriter& w, const Hello& m) {
  w.str(m.worker_id);
  w.str(role_name(m.role));
  w.uint(m.incarnation);
  w.uint(m.peer_incarnation);
  w.str(m.kv_layout);
}
void write_body(MsgpackWriter& w, const Heartbeat& m) {
  w.str(m.worker_id);
  w.uint(m.seq);
}
void write_body(MsgpackWriter& w, const PrefillOrder& m) {
  write_room(w, m.room);
  w.str(m.decode_worker_id);
  w.array(static_cast<uint32_t>(m.tokens.size()));
  for (int32_t t : m.tokens) w.integer(t);
  w.integer(m.cached_tokens);
  w.integer(m.page_size);
  w.array(static_cast<uint32_t>(m.dst_pages.size()));
  for (uint32_t p : m.dst_pages) w.uint(p);
  w.array(kTransportFields);
  w.str(transport_kind_name(m.transport.kind));
  w.bin(m.transport.ucx_worker_address);
  w.bin(m.transport.ucx_rkey);
  w.uint(m.transport.remote_base);
  w.uint(m.transport.region_bytes);
  w.str(m.transport.storage_prefix);
  w.map(static_cast<uint32_t>(m.sampling.size()));
  for (const auto& [key, value] : m.sampling) {
    w.str(key);
    std::visit(
        [&w](auto v) {
          if constexpr (std::is_same_v<decltype(v), double>) {
            w.float64(v);
          } else if constexpr (std::is_same_v<decltype(v), int64_t>) {
            w.integer(v);
          } else {
            w.uint(v);
          }
        },
        value);
  }
  w.integer(m.deadline_ms);
}
void write_body(MsgpackWriter& w, const OrderAccepted& m) {
  write_room(w, m.room);
}
void write_body(MsgpackWriter& w, const OrderRejected& m) {
  write_room(w, m.room);
  w.str(m.reason);
  w.integer(m.retry_after_ms);
}
void write_body(MsgpackWriter& w, const PagesWritten& m) {
  write_room(w, m.room);
  w.uint(m.first_page_index);
  w.uint(m.n_pages);
}
void write_body(MsgpackWriter& w, const PrefillDone& m) {
  write_room(w, m.room);
  w.integer(m.first_token);
  w.uint(m.tokens_transferred);
  w.uint(m.bytes);
  w.uint(m.transfer_ms);
}
void write_body(MsgpackWriter& w, const PrefillFailed& m) {
  write_room(w, m.room);
  w.str(m.reason);
}
void write_body(MsgpackWriter& w, const Cancel& m) {
  write_room(w, m.room);
}

constexpr uint32_t field_count(size_t kind_index) {
  constexpr uint32_t kCounts[] = {kHelloFields,    kHeartbeatFields, kOrderFields,
                                  kAcceptedFields, kRejectedFields,  kPagesWrittenFields,
                                  kDoneFields,     kFailedFields,    kCancelFields};
  return kCounts[kind_index];
}

// ---------------------------------------------------------------------------------------
// Decoding.

// A cursor over one frame. Every read first checks that the bytes it needs are there (the
// type byte, the header that mp_check_* measures, then the payload), so msgpuck's unchecked
// mp_decode_* only ever run inside the frame. A failed read leaves the cursor anywhere: the
// decoder gives up on the first error.
class Reader {
 public:
  Reader(const char* begin, const char* end) : cur_(begin), end_(end) {}

  bool at_end() const { return cur_ == end_; }

  // An array header with at most `max_items` items, none of which can be absent: each
  // takes at least one byte, so a count above the bytes left is refused before anything
  // is sized from it.
  Result<uint32_t> array(const char* what, uint64_t max_items) {
    if (auto s = expect(MP_ARRAY, what, "an array"); !s) return std::unexpected(s.error());
    if (mp_check_array(cur_, end_) > 0) return corrupt(fmt::format("{} is truncated", what));
    const uint32_t n = mp_decode_array(&cur_);
    return bounded_count(n, what, max_items);
  }

  Result<uint32_t> map(const char* what, uint64_t max_entries) {
    if (auto s = expect(MP_MAP, what, "a map"); !s) return std::unexpected(s.error());
    if (mp_check_map(cur_, end_) > 0) return corrupt(fmt::format("{} is truncated", what));
    const uint32_t n = mp_decode_map(&cur_);
    if (auto s = bounded_count(n, what, max_entries); !s) return s;
    if (uint64_t{n} * 2 > left()) return corrupt(fmt::format("{} is truncated", what));
    return n;
  }

  Result<uint64_t> u64(const char* what) {
    if (auto s = expect(MP_UINT, what, "an unsigned integer"); !s) {
      return std::unexpected(s.error());
    }
    if (mp_check_uint(cur_, end_) > 0) return corrupt(fmt::format("{} is truncated", what));
    return mp_decode_uint(&cur_);
  }

  // An integer in [lo, hi], from either msgpack integer family.
  Result<int64_t> int_in(const char* what, int64_t lo, int64_t hi) {
    if (cur_ >= end_) return corrupt(fmt::format("{} is missing", what));
    int64_t v = 0;
    if (mp_typeof(*cur_) == MP_UINT) {
      if (mp_check_uint(cur_, end_) > 0) return corrupt(fmt::format("{} is truncated", what));
      const uint64_t u = mp_decode_uint(&cur_);
      if (u > static_cast<uint64_t>(hi)) {
        return corrupt(fmt::format("{} is {}, above {}", what, u, hi));
      }
      v = static_cast<int64_t>(u);
    } else if (mp_typeof(*cur_) == MP_INT) {
      if (mp_check_int(cur_, end_) > 0) return corrupt(fmt::format("{} is truncated", what));
      v = mp_decode_int(&cur_);
    } else {
      return corrupt(fmt::format("{} is not an integer", what));
    }
    if (v < lo || v > hi) return corrupt(fmt::format("{} is {}, out of [{}, {}]", what, v, lo, hi));
    return v;
  }

  Result<uint32_t> u32(const char* what) {
    auto v = int_in(what, 0, std::numeric_limits<uint32_t>::max());
    if (!v) return std::unexpected(v.error());
    return static_cast<uint32_t>(*v);
  }

  Result<std::string_view> str(const char* what, size_t max_bytes) {
    if (auto s = expect(MP_STR, what, "a string"); !s) return std::unexpected(s.error());
    if (mp_check_strl(cur_, end_) > 0) return corrupt(fmt::format("{} is truncated", what));
    const uint32_t len = mp_decode_strl(&cur_);
    if (len > max_bytes) {
      return corrupt(fmt::format("{} is {} bytes, more than {}", what, len, max_bytes));
    }
    if (len > left()) return corrupt(fmt::format("{} is truncated", what));
    std::string_view out(cur_, len);
    cur_ += len;
    return out;
  }

  Result<std::vector<std::byte>> bin(const char* what, size_t max_bytes) {
    if (auto s = expect(MP_BIN, what, "a byte string"); !s) return std::unexpected(s.error());
    // Every bin header is at least two bytes, and msgpuck's mp_check_binl asserts that the
    // second is there (an assert that fires where its functions are inlined with asserts
    // on, as in the -O1 sanitizer tree, on a frame cut just after the type byte).
    if (left() < 2 || mp_check_binl(cur_, end_) > 0) {
      return corrupt(fmt::format("{} is truncated", what));
    }
    const uint32_t len = mp_decode_binl(&cur_);
    if (len > max_bytes) {
      return corrupt(fmt::format("{} is {} bytes, more than {}", what, len, max_bytes));
    }
    if (len > left()) return corrupt(fmt::format("{} is truncated", what));
    const auto* p = reinterpret_cast<const std::byte*>(cur_);
    cur_ += len;
    return std::vector<std::byte>(p, p + len);
  }

  // An integer (canonical: int64 unless above INT64_MAX) or a finite float.
  Result<SamplingValue> sampling_value(const char* what) {
    if (cur_ >= end_) return corrupt(fmt::format("{} is missing", what));
    switch (mp_typeof(*cur_)) {
      case MP_UINT: {
        if (mp_check_uint(cur_, end_) > 0) return corrupt(fmt::format("{} is truncated", what));
        const uint64_t u = mp_decode_uint(&cur_);
        if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return SamplingValue(u);
        }
        return SamplingValue(static_cast<int64_t>(u));
      }
      case MP_INT:
        if (mp_check_int(cur_, end_) > 0) return corrupt(fmt::format("{} is truncated", what));
        return SamplingValue(mp_decode_int(&cur_));
      case MP_FLOAT: {
        if (mp_check_float(cur_, end_) > 0) return corrupt(fmt::format("{} is truncated", what));
        const double d = mp_decode_float(&cur_);
        if (!std::isfinite(d)) return corrupt(fmt::format("{} is not finite", what));
        return SamplingValue(d);
      }
      case MP_DOUBLE: {
        if (mp_check_double(cur_, end_) > 0) {
          return corrupt(fmt::format("{} is truncated", what));
        }
        const double d = mp_decode_double(&cur_);
        if (!std::isfinite(d)) return corrupt(fmt::format("{} is not finite", what));
        return SamplingValue(d);
      }
      default:
        return corrupt(fmt::format("{} is not a number", what));
    }
  }

 private:
  uint64_t left() const { return static_cast<uint64_t>(end_ - cur_); }

  Status expect(mp_type type, const char* what, const char* type_name) {
    if (cur_ >= end_) return corrupt(fmt::format("{} is missing", what));
    // 0xc1 is reserved in msgpack; msgpuck's type table files it under MP_EXT, which no
    // field here accepts, so it is refused like any other wrong type.
    if (mp_typeof(*cur_) != type) return corrupt(fmt::format("{} is not {}", what, type_name));
    return {};
  }

  Result<uint32_t> bounded_count(uint32_t n, const char* what, uint64_t max_items) {
    if (n > max_items) {
      return corrupt(fmt::format("{} has {} items, more than {}", what, n, max_items));
    }
    if (n > left()) return corrupt(fmt::format("{} is truncated", what));
    return n;
  }

  const char* cur_;
  const char* end_;
};

// Unwraps a Result into `var`, or returns its error from the enclosing function.
#define PD_READ(var, expr)                                         \
  auto var##_result = (expr);                                      \
  if (!var##_result) return std::unexpected(var##_result.error()); \
  auto var = std::move(*var##_result)

Result<RoomId> read_room(Reader& r, const char* what) {
  PD_READ(v, r.u64(what));
  return RoomId{v};
}

Result<std::string> read_worker_id(Reader& r, const char* what) {
  PD_READ(s, r.str(what, kMaxWorkerIdBytes));
  if (!valid_worker_id(s)) return corrupt(fmt::format("{} is not a valid worker id", what));
  return std::string(s);
}

Result<Message> read_hello(Reader& r) {
  Hello m;
  PD_READ(id, read_worker_id(r, "Hello.worker_id"));
  m.worker_id = std::move(id);
  PD_READ(role, r.str("Hello.role", 16));
  if (role == "prefill") {
    m.role = Role::kPrefill;
  } else if (role == "decode") {
    m.role = Role::kDecode;
  } else {
    return corrupt("Hello.role is neither prefill nor decode");
  }
  PD_READ(inc, r.u64("Hello.incarnation"));
  m.incarnation = inc;
  PD_READ(peer_inc, r.u64("Hello.peer_incarnation"));
  m.peer_incarnation = peer_inc;
  PD_READ(layout, r.str("Hello.kv_layout", kMaxKvLayoutBytes));
  m.kv_layout = std::string(layout);
  return m;
}

Result<Message> read_heartbeat(Reader& r) {
  Heartbeat m;
  PD_READ(id, read_worker_id(r, "Heartbeat.worker_id"));
  m.worker_id = std::move(id);
  PD_READ(seq, r.u64("Heartbeat.seq"));
  m.seq = seq;
  return m;
}

Result<TransportInfo> read_transport(Reader& r) {
  TransportInfo t;
  PD_READ(n, r.array("PrefillOrder.transport", kTransportFields));
  if (n != kTransportFields) {
    return corrupt(
        fmt::format("PrefillOrder.transport has {} fields, not {}", n, kTransportFields));
  }
  PD_READ(kind, r.str("transport.kind", 16));
  if (kind == "ucx") {
    t.kind = TransportKind::kUcx;
  } else if (kind == "storage") {
    t.kind = TransportKind::kStorage;
  } else {
    return corrupt("transport.kind is neither ucx nor storage");
  }
  PD_READ(address, r.bin("transport.ucx_worker_address", kMaxUcxBlobBytes));
  t.ucx_worker_address = std::move(address);
  PD_READ(rkey, r.bin("transport.ucx_rkey", kMaxUcxBlobBytes));
  t.ucx_rkey = std::move(rkey);
  PD_READ(base, r.u64("transport.remote_base"));
  t.remote_base = base;
  PD_READ(region, r.u64("transport.region_bytes"));
  t.region_bytes = region;
  PD_READ(prefix, r.str("transport.storage_prefix", kMaxStoragePrefixBytes));
  t.storage_prefix = std::string(prefix);
  return t;
}

Result<Message> read_order(Reader& r) {
  PrefillOrder m;
  PD_READ(room, read_room(r, "PrefillOrder.room"));
  m.room = room;
  PD_READ(id, read_worker_id(r, "PrefillOrder.decode_worker_id"));
  m.decode_worker_id = std::move(id);
  PD_READ(n_tokens, r.array("PrefillOrder.tokens", kMaxTokens));
  m.tokens.resize(n_tokens);
  for (int32_t& t : m.tokens) {
    PD_READ(v, r.int_in("a PrefillOrder token", 0, std::numeric_limits<int32_t>::max()));
    t = static_cast<int32_t>(v);
  }
  PD_READ(cached, r.int_in("PrefillOrder.cached_tokens", 0, kMaxTokens));
  m.cached_tokens = static_cast<int32_t>(cached);
  PD_READ(page_size, r.int_in("PrefillOrder.page_size", 1, kMaxPageSize));
  m.page_size = static_cast<int32_t>(page_size);
  PD_READ(n_pages, r.array("PrefillOrder.dst_pages", kMaxTokens));
  m.dst_pages.resize(n_pages);
  for (uint32_t& p : m.dst_pages) {
    PD_READ(v, r.u32("a PrefillOrder dst page"));
    p = v;
  }
  PD_READ(transport, read_transport(r));
  m.transport = std::move(transport);
  PD_READ(n_sampling, r.map("PrefillOrder.sampling", kMaxSamplingEntries));
  for (uint32_t i = 0; i < n_sampling; ++i) {
    PD_READ(key, r.str("a sampling key", kMaxSamplingKeyBytes));
    PD_READ(value, r.sampling_value("a sampling value"));
    if (!m.sampling.emplace(std::string(key), value).second) {
      return corrupt(fmt::format("sampling.{} appears twice", key));
    }
  }
  PD_READ(deadline, r.int_in("PrefillOrder.deadline_ms", 1, kMaxDeadlineMs));
  m.deadline_ms = deadline;
  return m;
}

Result<Message> read_accepted(Reader& r) {
  PD_READ(room, read_room(r, "OrderAccepted.room"));
  return OrderAccepted{room};
}

Result<Message> read_rejected(Reader& r) {
  OrderRejected m;
  PD_READ(room, read_room(r, "OrderRejected.room"));
  m.room = room;
  PD_READ(reason, r.str("OrderRejected.reason", kMaxReasonBytes));
  m.reason = std::string(reason);
  PD_READ(retry, r.int_in("OrderRejected.retry_after_ms", 0, kMaxRetryAfterMs));
  m.retry_after_ms = retry;
  return m;
}

Result<Message> read_pages_written(Reader& r) {
  PagesWritten m;
  PD_READ(room, read_room(r, "PagesWritten.room"));
  m.room = room;
  PD_READ(first, r.u32("PagesWritten.first_page_index"));
  m.first_page_index = first;
  PD_READ(n, r.u32("PagesWritten.n_pages"));
  m.n_pages = n;
  return m;
}

Result<Message> read_done(Reader& r) {
  PrefillDone m;
  PD_READ(room, read_room(r, "PrefillDone.room"));
  m.room = room;
  PD_READ(token, r.int_in("PrefillDone.first_token", 0, std::numeric_limits<int32_t>::max()));
  m.first_token = static_cast<int32_t>(token);
  PD_READ(tokens, r.u32("PrefillDone.tokens_transferred"));
  m.tokens_transferred = tokens;
  PD_READ(bytes, r.u64("PrefillDone.bytes"));
  m.bytes = bytes;
  PD_READ(ms, r.u32("PrefillDone.transfer_ms"));
  m.transfer_ms = ms;
  return m;
}

Result<Message> read_failed(Reader& r) {
  PrefillFailed m;
  PD_READ(room, read_room(r, "PrefillFailed.room"));
  m.room = room;
  PD_READ(reason, r.str("PrefillFailed.reason", kMaxReasonBytes));
  m.reason = std::string(reason);
  return m;
}

Result<Message> read_cancel(Reader& r) {
  PD_READ(room, read_room(r, "Cancel.room"));
  return Cancel{room};
}

#undef PD_READ

}  // namespace

std::string_view role_name(Role role) {
  return role == Role::kPrefill ? "prefill" : "decode";
}

std::string_view transport_kind_name(TransportKind kind) {
  return kind == TransportKind::kUcx ? "ucx" : "storage";
}

std::optional<double> sampling_double(const SamplingMap& sampling, std::string_view key) {
  const auto it = sampling.find(key);
  if (it == sampling.end()) return std::nullopt;
  return std::visit([](auto v) { return static_cast<double>(v); }, it->second);
}

std::optional<int64_t> sampling_i64(const SamplingMap& sampling, std::string_view key) {
  const auto it = sampling.find(key);
  if (it == sampling.end()) return std::nullopt;
  if (const auto* i = std::get_if<int64_t>(&it->second)) return *i;
  if (const auto* u = std::get_if<uint64_t>(&it->second);
      u != nullptr && *u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return static_cast<int64_t>(*u);
  }
  return std::nullopt;
}

std::optional<uint64_t> sampling_u64(const SamplingMap& sampling, std::string_view key) {
  const auto it = sampling.find(key);
  if (it == sampling.end()) return std::nullopt;
  if (const auto* u = std::get_if<uint64_t>(&it->second)) return *u;
  if (const auto* i = std::get_if<int64_t>(&it->second); i != nullptr && *i >= 0) {
    return static_cast<uint64_t>(*i);
  }
  return std::nullopt;
}

std::string_view message_kind(const Message& message) {
  return kKindNames[message.index()];
}

std::optional<RoomId> message_room(const Message& message) {
  return std::visit(
      [](const auto& m) -> std::optional<RoomId> {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, Hello> || std::is_same_v<T, Heartbeat>) {
          return std::nullopt;
        } else {
          return m.room;
        }
      },
      message);
}

bool valid_worker_id(std::string_view id) {
  if (id.empty() || id.size() > kMaxWorkerIdBytes) return false;
  return std::all_of(id.begin(), id.end(), [](char c) { return c > 0x20 && c < 0x7f; });
}

Status validate_message(const Message& message) {
  return std::visit([](const auto& m) { return check(m); }, message);
}

Status validate_prefill_order(const PrefillOrder& order) {
  return check_order(order);
}

Result<std::string> encode_message_with_version(const Message& message, uint32_t version) {
  // Reasons are cut here rather than refused: they come from error messages of any length.
  const Message* to_write = &message;
  Message cut;
  if (const auto* f = std::get_if<PrefillFailed>(&message);
      f != nullptr && f->reason.size() > kMaxReasonBytes) {
    cut = PrefillFailed{f->room, cut_utf8(f->reason, kMaxReasonBytes)};
    to_write = &cut;
  } else if (const auto* j = std::get_if<OrderRejected>(&message);
             j != nullptr && j->reason.size() > kMaxReasonBytes) {
    cut = OrderRejected{j->room, cut_utf8(j->reason, kMaxReasonBytes), j->retry_after_ms};
    to_write = &cut;
  }
  if (auto s = validate_message(*to_write); !s) return std::unexpected(s.error());
  MsgpackWriter w;
  w.array(field_count(to_write->index()));
  w.uint(version);
  w.str(kKindNames[to_write->index()]);
  std::visit([&w](const auto& m) { write_body(w, m); }, *to_write);
  return std::move(w).take();
}

Result<std::string> encode_message(const Message& message) {
  return encode_message_with_version(message, kProtocolVersion);
}

Result<Message> decode_message(std::span<const std::byte> bytes) {
  if (bytes.empty()) return corrupt("empty frame");
  if (bytes.size() > kMaxMessageBytes) {
    return corrupt(fmt::format("frame of {} bytes, more than {}", bytes.size(), kMaxMessageBytes));
  }
  const char* begin = reinterpret_cast<const char*>(bytes.data());
  Reader r(begin, begin + bytes.size());
  auto n_fields = r.array("the message", 64);
  if (!n_fields) return std::unexpected(n_fields.error());
  if (*n_fields < kHeaderFields) return corrupt("the message has no header");
  auto version = r.u64("the protocol version");
  if (!version) return std::unexpected(version.error());
  if (*version != kProtocolVersion) {
    return make_error(ErrorCode::kUnsupported,
                      fmt::format("PD message: protocol version {}, this worker speaks {}",
                                  *version, kProtocolVersion));
  }
  auto kind = r.str("the message kind", 32);
  if (!kind) return std::unexpected(kind.error());
  const auto* found = std::find(std::begin(kKindNames), std::end(kKindNames), *kind);
  if (found == std::end(kKindNames)) {
    return corrupt(fmt::format("unknown message kind '{}'", cut_utf8(*kind, 32)));
  }
  const auto index = static_cast<size_t>(found - std::begin(kKindNames));
  if (*n_fields != field_count(index)) {
    return corrupt(fmt::format("{} has {} fields, not {}", *kind, *n_fields - kHeaderFields,
                               field_count(index) - kHeaderFields));
  }
  Result<Message> message = corrupt("unreachable");
  switch (index) {
    case 0:
      message = read_hello(r);
      break;
    case 1:
      message = read_heartbeat(r);
      break;
    case 2:
      message = read_order(r);
      break;
    case 3:
      message = read_accepted(r);
      break;
    case 4:
      message = read_rejected(r);
      break;
    case 5:
      message = read_pages_written(r);
      break;
    case 6:
      message = read_done(r);
      break;
    case 7:
      message = read_failed(r);
      break;
    case 8:
      message = read_cancel(r);
      break;
  }
  if (!message) return message;
  if (!r.at_end()) return corrupt(fmt::format("bytes follow the {}", *kind));
  // The relations between fields (page counts, transport kinds, ...), as on encode.
  if (auto s = validate_message(*message); !s) {
    return make_error(ErrorCode::kCorrupt, std::move(s.error().message));
  }
  return message;
}

Result<Message> decode_message(std::string_view bytes) {
  return decode_message(
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()));
}

}  // namespace strata::pd
