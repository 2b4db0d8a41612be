// Device eviction (evict, evict_blocks, flush, reset) and the glue to the eviction policy.
//
// Contract: the tree decides membership of the evictable sets (update_evictable,
// update_host_evictable) and keeps in_evictable_set / in_host_evictable_set and the
// evictable page counters in step (place_in_set, for either set); the policy
// (eviction_policy.h) only orders the sets. A node leaves the tree only through
// remove_leaf(), which frees its pages in every tier.
#include "cache/radix_tree.h"

#include <functional>
#include <limits>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/check.h"

namespace strata {

RadixTree::EvictionScope::EvictionScope(RadixTree& tree, EvictReason reason)
    : tree_(tree), outer_(tree.eviction_scope_) {
  tree.eviction_scope_ = outer_ == EvictReason::kOperator ? EvictReason::kOperator : reason;
}

void RadixTree::update_sets(RadixNode* node) {
  update_evictable(node);
  update_host_evictable(node);
}

void RadixTree::leave_sets(RadixNode* node) {
  place_in_set(node, EvictionSet::kDevice, false);
  place_in_set(node, EvictionSet::kHostOnly, false);
}

bool RadixTree::belongs_in_evictable(const RadixNode* node) const {
  // With a host tier a pinned node may leave the device (it is demoted, never dropped).
  // The children's scan (is_device_leaf) last: a pinned or locked node needs none.
  return node != root_.get() && node->on_device() && node->lock_ref == 0 && node->io_ref == 0 &&
         (hierarchical() || !node->is_protected()) && is_device_leaf(node);
}

bool RadixTree::belongs_in_host_evictable(const RadixNode* node) const {
  return node != root_.get() && node->on_host() && !node->has_device_pages() && node->is_leaf() &&
         !node->is_protected() && node->io_ref == 0;
}

void RadixTree::update_evictable(RadixNode* node) {
  place_in_set(node, EvictionSet::kDevice, belongs_in_evictable(node));
}

void RadixTree::update_host_evictable(RadixNode* node) {
  place_in_set(node, EvictionSet::kHostOnly, belongs_in_host_evictable(node));
}

void RadixTree::place_in_set(RadixNode* node, EvictionSet set, bool member) {
  const bool device = set == EvictionSet::kDevice;
  bool& in_set = device ? node->in_evictable_set : node->in_host_evictable_set;
  if (in_set == member) return;
  int64_t& pages = device ? stats_.evictable_pages : stats_.host_evictable_pages;
  if (member) {
    eviction_->insert(set, node);
    pages += node->num_pages();
  } else {
    eviction_->erase(set, node);
    pages -= node->num_pages();
  }
  in_set = member;
}

int32_t RadixTree::remove_leaf(RadixNode* leaf) {
  STRATA_CHECK(leaf != root_.get() && leaf->is_leaf() && !leaf->is_protected() &&
               leaf->io_ref == 0);
  leave_sets(leaf);
  const Acct before = acct(leaf);
  const int32_t n = leaf->has_device_pages() ? leaf->num_pages() : 0;
  const bool had_host = leaf->has_host_pages();
  if (n > 0) device_pages_->free(leaf->device_pages);
  if (had_host) {
    host_pages_->free(leaf->host_pages);
    stats_.host_evicted_pages_total += static_cast<uint64_t>(leaf->num_pages());
  }
  // Its entries (only the first, when the rest was never indexed) go now, or at the end of
  // the batch.
  index_.release(leaf, unindex_batch_);
  if (!unindex_batch_open_) {
    index_.erase(unindex_batch_);
    unindex_batch_.clear();
  }
  if (eviction_scope_ == EvictReason::kRoom) evicted_.record(leaf->hashes);
  if (n > 0 && had_host) emit(BlockRemoved{leaf->hashes, Medium::kDevice});
  // The leaf is destroyed below: its hash vector moves into the last event.
  if (events_ != nullptr) {
    emit(BlockRemoved{std::move(leaf->hashes), had_host ? Medium::kHost : Medium::kDevice});
  }
  apply(before, Acct{});
  --stats_.num_nodes;
  stats_.evicted_pages_total += static_cast<uint64_t>(n);
  RadixNode* parent = leaf->parent;
  auto& siblings = parent->children;
  const uint32_t at = leaf->index_in_parent;
  STRATA_CHECK_MSG(at < siblings.size() && siblings[at].get() == leaf, "stale index_in_parent");
  std::unique_ptr<RadixNode> owned = std::move(siblings[at]);
  if (at + 1 != siblings.size()) {
    siblings[at] = std::move(siblings.back());
    siblings[at]->index_in_parent = at;
  }
  siblings.pop_back();
  recycle_node(std::move(owned));  // `leaf` is gone from here on
  update_sets(parent);
  restore_pin_tail(parent);
  try_demote(parent);
  return n;
}

EvictResult RadixTree::evict(int32_t num_pages, EvictReason reason) {
  EvictResult result;
  const bool batch = begin_unindex_batch();
  const EvictionScope scope(*this, reason);
  std::unordered_set<const RadixNode*> skipped;  // pinned nodes with no host room
  while (result.evicted_pages < num_pages) {
    RadixNode* leaf = skipped.empty()
                          ? eviction_->victim(EvictionSet::kDevice)
                          : eviction_->victim(EvictionSet::kDevice, [&](const RadixNode* n) {
                              return skipped.contains(n);
                            });
    if (leaf == nullptr) break;
    const int32_t np = leaf->num_pages();
    if (leaf->on_host()) {
      demote(leaf);
      result.evicted_pages += np;
    } else if (hierarchical() && needs_backup_to_leave(leaf)) {
      // Marked first: a split while making host room copies the mark to both parts.
      leaf->demote_pending = true;
      if (start_backup(leaf)) {
        result.pending_pages += np;
      } else if (leaf->pin_ref > 0 || leaf->host_ref > 0 || !leaf->is_leaf()) {
        leaf->demote_pending = false;
        skipped.insert(leaf);
        continue;
      } else {
        leaf->demote_pending = false;
        result.evicted_pages += remove_leaf(leaf);  // write_back with a full host pool
      }
    } else {
      result.evicted_pages += remove_leaf(leaf);
    }
    ++result.evicted_nodes;
  }
  end_unindex_batch(batch);
  return result;
}

void RadixTree::evict_subtree(RadixNode* top) {
  // Post-order: children before parents, so a node is visited after its subtree was
  // emptied as far as protection allows. Only visited nodes are ever deleted, and a
  // split (restore_pin_tail) keeps the original object, so pointers stay valid.
  std::vector<RadixNode*> order;
  std::vector<std::pair<RadixNode*, size_t>> stack{{top, 0}};
  while (!stack.empty()) {
    auto& [n, next] = stack.back();
    if (next < n->children.size()) {
      RadixNode* c = n->children[next++].get();
      stack.emplace_back(c, 0);
    } else {
      order.push_back(n);
      stack.pop_back();
    }
  }
  for (RadixNode* n : order) {
    if (n->is_leaf() && !n->is_protected() && n->io_ref == 0) remove_leaf(n);
  }
}

EvictBlocksResult RadixTree::evict_blocks(std::span<const BlockHash> hashes, bool descendants) {
  EvictBlocksResult result;
  const int64_t before = stats_.cached_pages;
  std::vector<BlockHash> known;
  for (BlockHash h : hashes) {
    if (index_.contains(h)) {
      known.push_back(h);
    } else {
      ++result.unknown;
    }
  }
  if (descendants) {
    for (BlockHash h : known) {
      const auto it = index_.find(h);
      if (it == index_.end()) continue;  // already gone with an earlier block's subtree
      Loc loc = it->second;
      RadixNode* top = loc.node;
      if (loc.offset > 0) split(top, loc.offset);  // `top` keeps the block and the rest
      evict_subtree(top);
    }
  } else {
    // Deepest first, so that a chain of requested blocks empties from its leaf upward.
    std::vector<std::pair<int64_t, BlockHash>> by_depth;
    for (BlockHash h : known) {
      const Loc loc = index_.at(h);
      int64_t depth = loc.offset;
      for (const RadixNode* n = loc.node->parent; n != root_.get(); n = n->parent) {
        depth += n->num_pages();
      }
      by_depth.emplace_back(depth, h);
    }
    std::sort(by_depth.begin(), by_depth.end(), std::greater<>());
    const std::unordered_set<BlockHash> requested(known.begin(), known.end());
    for (const auto& [depth, h] : by_depth) {
      const auto it = index_.find(h);
      if (it == index_.end()) continue;
      RadixNode* node = it->second.node;
      if (!node->is_leaf() || node->is_protected() || node->io_ref > 0) continue;
      // The requested run at the node's tail must reach this block.
      int32_t m = node->num_pages();
      while (m > 0 && requested.contains(node->hashes[static_cast<size_t>(m - 1)])) --m;
      if (m > it->second.offset) continue;
      if (m > 0) split(node, m);
      remove_leaf(node);
    }
  }
  // Classify what is left of the request.
  for (BlockHash h : known) {
    const auto it = index_.find(h);
    if (it == index_.end()) continue;
    const RadixNode* n = it->second.node;
    if (n->lock_ref > 0 || n->io_ref > 0) {
      ++result.skipped_locked;
    } else if (n->pin_ref > 0) {
      ++result.skipped_pinned;
    } else {
      ++result.skipped_has_children;
    }
  }
  result.evicted_blocks = static_cast<int32_t>(before - stats_.cached_pages);
  return result;
}

FlushResult RadixTree::flush() {
  FlushResult result;
  // An operator's flush: what it evicts (through evict() and evict_host() too) is not
  // recorded as evicted for want of room.
  const EvictionScope scope(*this, EvictReason::kOperator);
  if (!hierarchical()) {
    result.evicted_pages =
        evict(std::numeric_limits<int32_t>::max(), EvictReason::kOperator).evicted_pages;
  } else {
    // Children first: drop every unprotected leaf from all tiers; what pins or sessions
    // protect leaves the device for the host (backed up first where needed).
    std::vector<RadixNode*> order;
    std::vector<std::pair<RadixNode*, size_t>> stack{{root_.get(), 0}};
    while (!stack.empty()) {
      auto& [n, next] = stack.back();
      if (next < n->children.size()) {
        RadixNode* c = n->children[next++].get();
        stack.emplace_back(c, 0);
      } else {
        if (n != root_.get()) order.push_back(n);
        stack.pop_back();
      }
    }
    const int64_t device_before = stats_.cached_pages;
    const uint64_t host_before = stats_.host_evicted_pages_total;
    int32_t pending = 0;
    for (RadixNode* n : order) {
      if (n->is_leaf() && !n->is_protected() && n->io_ref == 0) remove_leaf(n);
    }
    // What is left is protected (or busy). Collect it afresh: removals above split nodes.
    // Host eviction for the backups below only removes host-only nodes, never these.
    std::vector<RadixNode*> keep;
    stack.assign(1, {root_.get(), 0});
    while (!stack.empty()) {
      auto& [n, next] = stack.back();
      if (next < n->children.size()) {
        RadixNode* c = n->children[next++].get();
        stack.emplace_back(c, 0);
      } else {
        if (n != root_.get() && n->has_device_pages() && !n->loading && n->lock_ref == 0) {
          keep.push_back(n);
        }
        stack.pop_back();
      }
    }
    for (RadixNode* n : keep) {
      if (!n->has_device_pages()) continue;  // already demoted with a child above
      n->demote_pending = true;
      if (!n->has_host_pages() && start_backup(n)) pending += n->num_pages();
      try_demote(n);
    }
    result.evicted_pages = static_cast<int32_t>(device_before - stats_.cached_pages) + pending;
    result.evicted_host_pages = static_cast<int32_t>(stats_.host_evicted_pages_total - host_before);
  }
  result.pinned_preserved = static_cast<int32_t>(pins_.pinned_blocks());
  std::vector<const RadixNode*> stack{root_.get()};
  while (!stack.empty()) {
    const RadixNode* n = stack.back();
    stack.pop_back();
    if (n != root_.get() && n->lock_ref > 0) result.locked_skipped += n->num_pages();
    for (const auto& c : n->children) stack.push_back(c.get());
  }
  return result;
}

Status RadixTree::reset() {
  if (stats_.outstanding_locks > 0) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "reset refused: " + std::to_string(stats_.outstanding_locks) +
                          " lock receipts are outstanding (requests are running)");
  }
  if (io_pending()) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "reset refused: tier transfers are in flight");
  }
  std::vector<PageId> pages;
  collect_device_pages(pages);
  device_pages_->free(pages);
  if (hierarchical()) {
    pages.clear();
    collect_host_pages(pages);
    host_pages_->free(pages);
  }
  root_->children.clear();
  index_.clear();
  eviction_->clear();
  stats_.host_cached_pages = 0;
  stats_.host_only_pages = 0;
  stats_.host_evictable_pages = 0;
  stats_.host_protected_pages = 0;
  stats_.stored_pages = 0;
  stats_.io_pending_nodes = 0;
  pins_.clear();
  evicted_.clear();
  recomputed_recent_ = 0.0;
  stats_.num_nodes = 0;
  stats_.cached_pages = 0;
  stats_.protected_pages = 0;
  backup_bound_pages_ = 0;
  stats_.evictable_pages = 0;
  stats_.locked_nodes = 0;
  emit(AllBlocksCleared{});
  return {};
}

}  // namespace strata
