// The radix tree's hash index (radix_tree.h): block hash -> the node and offset that hold
// the block, for every cached block.
//
// Lazy past a node's first block. Matching only ever looks up the first block of a node
// (the child that continues a prefix, RadixTree::find_child), so a new node has its first
// block indexed at once and the rest deferred. The rest is indexed by the next lookup
// that may name any block (find, contains, at, size, begin: "settling" lookups: pins,
// evictions and transfers by hash, tool sessions, the audit), in one prefetched run over
// every deferred node. A node removed before such a lookup never has the rest indexed or
// erased: in the common life of a branch (inserted, matched, evicted) a node costs one
// entry instead of one per page, each entry being a cache miss in a large table.
// Invariant: a deferred node has exactly its first block indexed (or none, see below).
//
// Collisions (two cached blocks with one 64-bit hash: different prefixes, chance about
// 2^-64 per pair). A hash names at most one block: the one indexed first keeps it. The
// tree refuses a new node whose first block collides (RadixTree::insert_blocks); a
// collision further into a new node is only seen when its blocks are indexed, and that
// block then stays unreachable by hash (matching compares tokens and is not affected).
// An erase or a split changes only entries that name the node in question, so a
// collision never takes another node's entry away.
//
// Ownership: borrows the nodes (the tree owns them). A node that leaves the tree must be
// released (release()) before it is destroyed or reused. Thread: the tree's thread (the
// scheduler); lookups are logically const, but settling writes the table (mutable).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include "cache/block_hash.h"
#include "cache/radix_node.h"

namespace strata {

// Where a cached block lives: its node and its page offset in the node.
struct BlockLoc {
  RadixNode* node = nullptr;
  int32_t offset = 0;
};

class BlockIndex {
 public:
  using Map = absl::flat_hash_map<BlockHash, BlockLoc>;
  using const_iterator = Map::const_iterator;
  // An entry that a removed node held, to erase now or at the end of a batch.
  struct Owned {
    BlockHash hash = 0;
    const RadixNode* node = nullptr;  // compared, never dereferenced
  };

  // ---- Lookups of any block (settle first) ----
  const_iterator find(BlockHash hash) const {
    settle();
    return map_.find(hash);
  }
  bool contains(BlockHash hash) const {
    settle();
    return map_.contains(hash);
  }
  const BlockLoc& at(BlockHash hash) const {
    settle();
    return map_.at(hash);
  }
  size_t size() const {
    settle();
    return map_.size();
  }
  const_iterator begin() const {
    settle();
    return map_.begin();
  }
  // Never settles: it is compared with what a find just returned.
  const_iterator end() const { return map_.end(); }

  // ---- Lookups of a node's first block (never deferred: no settling) ----
  const_iterator find_first(BlockHash hash) const { return map_.find(hash); }
  // Starts the cache miss of `hash`'s entry.
  void prefetch(BlockHash hash) const { map_.prefetch(hash); }

  // ---- Changes ----
  // A new node (its hashes set): indexes its first block and defers the rest. False, and
  // nothing changed, when the first block's hash is indexed already.
  bool add(RadixNode* node);
  // `upper` took the first pages of `lower` (RadixTree::split). Re-points the entries that
  // named `lower`; a deferred `lower` leaves two deferred halves (each first block indexed).
  void split(RadixNode* upper, RadixNode* lower);
  // `node` leaves the tree: appends the entries it holds to `out` (erase them with erase(),
  // at once or at the end of a batch), and forgets it if it was deferred.
  void release(RadixNode* node, std::vector<Owned>& out);
  // Erases each entry that still names its node, in one prefetched run.
  void erase(std::span<const Owned> entries);
  void clear();
  // Indexes every deferred node's blocks after the first (inline: every lookup by hash
  // passes here, almost always with nothing deferred).
  void settle() const {
    if (!deferred_.empty()) settle_deferred();
  }

 private:
  void settle_deferred() const;
  mutable Map map_;
  // Nodes whose blocks after the first are not indexed.
  mutable absl::flat_hash_set<RadixNode*> deferred_;
};

}  // namespace strata
