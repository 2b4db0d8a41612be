// The control-plane messages of prefill/decode disaggregation (docs/pd-disaggregation.md)
// and their msgpack wire form.
//
// Wire form. One message is one ZeroMQ frame holding one msgpack array:
//
//   [protocol_version (uint), kind (str), field, field, ...]
//
// with the kind's fields in the order its struct below lists them. Integers take msgpack's
// shortest forms, byte strings (UCX address, remote key) are bin, text is str, a nested
// record (a PrefillOrder's transport) is an array, the sampling parameters a map.
//
// Decoding is strict: the version must be kProtocolVersion, the kind one of those below,
// the array exactly as long as the kind's fields, every field of its msgpack type and in
// its range (the limits below, and the relations that validate() checks), and no byte may
// follow the array. Anything else answers an error naming the field (kUnsupported for
// another protocol version, kCorrupt otherwise), never a crash or an allocation larger
// than the bytes received: the decoder reads through a bounds-checked cursor and sizes each
// list from a length checked against its limit and against the bytes left.
//
// Trust. The checks stop garbage and mistakes, not a hostile worker: the control plane runs
// between workers of one deployment (docs/pd-disaggregation.md, "Trust").
//
// Thread: every function here is pure and may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/result.h"

namespace strata::pd {

// Bumped on any change of the wire form; peers of another version are refused.
inline constexpr uint32_t kProtocolVersion = 1;

// Limits, checked on encode and on decode.
inline constexpr size_t kMaxWorkerIdBytes = 128;             // printable ASCII, no space
inline constexpr size_t kMaxKvLayoutBytes = 1024;            // Hello's layout description
inline constexpr size_t kMaxTokens = size_t{1} << 20;        // PrefillOrder's tokens
inline constexpr int32_t kMaxPageSize = 4096;                // tokens per page
inline constexpr size_t kMaxUcxBlobBytes = size_t{2} << 20;  // a framed UCX address or key
inline constexpr size_t kMaxStoragePrefixBytes = 512;
inline constexpr size_t kMaxSamplingEntries = 32;
inline constexpr size_t kMaxSamplingKeyBytes = 64;
inline constexpr size_t kMaxReasonBytes = 1024;  // longer reasons are cut on encode
inline constexpr int64_t kMaxDeadlineMs = 3'600'000;
inline constexpr int64_t kMaxRetryAfterMs = 600'000;
// No valid message is larger (1M tokens and 1M pages at 5 bytes each, two UCX blobs, the
// rest small); the channel refuses bigger frames before reading them.
inline constexpr size_t kMaxMessageBytes = size_t{16} << 20;

// A room names one disaggregated prefill: the decode worker picks it at random (64 bits
// from the system's entropy source), so another worker cannot guess a live one. 0 is never
// a room.
enum class RoomId : uint64_t {};
inline uint64_t room_value(RoomId room) {
  return static_cast<uint64_t>(room);
}

enum class Role : uint8_t {
  kPrefill,  // binds the ROUTER socket, computes prefills ordered by decode workers
  kDecode,   // connects to prefill workers, orders prefills, decodes
};
std::string_view role_name(Role role);  // "prefill", "decode"

// Both ways, first on a connection and again whenever the sender learns that its peer lost
// track of it (docs: "Handshake").
struct Hello {
  std::string worker_id;  // 1..kMaxWorkerIdBytes printable ASCII; the ZeroMQ identity
  Role role = Role::kDecode;
  // Random and != 0, fixed for the life of the sender's channel: a new value from a known
  // worker id means the worker restarted, and every room it held is lost.
  uint64_t incarnation = 0;
  // The receiver's incarnation as the sender knows it (0: none). A Hello is answered with a
  // Hello exactly when this is not the receiver's own incarnation, i.e. when the sender has
  // not yet heard the receiver's current incarnation; that makes every handshake (fresh,
  // after either side restarted, after a reconnect) end after at most three Hellos.
  uint64_t peer_incarnation = 0;
  // What makes pages of the two workers interchangeable (model, dtype, page shape), as the
  // engine describes it; peers whose descriptions differ are refused. At most
  // kMaxKvLayoutBytes.
  std::string kv_layout;
  // The protocol version is not a field here: every message carries it in its header.

  bool operator==(const Hello&) const = default;
};

// Both ways, every heartbeat period, from the channel's own thread.
struct Heartbeat {
  std::string worker_id;
  uint64_t seq = 0;  // counts up from 0 per channel; informational

  bool operator==(const Heartbeat&) const = default;
};

enum class TransportKind : uint8_t { kUcx, kStorage };
std::string_view transport_kind_name(TransportKind kind);  // "ucx", "storage"

// Where the prefill worker writes the pages (the data plane, src/kvtransfer).
struct TransportInfo {
  TransportKind kind = TransportKind::kUcx;
  // kUcx: the decode worker's framed UCX worker address and framed region descriptor
  // (kvtransfer/ucx_transport.h address() and region_descriptor()), each 1..kMaxUcxBlobBytes,
  // and the registered region's base and size (region_bytes >= 1). Empty / 0 for kStorage.
  std::vector<std::byte> ucx_worker_address;
  std::vector<std::byte> ucx_rkey;
  uint64_t remote_base = 0;
  uint64_t region_bytes = 0;
  // kStorage: the key prefix under which the prefill worker stores the pages in the shared
  // storage tier, 1..kMaxStoragePrefixBytes. Empty for kUcx.
  std::string storage_prefix;

