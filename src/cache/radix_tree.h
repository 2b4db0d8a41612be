// The paged radix prefix tree: the heart of Strata's KV cache.
//
// The tree maps token sequences, at page granularity, to the pages that hold their KV.
// It stores page ids, never KV bytes. Every full page ("block") has a chained 64-bit
// block hash (block_hash.h); a hash index maps each cached block to its node and offset
// (block_index.h). A lookup by hash sees every cached block; inside, a new node's blocks
// after its first are indexed only once a lookup by hash needs them.
//
// Rooms. One class, one concept per file:
//   radix_node.h          the node: plain metadata and its tier states
//   radix_tree.cc         structure: match_prefix, insert (one path for device and host
//                         blocks), split, lock receipts, counters
//   block_index.h         the hash index: block hash -> node and offset, lazy past a
//                         node's first block
//   radix_tree_pins.cc    applies the pin table's answers to nodes (pin_ref, pin tails)
//   pin_table.h           the pins themselves: hard counts, soft pins with TTL, priority
//   eviction_policy.h     the order of the evictable sets (LRU by default)
//   radix_tree_evict.cc   device eviction, evict_blocks, flush, reset
//   radix_tree_tiers.cc   back-up, demotion, load-back, transfers, host eviction, storage
//   radix_tree_audit.cc   check_invariants: recomputes every derived quantity
//
// Protection. A node is protected while a request lock or an external pin covers it:
//  - a lock receipt (lock()) holds the path root..node; release() undoes exactly that,
//    even after the node was split (a split keeps the deeper half as the original node);
//  - a pin is counted per block; a pinned block protects itself and all its ancestors.
//    The tree keeps "a childless node with pinned blocks ends with a pinned block" by
//    splitting, so that unpinned pages after the last pinned block stay evictable.
// Eviction removes unprotected leaves in the order of the eviction policy (least recently
// used first by default). The evictable sets are kept incrementally by the policy, never
// rebuilt by scanning the tree.
//
// Pages. The tree owns the device pages of its nodes. insert() adopts pages from the
// caller; pages it does not adopt (the tree already had those blocks) are returned to
// the caller to free. Eviction returns pages to the device PageAllocator.
//
// Tiers (hierarchical cache, when a host PageAllocator is given). A node lives on the
// device (L1), on the host (L2), or both; a node on neither leaves the tree. Device-resident
// nodes form a top-connected subtree (a node on the device has its parent on the device).
// The tree decides what moves where and allocates the pages; the bytes move elsewhere
// (the engine's transfer threads). A move is requested through take_transfers() and
// finished by complete_transfer(): while it runs, the node's io_ref keeps it from being
// evicted, and its destination pages are not yet readable (a loading node is invisible to
// match_prefix). Device eviction of a node with a host copy frees the device pages and
// keeps the node ("demotion"); a node that must be demoted but has no host copy (a pinned
// block, or the write_back policy) is backed up first and demoted when the copy lands.
// Host eviction removes host-only leaves that nothing protects, in the policy's order.
// Storage (L3) residency is a per-page flag: storage is shared and looked up by hash.
//
// Thread: not thread-safe. One thread (the scheduler) owns the tree; events are emitted
// synchronously on that thread, in the order of the changes.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cache/block_hash.h"
#include "cache/block_index.h"
#include "cache/eviction_history.h"
#include "cache/eviction_policy.h"
#include "cache/kv_event.h"
#include "cache/pin_priority.h"
#include "cache/pin_table.h"
#include "cache/radix_node.h"
#include "cache/tree_stats.h"
#include "cache/write_policy.h"
#include "common/clock.h"
#include "common/result.h"
#include "memory/page_allocator.h"
#include "memory/page_id.h"
#include "memory/transfer_direction.h"

