// The blocks the tree evicted lately for want of room, to recognise a block computed again
// after its eviction (a "ghost" list, as in ARC): the sign of a pool too small for the
// working set it serves (issue 33, the seed's Q1: a worker evicting in storms).
//
// Contract: covers the last `capacity` recorded blocks, oldest forgotten first. take()
// answers how many pages a block computed again stands for, and forgets it (each eviction
// is matched by at most one recomputation); a hash recorded again is remembered from its
// latest record. Allocates only in the constructor.
//
// Exact up to kExactBlocks; beyond, sampled by hash. Every evicted block is recorded and
// every new device leaf's blocks are looked up, so the history sits on the tree's two
// hottest paths, and a table as large as a big pool costs a cache miss or two per block
// (issue 56: evicting 1,000 pages of a 1M-token tree took 60 µs with it against 16 µs
// without). A history of capacity C > kExactBlocks keeps only the blocks whose hash falls
// in a fixed 1/S of the hash space (S the power of two that brings C/S to kExactBlocks or
// below) and counts each one taken as S pages: spatial sampling by hash, as SHARDS samples
// a cache's reuse. A block is in the sample or not whatever its history, so the count is
// an unbiased estimate of the exact one (its relative error about 1/sqrt(blocks taken)),
// over the same window of the last C blocks; the work per block is 1/S of the exact one's.
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
  // Histories of at most this many blocks are exact (a table of about 0.5 MB).
  static constexpr int64_t kExactBlocks = 16 * 1024;

  // capacity 0 remembers nothing.
  explicit EvictionHistory(int64_t capacity);

  void record(std::span<const BlockHash> hashes);
  // The pages `hash` stands for when it was recorded and not yet forgotten (then
  // forgotten): pages_per_block(), or 0.
  int64_t take(BlockHash hash);
  void clear();

  int64_t capacity() const { return capacity_; }
  // The blocks the history holds (those of the sample).
  int64_t size() const { return static_cast<int64_t>(slot_of_.size()); }
  // S: 1 while exact.
  int64_t pages_per_block() const { return int64_t{1} << sample_shift_; }

 private:
  // Whether `hash` is in the sample: the top sample_shift_ bits of its Fibonacci product are
  // zero (independent of the bits the map hashes on; spread for any hash, a test's small
  // numbers too).
  bool sampled(BlockHash hash) const {
    return sample_shift_ == 0 || ((hash * 0x9E3779B97F4A7C15ULL) >> (64 - sample_shift_)) == 0;
  }

  int64_t capacity_ = 0;
  int sample_shift_ = 0;
  // ring_[k] is the hash recorded in slot k; slot_of_ maps a remembered hash to its slot.
  // A slot is overwritten when the ring comes round: the hash it held is forgotten then,
  // unless it was taken or recorded again (its slot has moved on).
  std::vector<BlockHash> ring_;
  absl::flat_hash_map<BlockHash, uint32_t> slot_of_;
  size_t next_ = 0;
};

}  // namespace strata
