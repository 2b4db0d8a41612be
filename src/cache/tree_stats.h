// What the radix tree tells the world about itself, as plain values: its counters
// (TreeStats), one node as inspection sees it (NodeSnapshot), and the answers of the
// commands that cache control passes through unchanged (pin, unpin, evict_blocks, flush).
//
// Each figure is defined here once. The tree keeps its counters in a TreeStats member and
// stats() returns a copy; the engine's CacheState (engine/cache_control.h) embeds that copy
// and its node list holds these snapshots; the server writes GET /cache/state and /metrics
// from one description of the figures (server/cache_figures.h). A public header of the
// cache, so that the server sees these values and nothing else of the tree.
//
// Thread: values; the tree fills them on its own (the scheduler) thread.
#pragma once

#include <cstdint>
#include <vector>

#include "cache/block_hash.h"

namespace strata {

using NodeId = uint64_t;

// The tree's counters. Gauges say what holds now; `_total` fields count since start.
struct TreeStats {
  int32_t page_size = 0;
  bool hierarchical = false;
  int64_t num_nodes = 0;        // excluding the root
  int64_t cached_pages = 0;     // pages held by the tree on the device
  int64_t protected_pages = 0;  // pages in locked or pinned nodes
  // Device pages eviction cannot free now: the protected ones and, with a host tier, the
  // pinned or session-held pages without a host copy beyond what the host can take
  // (free host pages plus evictable host-only ones). What admission may not count on.
  int64_t unevictable_pages = 0;
  int64_t evictable_pages = 0;     // pages in leaves that can be evicted now
  int64_t pinned_blocks = 0;       // distinct blocks with a pin
  int64_t soft_pinned_blocks = 0;  // of which with a TTL
  int64_t locked_nodes = 0;        // nodes with lock_ref > 0
  int64_t outstanding_locks = 0;   // receipts not yet released
  uint64_t match_calls = 0;
  uint64_t matched_pages_total = 0;
  uint64_t evicted_pages_total = 0;
  uint64_t inserted_pages_total = 0;
  // Of the inserted pages, those whose block the tree had evicted for want of room (within
  // its last evictions, as many as its pools hold): KV computed twice because the pool was
  // too small for the working set. Operator evictions (evict, flush, reset) do not count.
  uint64_t recomputed_pages_total = 0;
  uint64_t expired_pins_total = 0;
  // Hierarchical cache.
  int64_t host_capacity_pages = 0;
  int64_t host_cached_pages = 0;  // pages held on the host (valid or being written)
  int64_t host_only_pages = 0;    // of which not on the device
  int64_t host_evictable_pages = 0;
  int64_t host_protected_pages = 0;    // host pages of pinned or session-protected nodes
  int64_t stored_pages = 0;            // pages known written to storage
  int64_t io_pending_nodes = 0;        // nodes with a transfer in flight
  uint64_t demoted_pages_total = 0;    // device->host demotions (device copy dropped)
  uint64_t backed_up_pages_total = 0;  // device->host copies finished
  uint64_t loaded_pages_total = 0;     // host->device copies finished
  uint64_t host_evicted_pages_total = 0;
  uint64_t backups_skipped_total = 0;  // backups not started: no host room
};

// One node of the tree (GET /cache/state?detail=tree, GET /cache/node).
struct NodeSnapshot {
  NodeId id = 0;
  NodeId parent_id = 0;  // 0 for children of the root (the root has id 0)
  int32_t num_tokens = 0;
  std::vector<BlockHash> block_hashes;
  std::vector<uint32_t> pin_counts;
  int32_t lock_ref = 0;
  int32_t pin_ref = 0;
  int32_t soft_pinned_blocks = 0;        // pages of the node with at least one soft (TTL) pin
  std::vector<int64_t> soft_pin_ttl_ms;  // per page: its soft pins' longest TTL (0: none)
  int64_t last_access_ms = 0;
  uint64_t hit_count = 0;
  bool on_device = false;
  bool on_host = false;
  bool in_storage = false;
  bool loading = false;
  int32_t host_ref = 0;  // tool-session protections of its host copy: > 0 is session-protected
  bool evictable = false;
};

struct PinResult {
  int32_t pinned = 0;   // blocks pinned
  int32_t unknown = 0;  // hashes not in the tree (skipped)
  // Hashes at the end left unpinned to fit a pin budget (the pin policy's longest_prefix).
  int32_t cut = 0;
};

struct UnpinResult {
  int32_t unpinned = 0;    // blocks whose pin count went down
  int32_t unknown = 0;     // hashes not in the tree
  int32_t not_pinned = 0;  // hashes in the tree without a pin (nothing done)
};

struct EvictBlocksResult {
  int32_t evicted_blocks = 0;
  int32_t skipped_locked = 0;        // blocks kept because a request holds them
  int32_t skipped_pinned = 0;        // blocks kept because they (or descendants) are pinned
  int32_t skipped_has_children = 0;  // without descendants: blocks that still have some
  int32_t unknown = 0;               // hashes not in the tree
};

struct FlushResult {
  int32_t evicted_pages = 0;       // device pages freed (or freeing once backed up)
  int32_t evicted_host_pages = 0;  // host pages freed
  int32_t pinned_preserved = 0;    // pinned blocks kept
  int32_t locked_skipped = 0;      // pages kept because requests hold them
};

}  // namespace strata
