// The paged radix prefix tree: the heart of Strata's KV cache.
//
// The tree maps token sequences, at page granularity, to the pages that hold their KV.
// It stores page ids, never KV bytes. Every full page ("block") has a chained 64-bit
// block hash (block_hash.h); a hash index maps each cached block to its node and offset
// and is exact at all times (insert, split, eviction, reset).
//
// Protection. A node is protected while a request lock or an external pin covers it:
//  - a lock receipt (lock()) holds the path root..node; release() undoes exactly that,
//    even after the node was split (a split keeps the deeper half as the original node);
//  - a pin is counted per block; a pinned block protects itself and all its ancestors.
//    The tree keeps "a childless node with pinned blocks ends with a pinned block" by
//    splitting, so that unpinned pages after the last pinned block stay evictable.
// Eviction removes least-recently-used unprotected leaves. The evictable set is kept
// incrementally (an ordered set keyed by last access, with the iterator stored in the
// node), never rebuilt by scanning the tree.
//
// Pages. The tree owns the device pages of its nodes. insert() adopts pages from the
// caller; pages it does not adopt (the tree already had those blocks) are returned to
// the caller to free. Eviction returns pages to the device PageAllocator.
//
// Tiers. Each node records per tier where its pages live (device page ids now; host page
// ids and storage residency are filled in by the hierarchical cache).
//
// Thread: not thread-safe. One thread (the scheduler) owns the tree; events are emitted
// synchronously on that thread, in the order of the changes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include <absl/container/flat_hash_map.h>
#include <vector>

#include "cache/block_hash.h"
#include "cache/kv_event.h"
#include "common/clock.h"
#include "common/result.h"
#include "memory/page_allocator.h"
#include "memory/page_id.h"

namespace strata {

using NodeId = uint64_t;

struct RadixTreeOptions {
  int32_t page_size = 16;  // tokens per page, in [1, 4096]
};

// A tree node: a run of consecutive full pages with no branching inside.
struct RadixNode {
  NodeId id = 0;
  RadixNode* parent = nullptr;                       // null only for the root
  uint32_t index_in_parent = 0;                      // position in parent->children
  std::vector<std::unique_ptr<RadixNode>> children;  // owned
  std::vector<TokenId> tokens;                       // num_pages() * page_size tokens
  std::vector<BlockHash> hashes;                     // one per page
  std::vector<uint32_t> pin_counts;                  // external pins per page
  std::vector<PageId> device_pages;                  // per page; kInvalidPage if not on device
  std::vector<PageId> host_pages;                    // empty, or per page (hierarchical cache)
  std::vector<uint8_t> in_storage;                   // empty, or per page: 1 when in storage
  std::string first_page_extra;    // children of the root: extra keys of the first page
  int32_t lock_ref = 0;            // lock receipts whose path includes this node
  int32_t pin_ref = 0;             // pinned blocks in this node and all its descendants
  int32_t own_pinned_blocks = 0;   // pages of this node with pin_counts > 0
  int32_t soft_pinned_blocks = 0;  // pages of this node with a soft (TTL) pin
  uint64_t last_access_tick = 0;   // logical time of the last match/insert (LRU order)
  int64_t last_access_ms = 0;      // clock time of the same, for inspection
  uint64_t hit_count = 0;          // matches that reached into this node
  bool in_evictable_set = false;