namespace strata {

struct RadixTreeOptions {
  int32_t page_size = 16;  // tokens per page, in [1, 4096]
  WritePolicy write_policy = WritePolicy::kWriteThrough;
  int32_t write_through_threshold = 2;  // hits before a selective backup, >= 1
  // How blocks are hashed (--prefix-caching-hash-algo): every hash the tree makes, keeps,
  // emits and is asked for is this hasher's.
  BlockHasher hasher;
};

struct MatchResult {
  int32_t num_pages = 0;                // full pages matched on the device
  std::vector<PageId> device_pages;     // the matched device pages, in order
  std::vector<BlockHash> block_hashes;  // their block hashes
  RadixNode* last_node = nullptr;       // deepest device node matched (the root when none)
  // The continuation found on the host only (hierarchical cache): pages and the deepest
  // node (null when none). load_back() brings it to the device.
  int32_t host_num_pages = 0;
  RadixNode* host_last_node = nullptr;
  int32_t num_tokens(int32_t page_size) const { return num_pages * page_size; }
};

// A copy the tree asks for. The engine runs it off the scheduler thread and then calls
// complete_transfer() with it. hashes[i] names the block of device_pages[i]/host_pages[i].
struct TransferRequest {
  TransferDirection direction = TransferDirection::kDeviceToHost;  // a backup, or a load-back
  std::vector<BlockHash> hashes;
  std::vector<PageId> device_pages;
  std::vector<PageId> host_pages;
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

enum class EvictReason : uint8_t { kRoom, kOperator };

struct EvictResult {
  int32_t evicted_pages = 0;  // device pages freed now
  int32_t evicted_nodes = 0;
  int32_t pending_pages = 0;  // device pages that free when their backup lands
};

class RadixTree {
 public:
  // `device_pages` receives evicted pages; `events` (may be null) receives every change;
  // `clock` (may be null: steady clock) stamps accesses and expires soft pins.
  // `host_pages` (may be null) enables the hierarchical cache: the host pool's pages.
  // `eviction` (may be null: LRU) orders the evictable sets; the tree owns it.
  RadixTree(RadixTreeOptions options, PageAllocator* device_pages, KvEventSink* events,
            const Clock* clock = nullptr, PageAllocator* host_pages = nullptr,
            std::unique_ptr<EvictionPolicy> eviction = nullptr);
  ~RadixTree();
  RadixTree(const RadixTree&) = delete;
  RadixTree& operator=(const RadixTree&) = delete;

  int32_t page_size() const { return options_.page_size; }
  bool hierarchical() const { return host_pages_ != nullptr; }

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

  // Hierarchical cache. load_back() starts loading the host part of `m` (a fresh match)
  // to the device: it allocates device pages for all of it (evicting unlocked device
  // pages as needed) or fails and changes nothing. The caller holds a lock on
  // m.host_last_node until complete_transfer() of the load finished.
  Status load_back(const MatchResult& m);
  // Copies requested since the last call, in order.
  std::vector<TransferRequest> take_transfers();
  // A copy from take_transfers() finished (`ok` false: it failed; the destination pages
  // are released and the node keeps its source copy).
  void complete_transfer(const TransferRequest& request, bool ok = true);
  bool io_pending() const { return stats_.io_pending_nodes > 0 || !transfers_.empty(); }
  // Evicts least-recently-used host-only leaves until `num_pages` host pages are free.
  int32_t evict_host(int32_t num_pages);
  // Host pages of blocks on the host, for a storage write: returns the blocks among
  // `hashes` that are on the host and not yet in storage, with their host pages, and
  // holds them (io_ref) until finish_storage_write().
  std::vector<std::pair<BlockHash, PageId>> begin_storage_write(std::span<const BlockHash> hashes);
  void finish_storage_write(std::span<const BlockHash> hashes, std::span<const uint8_t> written);
  // Inserts blocks read from storage as host-only nodes (host pages adopted; pages of
  // blocks the tree already has are returned for the caller to free).
  InsertResult insert_host(std::span<const TokenId> tokens, int32_t first_page,
                           std::span<const PageId> host_pages, std::string_view cache_salt);
  // Full-page block hashes of tokens (no tree access).
  std::vector<BlockHash> block_hashes_of(std::span<const TokenId> tokens,
                                         std::string_view cache_salt) const;
  // Tool sessions: protect (+1) or release (-1) the host copy of node..root. A protected
  // node is backed up and demoted like a pinned one, and never dropped from the host.
  void protect_host(RadixNode* node, int32_t delta);
  // The node whose last page is block `hash`, splitting its node there if needed (the
  // node then keeps ending at that block through later splits). Null for an unknown hash.
  RadixNode* node_ending_at(BlockHash hash);
  // Lookup without splitting (null when unknown).
  RadixNode* node_of(BlockHash hash) const;
  // Starts host backups of the nodes holding these blocks that have none (pinned blocks
  // get a host copy, and a storage copy, at once). Returns nodes started.
  int32_t back_up(std::span<const BlockHash> hashes);
  // Starts moving node..root off the device (backing up what has no host copy) as far as
  // locks allow. Returns the device pages that will leave.
  int32_t offload_path(RadixNode* node);

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
  // Unpins blocks by hash: one pin each (a hard pin first, else the soft pin of the
  // highest priority, ties the longest TTL; see pin_table.h).
  UnpinResult unpin(std::span<const BlockHash> hashes);
  // Drops each soft pin whose own expiry passed at the clock's time. Returns the pins
  // dropped.
  int32_t expire_soft_pins();
  // The no-deadlock rule: releases pins until unevictable_pages() fell by at least `pages`
  // or no pin is in the way, soft pins first (lowest priority, then least recently used),
  // then hard pins in the same order; a block's priority is the max over its soft pins.
  // Each chosen block loses all its pins. With a host tier a pin never holds the device
  // (pinned pages are backed up and demoted): only pins of device pages without a host
  // copy are candidates, and releasing them helps only while the host cannot take their
  // backups. Returns the blocks unpinned, in order. Scans the tree: for rare use only.
  std::vector<BlockHash> release_pins_for(int64_t pages);
  // True when the first full page of `tokens` is cached with an operator's pin: a hard
  // pin, or a soft pin above the lowest priority (a client's own pins are soft at the
  // lowest, engine/pin_policy.h). The scheduler gives such requests a class of their own.
  bool operator_pinned_prefix(std::span<const TokenId> tokens, std::string_view cache_salt) const;

