// The decoder of one KV event payload, as vLLM, SGLang and Strata publish it
// (docs/kv-events.md): msgpack `[timestamp, [event...], rank]`, each event msgspec's
// tagged struct. Pure functions, no state: any thread.
//
// What is accepted (the router talks to engines of several versions):
// - The batch as an array `[ts, events]` or `[ts, events, rank]` (msgspec omits a nil rank
//   under omit_defaults), or as a map {"ts", "events", "data_parallel_rank"|"attn_dp_rank"}.
//   A rank that is not an integer reads as 0.
// - Each event as an array `[tag, field...]` in declaration order (array_like, what Strata
//   sends), or as a map with a "type" tag (the newer msgspec layout of vLLM and SGLang).
//   Fields after the known ones (vLLM's lora_name, extra_keys, group_idx, ...; SGLang's
//   cache_salt, session_id) are skipped; vLLM's `group_idx` (array position 9, or the
//   "group_idx" key) is kept, so that the index can ignore non-main attention groups.
// - `medium` nil or absent (vLLM before it had tiers: BlockStored with 6 elements,
//   BlockRemoved with 2) reads as the device tier.
// - Block hashes as integers (int64, or uint64 that wraps to the signed wire form) or as
//   raw bytes (vLLM without VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES sends its digest): bytes
//   fold to their last 8 bytes read big-endian, exactly vLLM's own integer conversion, so
//   both forms of one vLLM hash give the same 64-bit key.
// - Token ids as integers, or as [t, t_next] pairs (SGLang's bigram pages under EAGLE):
//   the first element of each pair is the token.
//
// Decisions:
// - An unknown `medium` (e.g. a remote store's name) or an unknown event tag is skipped and
//   counted in KvEventBatch::skipped_events (with the last reason), not an error: failing
//   the batch would make the subscriber treat the worker's whole index as stale for one
//   event it could not use anyway.
// - Everything else malformed is a kCorrupt error naming the field. The decoder first walks
//   the whole payload with a bounds-checked skipper; it never reads outside `payload`, and
//   bytes after the one object are an error.
// - KvWireOptions::strict (Strata's own format only; the benchmark uses it to check what
//   Strata publishes) makes the leniencies above errors: a BlockStored without medium, an
//   unknown tag or medium.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "common/result.h"

namespace strata::router {

// Where a worker holds a block. Wire names (`medium`): "GPU" = device; "CPU_PINNED" (and
// "CPU", vLLM's offloading connector) = host; "DISK" = storage.
enum class Tier : uint8_t { kDevice, kHost, kStorage };
inline constexpr int kNumTiers = 3;

// nullopt for a medium the router does not know.
std::optional<Tier> tier_from_medium(std::string_view medium);
// "GPU", "CPU_PINNED", "DISK": the names Strata sends.
std::string_view tier_wire_name(Tier tier);
// "device", "host", "storage": the names of Strata's JSON APIs.
std::string_view tier_name(Tier tier);

struct BlockStoredEvent {
  std::vector<uint64_t> block_hashes;         // the worker's hashes, consecutive, parent first
  std::optional<uint64_t> parent_block_hash;  // the worker's hash of the block before; nullopt
                                              // for a sequence's first block
  std::vector<int32_t> token_ids;             // block_size per block; may be empty (vLLM's
                                              // offload placeholders send none)
  int32_t block_size = 0;                     // tokens per block as sent (0 if absent)
  Tier tier = Tier::kDevice;
  int64_t group_idx = 0;  // vLLM's KV cache group (hybrid models); 0 when absent
};

struct BlockRemovedEvent {
  std::vector<uint64_t> block_hashes;  // the worker's hashes
  Tier tier = Tier::kDevice;
  int64_t group_idx = 0;
};

struct AllBlocksClearedEvent {};

using KvWireEvent = std::variant<BlockStoredEvent, BlockRemovedEvent, AllBlocksClearedEvent>;

struct KvEventBatch {
  double timestamp_s = 0;  // the worker's wall clock, seconds since the epoch
  std::vector<KvWireEvent> events;
  int64_t data_parallel_rank = 0;
  uint32_t skipped_events = 0;  // unknown tags or media (see the top comment)
  std::string skip_reason;      // why the last one was skipped; empty if none
};

struct KvWireOptions {
  bool strict = false;  // only Strata's array layout with every field; skips become errors
};

// Decodes one payload; kCorrupt names what is wrong.
Result<KvEventBatch> decode_kv_event_batch(std::string_view payload, KvWireOptions options = {});

}  // namespace strata::router