  int32_t num_pages() const { return static_cast<int32_t>(hashes.size()); }
  bool is_leaf() const { return children.empty(); }
  bool is_protected() const { return lock_ref > 0 || pin_ref > 0; }
  bool on_device() const { return !device_pages.empty() && device_pages[0] != kInvalidPage; }
};

struct MatchResult {
  int32_t num_pages = 0;                // full pages matched
  std::vector<PageId> device_pages;     // the matched pages, in order
  std::vector<BlockHash> block_hashes;  // their block hashes
  RadixNode* last_node = nullptr;       // deepest matched node (the root when none)
  int32_t num_tokens(int32_t page_size) const { return num_pages * page_size; }
};

struct InsertResult {
  int32_t num_existing_pages = 0;       // leading pages the tree already had
  int32_t num_new_pages = 0;            // pages adopted into new nodes
  std::vector<PageId> rejected_pages;   // passed pages the tree did not take: caller frees
  RadixNode* last_node = nullptr;       // node holding the last inserted page
  std::vector<BlockHash> block_hashes;  // hashes of every inserted page, in order
};

// A request lock: proof that lock() protected a path; release it exactly once.
struct LockReceipt {
  uint32_t slot = UINT32_MAX;
  uint32_t generation = 0;
  bool valid() const { return slot != UINT32_MAX; }
};

struct PinOptions {
  int64_t ttl_ms = 0;    // 0: a hard pin (no expiry); > 0: expires unless hit again
  int32_t priority = 0;  // higher survives longer under auto-unpin; in [-100, 100]
};

struct PinResult {
  int32_t pinned = 0;   // blocks pinned
  int32_t unknown = 0;  // hashes not in the tree (skipped)
};

struct UnpinResult {
  int32_t unpinned = 0;    // blocks whose pin count went down
  int32_t unknown = 0;     // hashes not in the tree
  int32_t not_pinned = 0;  // hashes in the tree without a pin (nothing done)
};

struct EvictResult {
  int32_t evicted_pages = 0;
  int32_t evicted_nodes = 0;
};

struct EvictBlocksResult {
  int32_t evicted_blocks = 0;
  int32_t skipped_locked = 0;        // blocks kept because a request holds them
  int32_t skipped_pinned = 0;        // blocks kept because they (or descendants) are pinned
  int32_t skipped_has_children = 0;  // without descendants: blocks that still have some
  int32_t unknown = 0;               // hashes not in the tree
};

struct FlushResult {
  int32_t evicted_pages = 0;
  int32_t pinned_preserved = 0;  // pinned blocks kept
  int32_t locked_skipped = 0;    // pages kept because requests hold them
};

struct TreeStats {
  int32_t page_size = 0;
  int64_t num_nodes = 0;           // excluding the root
  int64_t cached_pages = 0;        // pages held by the tree on the device
  int64_t protected_pages = 0;     // pages in locked or pinned nodes
  int64_t evictable_pages = 0;     // pages in leaves that can be evicted now
  int64_t pinned_blocks = 0;       // distinct blocks with a pin
  int64_t soft_pinned_blocks = 0;  // of which with a TTL
  int64_t locked_nodes = 0;        // nodes with lock_ref > 0
  int64_t outstanding_locks = 0;   // receipts not yet released
  uint64_t match_calls = 0;
  uint64_t matched_pages_total = 0;
  uint64_t evicted_pages_total = 0;
  uint64_t inserted_pages_total = 0;
  uint64_t expired_pins_total = 0;
};

struct NodeSnapshot {
  NodeId id = 0;
  NodeId parent_id = 0;  // 0 for children of the root (the root has id 0)
  int32_t num_tokens = 0;
  std::vector<BlockHash> block_hashes;
  std::vector<uint32_t> pin_counts;
  int32_t lock_ref = 0;
  int32_t pin_ref = 0;
  int64_t last_access_ms = 0;
  uint64_t hit_count = 0;
  bool on_device = false;
  bool on_host = false;
  bool in_storage = false;
  bool evictable = false;
};

class RadixTree {
 public:
  // `device_pages` receives evicted pages; `events` (may be null) receives every change;
  // `clock` (may be null: steady clock) stamps accesses and expires soft pins.
  RadixTree(RadixTreeOptions options, PageAllocator* device_pages, KvEventSink* events,
            const Clock* clock = nullptr);
  ~RadixTree();
  RadixTree(const RadixTree&) = delete;
  RadixTree& operator=(const RadixTree&) = delete;

  int32_t page_size() const { return options_.page_size; }

  // Longest cached full-page prefix of `tokens` under `cache_salt`. Splits a node when
  // the match ends inside it, so that last_node ends exactly at the match. Marks the
  // path as accessed (LRU), counts a hit on each node reached, refreshes soft pins hit.
  MatchResult match_prefix(std::span<const TokenId> tokens, std::string_view cache_salt = {});

  // Inserts the full pages of `tokens` (tokens.size() / page_size pages; a trailing
  // partial page is ignored) with their device `pages` (one per full page). Pages for
  // blocks the tree already has are not adopted: those that differ from the tree's own
  // page are returned in rejected_pages for the caller to free.
  InsertResult insert(std::span<const TokenId> tokens, std::span<const PageId> pages,
                      std::string_view cache_salt = {});

  // Locks the path root..node (node may be the root: an empty lock). The node must be
  // in this tree (a pointer from match_prefix or insert since the last reset).
  LockReceipt lock(RadixNode* node);
  // Releases a receipt. Fails (and changes nothing) for a receipt already released, or
  // from before a reset.
  Status release(LockReceipt receipt);
  // The node a live receipt protects (null for a stale receipt).
  RadixNode* locked_node(LockReceipt receipt) const;

  // Pins blocks by hash (counted: pin twice needs unpin twice). Unknown hashes are
  // skipped and counted. A repeated hash in one call pins twice.
  PinResult pin(std::span<const BlockHash> hashes, PinOptions options = {});
  // Unpins blocks by hash: one pin each (a hard pin first, then a soft one).
  UnpinResult unpin(std::span<const BlockHash> hashes);
  // Drops soft pins whose TTL ran out at the clock's time. Returns blocks unpinned.
  int32_t expire_soft_pins();
  // The no-deadlock rule: releases pins until at least `pages` more pages are
  // unprotected or no pin is left, soft pins first (lowest priority, then least
  // recently used), then hard pins in the same order. Each chosen block loses all its
  // pins. Returns the blocks unpinned, in order. Scans the tree: for rare use only.
  std::vector<BlockHash> release_pins_for(int64_t pages);

