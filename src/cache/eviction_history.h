// The blocks the tree evicted lately for want of room, to recognise a block computed again
// after its eviction (a "ghost" list, as in ARC): the sign of a pool too small for the
// working set it serves (issue 33, the seed's Q1: a worker evicting in storms).
//
// Contract: holds the hashes of the last `capacity` recorded blocks, oldest forgotten
// first. take() answers whether a block is among them and forgets it (each eviction is
// matched by at most one recomputation). Allocates only in the constructor while the
// hashes it holds stay within capacity.
//
// Thread: single-threaded (the tree's, the scheduler's).
#pragma once

#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <span>
#include <vector>

#include "cache/block_hash.h"

namespace strata {

class EvictionHistory {
 public:
  // capacity 0 remembers nothing.
  explicit EvictionHistory(int64_t capacity);

  void record(std::span<const BlockHash> hashes);
  // True (and forgotten) when `hash` was recorded and not yet forgotten.
  bool take(BlockHash hash);
  void clear();

  int64_t capacity() const { return static_cast<int64_t>(ring_.size()); }
  int64_t size() const { return static_cast<int64_t>(slot_of_.size()); }

 private:
  // ring_[k] is the hash recorded in slot k; slot_of_ maps a remembered hash to its slot.
  // A slot is overwritten when the ring comes round: the hash it held is forgotten then,
  // unless it was taken or recorded again (its slot has moved on).
  std::vector<BlockHash> ring_;
  absl::flat_hash_map<BlockHash, uint32_t> slot_of_;
  size_t next_ = 0;
};

}  // namespace strata
