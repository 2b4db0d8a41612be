// A node of the radix tree (radix_tree.h): plain metadata about a run of consecutive full
// pages with no branching inside. It holds page ids, never KV bytes.
//
// Ownership: a node owns its children (unique_ptr); `parent` is a non-owning pointer,
// null only for the root. Only the RadixTree that holds a node changes it: every field
// below is written by the tree, and the counters (refs, pin mirrors, set flags) are
// derived state that RadixTree::check_invariants() recomputes from scratch.
//
// Tier states of one node (hierarchical cache; see radix_tree.h):
//   device only      device_pages set, host_pages empty or kInvalidPage
//   backing up       device and host pages set, host_valid false, io_ref > 0
//   device and host  device and host pages set, host_valid true
//   host only        device_pages all kInvalidPage, host_valid true
//   loading          device pages set, loading true (invisible to match_prefix), io_ref > 0
// A node in no tier leaves the tree.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/block_hash.h"
#include "cache/tree_stats.h"
#include "memory/page_id.h"

namespace strata {

struct RadixNode {
  NodeId id = 0;
  RadixNode* parent = nullptr;                       // null only for the root
  uint32_t index_in_parent = 0;                      // position in parent->children
  std::vector<std::unique_ptr<RadixNode>> children;  // owned
  std::vector<TokenId> tokens;                       // num_pages() * page_size tokens
  std::vector<BlockHash> hashes;                     // one per page
  // Empty, or per page when the hash chains digests (BlockHasher::chains_digests(),
  // sha256_cbor): the rest of each block's ChainValue, which its successor is hashed from.
  std::vector<ChainTail> chain_tails;
  std::vector<uint32_t> pin_counts;  // per page: pins (hard + soft), mirroring the PinTable
  std::vector<PageId> device_pages;  // per page; kInvalidPage if not on device
  std::vector<PageId> host_pages;    // empty, or per page (hierarchical cache)
  std::vector<uint8_t> in_storage;   // empty, or per page: 1 when in storage
  bool loading = false;              // device_pages assigned, host->device copy in flight
  bool host_valid = false;           // host_pages hold the KV (false while the backup copy runs)
  bool demote_pending = false;       // leave the device once backed up and a device leaf
  int32_t io_ref = 0;                // transfers in flight that read or write this node's pages
  int32_t host_ref = 0;            // tool-session protections of this node's host copy (and below)
  std::string first_page_salt;     // children of the root: the first page's cache salt ("": none)
  int32_t lock_ref = 0;            // lock receipts whose path includes this node
  int32_t pin_ref = 0;             // pinned blocks in this node and all its descendants
  int32_t own_pinned_blocks = 0;   // pages of this node with pin_counts > 0
  int32_t soft_pinned_blocks = 0;  // pages of this node with at least one soft (TTL) pin
  // Eviction order keys (eviction_policy.h): never changed while the node is in a set.
  uint64_t last_access_tick = 0;       // logical time of the last match/insert (LRU order)
  int64_t last_access_ms = 0;          // clock time of the same, for inspection
  uint64_t hit_count = 0;              // matches that reached into this node
  bool in_evictable_set = false;       // in the policy's device set
  bool in_host_evictable_set = false;  // in the policy's host-only set

  int32_t num_pages() const { return static_cast<int32_t>(hashes.size()); }
  bool is_leaf() const { return children.empty(); }
  bool is_protected() const { return lock_ref > 0 || pin_ref > 0 || host_ref > 0; }
  // Device pages assigned (possibly still loading).
  bool has_device_pages() const { return !device_pages.empty() && device_pages[0] != kInvalidPage; }
  // Device pages readable.
  bool on_device() const { return has_device_pages() && !loading; }
  bool has_host_pages() const { return !host_pages.empty() && host_pages[0] != kInvalidPage; }
  bool on_host() const { return has_host_pages() && host_valid; }
  bool stored() const { return !in_storage.empty() && in_storage[0] != 0; }
};

}  // namespace strata
