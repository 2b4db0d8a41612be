// KV cache events as values. The tree emits them in order on every change; the server
// encodes them in vLLM's wire format and publishes them (see docs/kv-events.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "cache/block_hash.h"

namespace strata {

// Where a block lives. Names on the wire: "GPU" (the device pool, whatever the device),
// "CPU_PINNED" (host pool), "DISK" (storage).
enum class Medium : uint8_t { kDevice, kHost, kStorage };

std::string_view medium_wire_name(Medium m);

struct BlockStored {
  std::vector<BlockHash> block_hashes;         // consecutive blocks, parent first
  std::optional<BlockHash> parent_block_hash;  // absent for a sequence's first block
  std::vector<TokenId> token_ids;              // block_size tokens per block
  int32_t block_size = 0;
  std::optional<int32_t> lora_id;
  Medium medium = Medium::kDevice;
  // The cache salt of a sequence's first block, when this event starts with one (no
  // parent) and it was salted: on the wire, vLLM's extra_keys [[salt], nil, ...].
  std::string first_block_salt;
};

struct BlockRemoved {
  std::vector<BlockHash> block_hashes;
  Medium medium = Medium::kDevice;
};

struct AllBlocksCleared {};

using KvEvent = std::variant<BlockStored, BlockRemoved, AllBlocksCleared>;

// Receives the tree's events, in order, on the thread that changes the tree. on_event runs
// in the middle of a change (an eviction emits before its index entries are erased): it
// must not call back into the tree.
class KvEventSink {
 public:
  virtual ~KvEventSink() = default;
  virtual void on_event(KvEvent event) = 0;
};

// Collects events in memory (tests, and the engine's per-step batching).
class VectorEventSink final : public KvEventSink {
 public:
  void on_event(KvEvent event) override { events.push_back(std::move(event)); }
  std::vector<KvEvent> events;
};

}  // namespace strata