  // Evicts least-recently-used unprotected device leaves until at least `num_pages` device
  // pages were freed or nothing evictable remains. num_pages <= 0 evicts nothing. With a
  // host tier, a node with a host copy is demoted (kept on the host); a pinned node or,
  // under write_back, any node without one is backed up first (its pages free later).
  // `reason`: kRoom when the pool needs the pages (what it evicts is remembered, and counted
  // as recomputed should it come back: recomputed_pages_recent), kOperator when an operator
  // asked (POST /cache/evict, flush).
  EvictResult evict(int32_t num_pages, EvictReason reason = EvictReason::kRoom);
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
  // Blocks with a soft pin whose priority (the max over their soft pins) is at most
  // `priority` (a scan of the pin table).
  int64_t soft_pinned_blocks_at_most(PinPriority priority) const;

  TreeStats stats() const;
  // Device pages computed again after eviction had removed them for want of room
  // (TreeStats::recomputed_pages_total), as a count decayed with a time constant of
  // kRecomputedWindowMs: about those of the last ten seconds. What the pool lacked lately
  // for the working set it serves (the worker's load, server/worker_info_routes.cc).
  static constexpr int64_t kRecomputedWindowMs = 10'000;
  double recomputed_pages_recent() const;
  std::vector<NodeSnapshot> snapshot() const;
  // One node as snapshot() reports it.
  NodeSnapshot snapshot_of(const RadixNode& node) const;
  // The cached node with this id (null when none; the root, id 0, is not one). Walks the
  // tree: for inspecting one node (the dashboard), not for the hot path.
  const RadixNode* find_node(NodeId id) const;
  // Every device page the tree owns (for page accounting audits).
  void collect_device_pages(std::vector<PageId>& out) const;
  // Every host page the tree owns (valid or being written).
  void collect_host_pages(std::vector<PageId>& out) const;
  // Whether eviction can never free this node's device pages for now (what the
  // admission arithmetic counts as protected).
  bool device_protected(const RadixNode* node) const { return acct(node).prot > 0; }
  // TreeStats::unevictable_pages: device pages that eviction (or demotion) cannot free now.
  int64_t unevictable_pages() const;
  // Hashes of every cached block (order unspecified).
  std::vector<BlockHash> all_block_hashes() const;
  // Recomputes every derived quantity from scratch and compares: hash index, refs,
  // evictable set, counters, chained hashes. Returns the first violation.
  Status check_invariants() const;

  const RadixNode* root() const { return root_.get(); }

 private:
  using Loc = BlockLoc;
  struct ReceiptSlot {
    RadixNode* node = nullptr;
    uint32_t generation = 0;
    bool live = false;
  };

