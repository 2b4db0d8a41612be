// The tree's side of pins: it asks the pin table (pin_table.h) and mirrors each change
// of a block's pin count in its node: pin_counts, own_pinned_blocks, soft_pinned_blocks,
// pin_ref on node..root, and the pin tail (a childless node with pinned blocks ends with a
// pinned block, so its unpinned tail stays evictable).
#include "cache/radix_tree.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "common/check.h"

namespace strata {

void RadixTree::add_pin_ref(RadixNode* node, int32_t delta) {
  for (RadixNode* n = node; n != root_.get(); n = n->parent) {
    // Only a change between pinned and unpinned can change the counters or the sets.
    if ((n->pin_ref > 0) == (n->pin_ref + delta > 0)) {
      n->pin_ref += delta;
      STRATA_CHECK_MSG(n->pin_ref >= 0, "pin_ref underflow at " + describe(n));
      continue;
    }
    const Acct before = acct(n);
    n->pin_ref += delta;
    STRATA_CHECK_MSG(n->pin_ref >= 0, "pin_ref underflow at " + describe(n));
    apply(before, acct(n));
    update_sets(n);
  }
}

void RadixTree::restore_pin_tail(RadixNode* node) {
  if (node == root_.get() || !node->is_leaf() || node->own_pinned_blocks == 0) return;
  int32_t last = node->num_pages() - 1;
  while (node->pin_counts[static_cast<size_t>(last)] == 0) --last;
  if (last + 1 < node->num_pages()) split(node, last + 1);
}

void RadixTree::change_pin(const Loc& loc, int32_t delta) {
  RadixNode* node = loc.node;
  uint32_t& count = node->pin_counts[static_cast<size_t>(loc.offset)];
  const int64_t updated = static_cast<int64_t>(count) + delta;
  STRATA_CHECK_MSG(updated >= 0, "pin count underflow at " + describe(node));
  const bool was = count > 0;
  count = static_cast<uint32_t>(updated);
  if (!was && count > 0) {
    ++node->own_pinned_blocks;
    add_pin_ref(node, +1);
  } else if (was && count == 0) {
    --node->own_pinned_blocks;
    add_pin_ref(node, -1);
  }
}

void RadixTree::apply_unpin(const Loc& loc, const PinChange& change) {
  if (change.pins_removed == 0) return;
  change_pin(loc, -static_cast<int32_t>(change.pins_removed));
  if (change.soft_cleared) --loc.node->soft_pinned_blocks;
}

namespace {
constexpr size_t kLookAhead = 8;  // blocks prefetched ahead of the one being worked on
}  // namespace

std::vector<RadixTree::Loc> RadixTree::locate(std::span<const BlockHash> hashes) const {
  std::vector<Loc> locs(hashes.size());
  const size_t n = hashes.size();
  for (size_t i = 0; i < std::min(n, 2 * kLookAhead); ++i) index_.prefetch(hashes[i]);
  for (size_t i = 0; i < n; ++i) {
    if (i + 2 * kLookAhead < n) index_.prefetch(hashes[i + 2 * kLookAhead]);
    const auto it = index_.find(hashes[i]);
    if (it == index_.end()) continue;
    locs[i] = it->second;
    __builtin_prefetch(locs[i].node);
  }
  return locs;
}

// Pin and unpin bodies read the block's pin count: its node's header is in the cache by then
// (locate), the count's line is loaded kLookAhead blocks early.
void RadixTree::prefetch_pin_count(const Loc& loc) {
  if (loc.node != nullptr) {
    __builtin_prefetch(loc.node->pin_counts.data() + loc.offset);
  }
}

template <typename F>
int32_t RadixTree::for_each_located(std::span<const BlockHash> hashes, F&& fn) {
  int32_t unknown = 0;
  const std::vector<Loc> locs = locate(hashes);
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (i + kLookAhead < locs.size()) prefetch_pin_count(locs[i + kLookAhead]);
    if (locs[i].node == nullptr) {
      ++unknown;
      continue;
    }
    fn(hashes[i], locs[i]);
  }
  return unknown;
}

