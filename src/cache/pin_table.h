// The pin table: every external pin on a cached block, keyed by block hash.
//
// Contract. A block has counted hard pins (no expiry) and any number of soft pins, each a
// record of its own: TTL, priority and expiry (expiry_ms = the time it was made or last
// hit + its own ttl_ms). The table only records pins and answers questions; it knows
// nothing of nodes. The RadixTree asks it, then applies the resulting change of a block's
// pin count to its nodes (pin_counts, pin_ref, soft_pinned_blocks), so the table is
// testable on its own.
//
// Rules.
//  - unpin_one() removes the block's hard pin first; with no hard pin, the soft pin of
//    the highest priority (ties: the longest TTL, then the oldest). So an operator's
//    unpin removes the operator's pin, and a client's shorter, lower pin on the same
//    block then lapses on its own TTL, never on the operator's.
//  - refresh() (a hit on the block) sets each soft pin's expiry to now + its own TTL.
//  - expire_one() drops one soft pin whose own expiry passed, earliest first.
//  - A block's priority is the max over its remaining soft pins (PinPriority() when it
//    has none; a hard pin carries no priority). release_order() is the no-deadlock
//    rule's choice: blocks with soft pins only first, then those with a hard pin; within
//    each, lowest priority first, then least recently used.
//
// Bounds: one record per pinned block (the tree refuses pins on unknown blocks and the
// engine's pin budget bounds blocks); one entry per soft pin.
// Thread: not thread-safe; the tree's owner thread (the scheduler) calls it.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <tuple>
#include <vector>

#include <absl/container/flat_hash_map.h>

#include "cache/block_hash.h"
#include "cache/pin_priority.h"
#include "common/result.h"

namespace strata {

struct PinOptions {
  int64_t ttl_ms = 0;    // 0: a hard pin (no expiry); > 0: a soft pin, expires unless hit again
  PinPriority priority;  // soft pins: the no-deadlock rule releases lower priorities first
};

// What a removal did to one block, for the tree to mirror.
struct PinChange {
  BlockHash hash = 0;
  uint32_t pins_removed = 0;  // pins (hard + soft) taken off the block
  bool soft_cleared = false;  // the block's last soft pin went
};

class PinTable {
 public:
  // Adds one pin to `hash`: a soft one expiring at now_ms + ttl_ms when ttl_ms > 0, else
  // a hard one. Returns true when the block had no soft pin before and has one now.
  bool pin(BlockHash hash, const PinOptions& options, int64_t now_ms);
  // Removes one pin (see the rules above). pins_removed is 0 when the block had none.
  PinChange unpin_one(BlockHash hash);
  // Removes every pin of the block.
  PinChange release_all(BlockHash hash);
  // A hit on the block: each soft pin's expiry becomes now_ms + its own TTL.
  void refresh(BlockHash hash, int64_t now_ms);
  // Drops the soft pin that expires first, if its expiry is at or before now_ms.
  std::optional<PinChange> expire_one(int64_t now_ms);
  // Drops every record.
  void clear();

  uint32_t count(BlockHash hash) const;  // hard + soft pins
  uint32_t hard_count(BlockHash hash) const;
  uint32_t soft_count(BlockHash hash) const;
  // Max over the block's soft pins; PinPriority() when it has none.
  PinPriority priority(BlockHash hash) const;
  // The longest TTL among the block's soft pins, in ms; 0 when it has none.
  int64_t max_soft_ttl_ms(BlockHash hash) const;
  int64_t pinned_blocks() const { return static_cast<int64_t>(records_.size()); }
  int64_t soft_pinned_blocks() const { return soft_pinned_blocks_; }
  // Blocks with a soft pin whose priority (the max over its soft pins) is at most
  // `priority`. A scan of the records.
  int64_t soft_pinned_blocks_at_most(PinPriority priority) const;

  // A pinned block and when the tree last used it (its node's last_access_tick).
  struct Candidate {
    BlockHash hash = 0;
    uint64_t last_access_tick = 0;
  };
  // The no-deadlock rule: `candidates` (pinned blocks) in the order their pins are to be
  // released. Stable: equal keys keep their given order.
  std::vector<BlockHash> release_order(std::span<const Candidate> candidates) const;

  // Recomputes the derived state (soft block count, expiry order) and compares.
  Status check() const;

 private:
  struct SoftPin {
    int64_t ttl_ms = 0;
    int64_t expiry_ms = 0;
    PinPriority priority;
    uint64_t seq = 0;  // identifies the pin in the expiry order; smaller is older
  };
  struct Record {
    uint32_t hard = 0;
    std::vector<SoftPin> soft;
  };
  using ExpiryKey = std::tuple<int64_t, BlockHash, uint64_t>;  // (expiry_ms, hash, seq)

  // Removes soft pin `at` of `rec` (the record of `hash`); erases an emptied record.
  PinChange remove_soft(BlockHash hash, Record& rec, size_t at);

  absl::flat_hash_map<BlockHash, Record> records_;  // only blocks with at least one pin
  std::set<ExpiryKey> expiry_;                      // every soft pin, earliest first
  uint64_t next_seq_ = 0;
  int64_t soft_pinned_blocks_ = 0;  // records with at least one soft pin
};

}  // namespace strata