  // ---- Structure (radix_tree.cc) ----
  // Where inserted pages go: the device (a computed prefix) or the host (blocks read
  // from storage, which start at page `first_page` of the tokens).
  struct InsertPages {
    Medium medium = Medium::kDevice;
    int32_t first_page = 0;         // pages[k] is the page of block first_page + k
    std::span<const PageId> pages;  // device or host pages, per `medium`
  };
  // The one insert path behind insert() and insert_host().
  InsertResult insert_blocks(std::span<const TokenId> tokens, std::string_view cache_salt,
                             const InsertPages& in);
  static std::string describe(const RadixNode* node);  // for check messages
  // Nodes come from a small pool of removed nodes that keep their vectors' capacity, so
  // that the steady state of insert and evict allocates nothing (new_node, recycle_node).
  std::unique_ptr<RadixNode> new_node();
  void recycle_node(std::unique_ptr<RadixNode> node);
  // Within evict() and evict_host() the removed nodes' index entries are erased in one run
  // at the end (a long run keeps many misses in flight): nothing there looks up a removed
  // block.
  // Returns whether this call opened the batch; only that one closes (and runs) it.
  bool begin_unindex_batch();
  void end_unindex_batch(bool opened);
  // Split `node` so that its first `at` pages become a new parent node. Returns the new
  // (upper) node; `node` keeps the rest, its children and its identity.
  RadixNode* split(RadixNode* node, int32_t at);
  RadixNode* find_child(const RadixNode* parent, std::span<const TokenId> first_page,
                        std::string_view extra) const;
  // One step of a walk: the child of `node` that continues `tokens` at page `at_page` and
  // is in the tiers `walk` accepts, split so that it ends where the match ends. Null when
  // none.
  enum class Walk : uint8_t { kDevice, kHostOnly, kAnyTier };
  RadixNode* descend(RadixNode* node, std::span<const TokenId> tokens, int32_t at_page,
                     std::string_view extra, int32_t& matched, bool& partial,
                     Walk walk = Walk::kDevice);
  BlockHash last_hash(const RadixNode* node) const;
  // What a child of `node` chains from: its last block's ChainValue (the hasher's root for
  // the root).
  ChainValue last_chain(const RadixNode* node) const;
  // An access: new recency, and the node's place in the eviction order moves with it.
  void touch(RadixNode* node, uint64_t tick, int64_t now_ms);
  void add_lock_ref(RadixNode* node, int32_t delta);  // node..root
  struct Acct {
    int64_t device = 0, host = 0, host_only = 0, prot = 0, host_prot = 0, stored = 0, io = 0;
    // With a host tier: device pages of a pinned or session-held node without a host copy
    // (not otherwise protected): they leave the device only after a backup.
    int64_t bound = 0;
    // Field by field: what apply() adds to the counters, and what the audit sums over the
    // tree to check them, the one list of the fields.
    Acct& operator+=(const Acct& o) {
      device += o.device;
      host += o.host;
      host_only += o.host_only;
      prot += o.prot;
      host_prot += o.host_prot;
      stored += o.stored;
      io += o.io;
      bound += o.bound;
      return *this;
    }
    Acct operator-() const {
      return Acct{-device, -host, -host_only, -prot, -host_prot, -stored, -io, -bound};
    }
  };
  Acct acct(const RadixNode* node) const;
  void apply(const Acct& before, const Acct& after);
  // Whether `node` belongs in the device / host-only evictable set: the one rule, which
  // update_evictable / update_host_evictable keep and the audit checks.
  bool belongs_in_evictable(const RadixNode* node) const;
  bool belongs_in_host_evictable(const RadixNode* node) const;
  void emit_stored(const RadixNode* node, Medium medium);
  void emit(KvEvent event);

  // ---- Pins (radix_tree_pins.cc) ----
  void add_pin_ref(RadixNode* node, int32_t delta);  // node..root
  // After a node loses pins or children: split off an unpinned tail of a childless node
  // with pinned blocks so that the tail becomes evictable.
  void restore_pin_tail(RadixNode* node);
  // Mirrors a change of a block's pin count (from the pin table) in its node.
  void change_pin(const Loc& loc, int32_t delta);
  // The blocks of `hashes` (node null: not in the tree). A batch of spread blocks costs a
  // few cache misses each (the index's probe, the node, its pin counts): they are
  // prefetched ahead, so that they overlap instead of coming one after the other.
  std::vector<Loc> locate(std::span<const BlockHash> hashes) const;
  static void prefetch_pin_count(const Loc& loc);
  // fn(hash, loc) for each of `hashes` in the tree, in order (located as above, each pin
  // count prefetched ahead of its turn); the number not in the tree.
  template <typename F>
  int32_t for_each_located(std::span<const BlockHash> hashes, F&& fn);
  // Mirrors a removal the pin table made: pin count and soft-pinned pages.
  void apply_unpin(const Loc& loc, const PinChange& change);