  bool operator==(const TransportInfo&) const = default;
};

// A sampling parameter: an integer or a finite float. Decoding gives the canonical form:
// an integer is int64_t unless it exceeds INT64_MAX (then uint64_t), so a seed of any
// uint64 value survives; read values with sampling_double() / sampling_u64() / ...
using SamplingValue = std::variant<int64_t, uint64_t, double>;
// Temperature, top_p, top_k, seed, ...: names the engine chooses, 1..kMaxSamplingKeyBytes
// each, at most kMaxSamplingEntries.
using SamplingMap = std::map<std::string, SamplingValue, std::less<>>;

std::optional<double> sampling_double(const SamplingMap& sampling, std::string_view key);
// The value as int64 if it is an integer in range; nullopt otherwise (floats included).
std::optional<int64_t> sampling_i64(const SamplingMap& sampling, std::string_view key);
std::optional<uint64_t> sampling_u64(const SamplingMap& sampling, std::string_view key);

// Decode -> prefill: compute the KV of `tokens` from position cached_tokens on and write
// each page into the decode worker's pool.
//
// Pages. Page i of the prompt holds tokens [i * page_size, (i + 1) * page_size); the last
// one may be partial. The decode worker already holds pages 0 .. cached_tokens/page_size - 1,
// and dst_pages[j] is the decode pool's page that receives prompt page
// cached_tokens/page_size + j, so dst_pages has exactly
// ceil(|tokens| / page_size) - cached_tokens / page_size entries, all distinct.
struct PrefillOrder {
  RoomId room{};                    // != 0
  std::string decode_worker_id;     // the sender; must be the peer the order came from
  std::vector<int32_t> tokens;      // 1..kMaxTokens ids, each >= 0
  int32_t cached_tokens = 0;        // multiple of page_size, < |tokens| (one is computed)
  int32_t page_size = 0;            // 1..kMaxPageSize
  std::vector<uint32_t> dst_pages;  // see "Pages"
  TransportInfo transport;
  SamplingMap sampling;     // for the first token
  int64_t deadline_ms = 0;  // 1..kMaxDeadlineMs: budget from receipt to PrefillDone

  bool operator==(const PrefillOrder&) const = default;
};

// Prefill -> decode: the order is taken; progress messages follow.
struct OrderAccepted {
  RoomId room{};

  bool operator==(const OrderAccepted&) const = default;
};

// Prefill -> decode: the order is not taken (overloaded, or refused); nothing was written.
struct OrderRejected {
  RoomId room{};
  std::string reason;          // at most kMaxReasonBytes (cut on encode)
  int64_t retry_after_ms = 0;  // 0..kMaxRetryAfterMs: when this worker may take orders again

  bool operator==(const OrderRejected&) const = default;
};

// Prefill -> decode: pages dst_pages[first_page_index .. first_page_index + n_pages) have
// landed (UCX: the puts were flushed; storage: the pages are stored). n_pages == 0 is a
// keep-alive: still working, nothing new (it resets the decode side's stall deadline).
struct PagesWritten {
  RoomId room{};
  uint32_t first_page_index = 0;
  uint32_t n_pages = 0;

  bool operator==(const PagesWritten&) const = default;
};

// Prefill -> decode: every page has landed and `first_token` was sampled. The prefill
// worker no longer touches the room's pages.
struct PrefillDone {
  RoomId room{};
  int32_t first_token = 0;          // >= 0
  uint32_t tokens_transferred = 0;  // |tokens| - cached_tokens
  uint64_t bytes = 0;               // KV bytes written
  uint32_t transfer_ms = 0;         // order receipt to last page landed

  bool operator==(const PrefillDone&) const = default;
};

// Prefill -> decode: the prefill stopped (error, lease deadline, Cancel). Sent only after
// every write for the room completed or was aborted: the decode worker may then reuse the
// room's pages at once.
struct PrefillFailed {
  RoomId room{};
  std::string reason;  // at most kMaxReasonBytes (cut on encode)

  bool operator==(const PrefillFailed&) const = default;
};

// Decode -> prefill: stop and release the room; answered with PrefillFailed (or, when the
// prefill had already finished, with nothing more: its PrefillDone is on the way).
struct Cancel {
  RoomId room{};

  bool operator==(const Cancel&) const = default;
};

using Message = std::variant<Hello, Heartbeat, PrefillOrder, OrderAccepted, OrderRejected,
                             PagesWritten, PrefillDone, PrefillFailed, Cancel>;

// The wire name of the message's kind ("Hello", "PrefillOrder", ...).
std::string_view message_kind(const Message& message);
// The room a message is about; nullopt for Hello and Heartbeat.
std::optional<RoomId> message_room(const Message& message);

// kInvalidArgument naming the first field out of its limits or relations (see the structs).
Status validate_message(const Message& message);
// The same for an order, without copying it into a Message.
Status validate_prefill_order(const PrefillOrder& order);
// Whether `id` is a valid worker id (1..kMaxWorkerIdBytes of printable ASCII, no space).
bool valid_worker_id(std::string_view id);

// The wire bytes of a valid message (reason strings are cut to kMaxReasonBytes first);
// kInvalidArgument as validate_message otherwise.
Result<std::string> encode_message(const Message& message);
// The same with another version in the header: only for testing that peers refuse it.
Result<std::string> encode_message_with_version(const Message& message, uint32_t version);

// The message in `bytes` (one whole frame), strictly checked (see the top of this file).
Result<Message> decode_message(std::span<const std::byte> bytes);
Result<Message> decode_message(std::string_view bytes);

}  // namespace strata::pd