PinResult RadixTree::pin(std::span<const BlockHash> hashes, PinOptions options) {
  PinResult result;
  const int64_t now_ms = clock_->now_ms();
  std::vector<RadixNode*> touched;
  result.unknown = for_each_located(hashes, [&](BlockHash h, const Loc& loc) {
    if (pins_.pin(h, options, now_ms)) ++loc.node->soft_pinned_blocks;
    change_pin(loc, +1);
    ++result.pinned;
    touched.push_back(loc.node);
  });
  // Splits never delete node objects, so the pointers stay valid.
  for (RadixNode* n : touched) restore_pin_tail(n);
  return result;
}

UnpinResult RadixTree::unpin(std::span<const BlockHash> hashes) {
  UnpinResult result;
  std::vector<RadixNode*> touched;
  result.unknown = for_each_located(hashes, [&](BlockHash h, const Loc& loc) {
    if (loc.node->pin_counts[static_cast<size_t>(loc.offset)] == 0) {
      ++result.not_pinned;  // the mirror answers without a table lookup
      return;
    }
    apply_unpin(loc, pins_.unpin_one(h));
    ++result.unpinned;
    touched.push_back(loc.node);
  });
  for (RadixNode* n : touched) restore_pin_tail(n);
  return result;
}

int32_t RadixTree::expire_soft_pins() {
  const int64_t now_ms = clock_->now_ms();
  int32_t expired = 0;
  while (const std::optional<PinChange> change = pins_.expire_one(now_ms)) {
    const Loc loc = index_.at(change->hash);
    apply_unpin(loc, *change);
    restore_pin_tail(loc.node);
    expired += static_cast<int32_t>(change->pins_removed);
  }
  stats_.expired_pins_total += static_cast<uint64_t>(expired);
  return expired;
}

std::vector<BlockHash> RadixTree::release_pins_for(int64_t pages) {
  // Every pinned block with its node's recency, in the tree's walk order (the pin table
  // orders them stably).
  // With a host tier a pin keeps a block on the host, not on the device: only the pins of
  // device pages without a host copy can be in the way, and only while the host cannot
  // take their backups (unevictable_pages() counts them).
  std::vector<PinTable::Candidate> candidates;
  std::vector<const RadixNode*> stack{root_.get()};
  while (!stack.empty()) {
    const RadixNode* n = stack.back();
    stack.pop_back();
    for (const auto& c : n->children) stack.push_back(c.get());
    if (n->own_pinned_blocks == 0) continue;
    if (hierarchical() && (n->has_host_pages() || !n->has_device_pages())) continue;
    for (size_t k = 0; k < n->hashes.size(); ++k) {
      if (n->pin_counts[k] > 0) candidates.push_back({n->hashes[k], n->last_access_tick});
    }
  }
  std::vector<BlockHash> released;
  const int64_t start = unevictable_pages();
  for (BlockHash h : pins_.release_order(candidates)) {
    if (start - unevictable_pages() >= pages) break;
    const auto it = index_.find(h);
    if (it == index_.end()) continue;
    const Loc loc = it->second;
    apply_unpin(loc, pins_.release_all(h));
    restore_pin_tail(loc.node);
    released.push_back(h);
  }
  return released;
}

int64_t RadixTree::soft_pinned_blocks_at_most(PinPriority priority) const {
  return pins_.soft_pinned_blocks_at_most(priority);
}

uint32_t RadixTree::pin_count(BlockHash hash) const {
  const auto it = index_.find(hash);
  if (it == index_.end()) return 0;
  return it->second.node->pin_counts[static_cast<size_t>(it->second.offset)];
}

bool RadixTree::operator_pinned_prefix(std::span<const TokenId> tokens,
                                       std::string_view cache_salt) const {
  if (pins_.pinned_blocks() == 0 || static_cast<int32_t>(tokens.size()) < page_size()) return false;
  const std::vector<BlockHash> first =
      block_hashes_of(tokens.first(static_cast<size_t>(page_size())), cache_salt);
  if (first.empty()) return false;
  const BlockHash h = first.front();
  if (pins_.hard_count(h) > 0) return true;
  return pins_.soft_count(h) > 0 && pins_.priority(h) > PinPriority::lowest();
}

}  // namespace strata