  // ---- Evictable sets and eviction (radix_tree_evict.cc) ----
  void update_sets(RadixNode* node);       // both sets, by their rules
  void leave_sets(RadixNode* node);        // out of both sets (before its key changes, or it goes)
  void update_evictable(RadixNode* node);  // the device set's rule
  void update_host_evictable(RadixNode* node);  // the host-only set's rule
  // Puts `node` in or out of `set`, keeping the node's flag for that set
  // (in_evictable_set / in_host_evictable_set) and the set's page counter in step.
  void place_in_set(RadixNode* node, EvictionSet set, bool member);
  void evict_subtree(RadixNode* top);
  // Removes a childless node from every tier: frees its pages, unindexes it, emits
  // BlockRemoved per medium. Returns its device pages.
  int32_t remove_leaf(RadixNode* leaf);

  // ---- Tiers (radix_tree_tiers.cc) ----
  bool is_device_leaf(const RadixNode* node) const;
  bool needs_backup_to_leave(const RadixNode* node) const;
  bool start_backup(RadixNode* node);  // false: no host room
  void demote(RadixNode* node);        // drop the device copy of a backed-up device leaf
  void try_demote(RadixNode* node);
  bool allocate_host(int32_t count, std::vector<PageId>& out);

  RadixTreeOptions options_;
  PageAllocator* device_pages_;
  PageAllocator* host_pages_;
  KvEventSink* events_;
  const Clock* clock_;
  std::unique_ptr<RadixNode> root_;
  BlockIndex index_;  // every cached block -> its node and offset (block_index.h)
  std::unique_ptr<EvictionPolicy> eviction_;  // orders the evictable sets
  PinTable pins_;                             // every pin of a cached block
  std::vector<TransferRequest> transfers_;    // requested, not yet taken
  std::vector<ReceiptSlot> receipts_;
  std::vector<uint32_t> free_receipts_;
  NodeId next_node_id_ = 1;
  uint64_t tick_ = 0;
  // The counters stats() reports, kept in place; the fields stats() derives on each call
  // (page_size, hierarchical, unevictable_pages, pinned_blocks, soft_pinned_blocks,
  // host_capacity_pages) stay zero here.
  TreeStats stats_;
  int64_t backup_bound_pages_ = 0;  // Acct::bound summed

  // Scratch of the hot paths (new_node, recycle_node, the unindex batch).
  std::vector<std::unique_ptr<RadixNode>> spare_nodes_;  // removed nodes, emptied, for reuse
  bool unindex_batch_open_ = false;               // remove_leaf leaves its erasures to the batch
  std::vector<BlockIndex::Owned> unindex_batch_;  // removed nodes' entries, to erase

  // Blocks evicted for want of room (evict(), evict_host(); not evict_blocks, flush or
  // reset, which an operator asked for), as many as both pools hold: a block inserted
  // again on the device from among them was computed twice (recomputed_pages_total).
  EvictionHistory evicted_;
  // Why remove_leaf is removing nodes now: set for the length of an evict(), evict_host() or
  // flush() (EvictionScope), nullopt outside them (evict_blocks, reset: an operator's). It
  // records what it removes only for kRoom; a scope nested in an operator's stays kOperator.
  std::optional<EvictReason> eviction_scope_;
  class EvictionScope {
   public:
    EvictionScope(RadixTree& tree, EvictReason reason);
    ~EvictionScope() { tree_.eviction_scope_ = outer_; }
    EvictionScope(const EvictionScope&) = delete;
    EvictionScope& operator=(const EvictionScope&) = delete;

   private:
    RadixTree& tree_;
    std::optional<EvictReason> outer_;
  };
  double recomputed_recent_ = 0.0;  // recomputed_pages_recent() at recomputed_recent_ms_
  int64_t recomputed_recent_ms_ = 0;
  void count_recomputed(const RadixNode* leaf, int64_t now_ms);
};

}  // namespace strata