  // Evicts least-recently-used unprotected leaves until at least `num_pages` pages were
  // freed or nothing evictable remains. num_pages <= 0 evicts nothing.
  EvictResult evict(int32_t num_pages);
  // Evicts the given blocks; with `descendants`, also everything below them. What a
  // lock or a pin protects is skipped and counted. Without `descendants`, a block that
  // still has cached descendants is skipped.
  EvictBlocksResult evict_blocks(std::span<const BlockHash> hashes, bool descendants);
  // Evicts everything evictable, keeping pinned blocks and what requests hold.
  FlushResult flush();
  // Drops every node, pins included, and frees their pages. Refused while any lock
  // receipt is outstanding (running requests still read those pages).
  Status reset();

  // Lookup by block hash.
  bool contains(BlockHash hash) const { return index_.contains(hash); }
  uint32_t pin_count(BlockHash hash) const;

  TreeStats stats() const;
  std::vector<NodeSnapshot> snapshot() const;
  // Every device page the tree owns (for page accounting audits).
  void collect_device_pages(std::vector<PageId>& out) const;
  // Hashes of every cached block (order unspecified).
  std::vector<BlockHash> all_block_hashes() const;
  // Recomputes every derived quantity from scratch and compares: hash index, refs,
  // evictable set, counters, chained hashes. Returns the first violation.
  Status check_invariants() const;

  const RadixNode* root() const { return root_.get(); }

 private:
  struct Loc {
    RadixNode* node = nullptr;
    int32_t offset = 0;
  };
  struct EvictKey {
    uint64_t tick;
    NodeId id;
    RadixNode* node;
    bool operator<(const EvictKey& o) const { return tick != o.tick ? tick < o.tick : id < o.id; }
  };
  struct SoftPin {
    int32_t count = 0;      // soft pins on this block
    int64_t ttl_ms = 0;     // the longest TTL given
    int64_t expiry_ms = 0;  // refreshed on hit
    int32_t priority = 0;
  };
  struct ReceiptSlot {
    RadixNode* node = nullptr;
    uint32_t generation = 0;
    bool live = false;
  };

  // Split `node` so that its first `at` pages become a new parent node. Returns the new
  // (upper) node; `node` keeps the rest, its children and its identity.
  RadixNode* split(RadixNode* node, int32_t at);
  RadixNode* find_child(const RadixNode* parent, std::span<const TokenId> first_page,
                        std::string_view extra) const;
  // One step of a walk: the device-resident child of `node` that continues `tokens` at
  // page `at_page`, split so that it ends where the match ends. Null when none.
  RadixNode* descend(RadixNode* node, std::span<const TokenId> tokens, int32_t at_page,
                     std::string_view extra, int32_t& matched, bool& partial);
  BlockHash last_hash(const RadixNode* node) const;
  void touch(RadixNode* node, uint64_t tick, int64_t now_ms);
  void update_evictable(RadixNode* node);
  void add_lock_ref(RadixNode* node, int32_t delta);  // node..root
  void add_pin_ref(RadixNode* node, int32_t delta);   // node..root
  void set_protection_change(RadixNode* node, bool was_protected);
  // After a node loses pins or children: split off an unpinned tail of a childless node
  // with pinned blocks so that the tail becomes evictable.
  void restore_pin_tail(RadixNode* node);
  void evict_subtree(RadixNode* top);
  void erase_evictable(RadixNode* node);
  // Removes a leaf: frees its pages, unindexes it, emits BlockRemoved. Returns pages.
  int32_t remove_leaf(RadixNode* leaf);
  void change_pin(const Loc& loc, int32_t delta);
  int32_t unpin_soft(BlockHash hash, int32_t count);
  void drop_soft_record(BlockHash hash);
  void emit(KvEvent event);

  RadixTreeOptions options_;
  PageAllocator* device_pages_;
  KvEventSink* events_;
  const Clock* clock_;
  std::unique_ptr<RadixNode> root_;
  absl::flat_hash_map<BlockHash, Loc> index_;  // every cached block -> its node and offset
  std::set<EvictKey> evictable_;               // unprotected device leaves, LRU first
  absl::flat_hash_map<BlockHash, SoftPin> soft_pins_;
  std::set<std::pair<int64_t, BlockHash>> soft_expiry_;  // (expiry_ms, hash)
  std::vector<ReceiptSlot> receipts_;
  std::vector<uint32_t> free_receipts_;
  NodeId next_node_id_ = 1;
  uint64_t tick_ = 0;
  int64_t num_nodes_ = 0;
  int64_t cached_pages_ = 0;
  int64_t protected_pages_ = 0;
  int64_t evictable_pages_ = 0;
  int64_t pinned_blocks_ = 0;
  int64_t locked_nodes_ = 0;
  int64_t outstanding_locks_ = 0;
  uint64_t match_calls_ = 0;
  uint64_t matched_pages_total_ = 0;
  uint64_t evicted_pages_total_ = 0;
  uint64_t inserted_pages_total_ = 0;
  uint64_t expired_pins_total_ = 0;
};

}  // namespace strata
