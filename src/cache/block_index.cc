// The hash index (block_index.h): deferred indexing, and every run over many entries
// prefetched ahead of use (an entry is almost always a cache miss; in a run the misses
// overlap instead of queuing).
#include "cache/block_index.h"

#include <algorithm>
#include <vector>

#include "common/check.h"

namespace strata {
namespace {

// Entries prefetched ahead of the one being used: enough misses in flight to hide the
// memory latency, few enough that the lines are still there when their turn comes.
constexpr size_t kPrefetchAhead = 16;

// Calls use(k) for k in [0, n), the entry of hash_at(k + kPrefetchAhead) prefetched first.
template <typename HashAt, typename Use>
void prefetched_run(const BlockIndex::Map& map, size_t n, HashAt hash_at, Use use) {
  for (size_t k = 0; k < std::min(n, kPrefetchAhead); ++k) map.prefetch(hash_at(k));
  for (size_t k = 0; k < n; ++k) {
    if (k + kPrefetchAhead < n) map.prefetch(hash_at(k + kPrefetchAhead));
    use(k);
  }
}

}  // namespace

bool BlockIndex::add(RadixNode* node) {
  STRATA_CHECK(!node->hashes.empty());
  if (!map_.try_emplace(node->hashes[0], BlockLoc{node, 0}).second) return false;
  if (node->hashes.size() > 1) deferred_.insert(node);
  return true;
}

void BlockIndex::split(RadixNode* upper, RadixNode* lower) {
  // Re-points the entry of `hash` to `to` if it names `lower`.
  const auto repoint = [&](BlockHash hash, BlockLoc to) {
    const auto it = map_.find(hash);
    if (it != map_.end() && it->second.node == lower) it->second = to;
  };
  if (deferred_.erase(lower) != 0) {
    // Only the old first block is indexed, and it is upper's first now. Lower's new first
    // block is indexed as a new node's is; both halves keep the rest deferred.
    repoint(upper->hashes[0], BlockLoc{upper, 0});
    map_.try_emplace(lower->hashes[0], BlockLoc{lower, 0});
    if (upper->hashes.size() > 1) deferred_.insert(upper);
    if (lower->hashes.size() > 1) deferred_.insert(lower);
    return;
  }
  for (RadixNode* half : {upper, lower}) {
    const std::vector<BlockHash>& hs = half->hashes;
    prefetched_run(
        map_, hs.size(), [&](size_t k) { return hs[k]; },
        [&](size_t k) {
          repoint(hs[k], BlockLoc{half, static_cast<int32_t>(k)});
        });
  }
}

void BlockIndex::release(RadixNode* node, std::vector<Owned>& out) {
  // A deferred node holds its first entry only.
  const size_t n = deferred_.erase(node) != 0 ? 1 : node->hashes.size();
  for (size_t k = 0; k < n; ++k) out.push_back(Owned{node->hashes[k], node});
}

void BlockIndex::erase(std::span<const Owned> entries) {
  prefetched_run(
      map_, entries.size(), [&](size_t k) { return entries[k].hash; },
      [&](size_t k) {
        const auto it = map_.find(entries[k].hash);
        if (it != map_.end() && it->second.node == entries[k].node) map_.erase(it);
      });
}

void BlockIndex::clear() {
  map_.clear();
  deferred_.clear();
}

void BlockIndex::settle_deferred() const {
  const std::vector<RadixNode*> nodes(deferred_.begin(), deferred_.end());
  deferred_.clear();
  // One run over blocks 1.. of every node: a cursor inserts, another prefetches ahead.
  struct Cursor {
    size_t node = 0;
    size_t block = 0;
  };
  const auto valid = [&](const Cursor& c) { return c.node < nodes.size(); };
  const auto advance = [&](Cursor& c) {
    ++c.block;
    while (valid(c) && c.block >= nodes[c.node]->hashes.size()) {
      ++c.node;
      c.block = 1;
    }
  };
  const auto hash_at = [&](const Cursor& c) { return nodes[c.node]->hashes[c.block]; };
  Cursor use;
  advance(use);  // to block 1 of the first node that has one
  Cursor ahead = use;
  for (size_t k = 0; k < kPrefetchAhead && valid(ahead); ++k, advance(ahead)) {
    map_.prefetch(hash_at(ahead));
  }
  for (; valid(use); advance(use)) {
    if (valid(ahead)) {
      map_.prefetch(hash_at(ahead));
      advance(ahead);
    }
    // An entry the table has already is a collision: the block indexed first keeps it.
    map_.try_emplace(hash_at(use), BlockLoc{nodes[use.node], static_cast<int32_t>(use.block)});
  }
}

}  // namespace strata
