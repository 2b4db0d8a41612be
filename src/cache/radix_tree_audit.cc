// The audit: check_invariants() recomputes every derived quantity from the nodes alone
// (hash index, chained hashes, lock/pin/host refs, pin mirrors against the pin table,
// evictable sets against the policy, tier states and counters) and reports the first
// violation. Read-only; O(tree) time; for tests and debug endpoints, never the hot path.
#include "cache/radix_tree.h"

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace strata {

Status RadixTree::check_invariants() const {
  auto fail = [](const std::string& what) { return make_error(ErrorCode::kInternal, what); };
  const int32_t ps = options_.page_size;
  std::unordered_map<const RadixNode*, int32_t> direct_locks;
  int64_t live = 0;
  for (const ReceiptSlot& s : receipts_) {
    if (s.live) {
      ++live;
      if (s.node != root_.get()) ++direct_locks[s.node];
    }
  }
  if (live != stats_.outstanding_locks) return fail("outstanding lock count drifted");

  int64_t nodes = 0, pages = 0, evictable_pages = 0, pinned = 0, locked = 0;
  int64_t evictable_nodes = 0, host_evictable_pages = 0, host_evictable_nodes = 0;
  Acct acct_sum;
  // Post-order so that children's refs are known when checking a parent.
  std::vector<std::pair<const RadixNode*, size_t>> stack{{root_.get(), 0}};
  std::unordered_map<const RadixNode*, std::pair<int32_t, int32_t>> sub;  // lock, pin sums
  while (!stack.empty()) {
    auto& [n, next] = stack.back();
    if (next < n->children.size()) {
      const RadixNode* c = n->children[next++].get();
      if (c->parent != n) return fail(describe(c) + ": wrong parent pointer");
      if (c->index_in_parent != next - 1) return fail(describe(c) + ": wrong index_in_parent");
      stack.emplace_back(c, 0);
      continue;
    }
    const RadixNode* node = n;
    stack.pop_back();
    int32_t child_locks = 0, child_pins = 0;
    for (const auto& c : node->children) {
      child_locks += sub[c.get()].first;
      child_pins += sub[c.get()].second;
    }
    if (node == root_.get()) break;
    const auto np = static_cast<size_t>(node->num_pages());
    if (np == 0) return fail(describe(node) + ": empty node");
    if (node->tokens.size() != np * static_cast<size_t>(ps) || node->pin_counts.size() != np ||
        node->device_pages.size() != np) {
      return fail(describe(node) + ": per-page arrays disagree in size");
    }
    if (!node->host_pages.empty() && node->host_pages.size() != np) {
      return fail(describe(node) + ": host page array size");
    }
    if (!node->in_storage.empty() && node->in_storage.size() != np) {
      return fail(describe(node) + ": storage flag array size");
    }
    for (size_t k = 1; k < np; ++k) {
      if ((node->device_pages[k] == kInvalidPage) != (node->device_pages[0] == kInvalidPage) ||
          (!node->host_pages.empty() &&
           (node->host_pages[k] == kInvalidPage) != (node->host_pages[0] == kInvalidPage))) {
        return fail(describe(node) + ": pages of one node in different tiers");
      }
    }
    if (!node->has_device_pages() && !node->has_host_pages()) {
      return fail(describe(node) + ": in no tier");
    }
    if (node->has_device_pages() && node->parent != root_.get() &&
        !node->parent->has_device_pages()) {
      return fail(describe(node) + ": on the device below a parent that is not");
    }
    if (!hierarchical() && (node->has_host_pages() || node->loading)) {
      return fail(describe(node) + ": host state without a host tier");
    }
    if ((node->loading || (node->has_host_pages() && !node->host_valid)) && node->io_ref <= 0) {
      return fail(describe(node) + ": a copy in flight without io_ref");
    }
    if (node->loading && node->lock_ref <= 0) return fail(describe(node) + ": loading unlocked");
    acct_sum += acct(node);
    if (belongs_in_host_evictable(node) != node->in_host_evictable_set) {
      return fail(describe(node) + ": host evictable flag wrong");
    }
    if (node->in_host_evictable_set) {
      if (!eviction_->contains(EvictionSet::kHostOnly, node)) {
        return fail(describe(node) + ": missing from the host evictable set");
      }
      host_evictable_pages += node->num_pages();
      ++host_evictable_nodes;
    }
    // Chained hashes, by the tree's hasher (with a digest chain, each block's tail too).
    if (node->chain_tails.size() != (options_.hasher.chains_digests() ? np : 0)) {
      return fail(describe(node) + ": chain tails do not match the hasher");
    }
    if (node->parent != root_.get() && !node->first_page_salt.empty()) {
      return fail(describe(node) + ": a salt below the root's children");
    }
    const std::string first_extra = options_.hasher.first_page_extra_keys(node->first_page_salt);
    ChainValue parent = last_chain(node->parent);
    for (size_t k = 0; k < np; ++k) {
      const std::string_view extra = k == 0 ? std::string_view(first_extra) : std::string_view();
      const ChainValue v = options_.hasher.hash(
          parent, std::span<const TokenId>(node->tokens).subspan(k * ps, ps), extra);
      const BlockHash h = v.hash;
      if (h != node->hashes[k] || (!node->chain_tails.empty() && v.tail != node->chain_tails[k])) {
        return fail(describe(node) + ": block hash chain broken");
      }
      parent = v;
      const auto it = index_.find(h);
      if (it == index_.end() || it->second.node != node ||
          it->second.offset != static_cast<int32_t>(k)) {
        return fail(describe(node) + ": hash index entry wrong for page " + std::to_string(k));
      }
    }
    // The node's pin mirror against the pin table.
    int32_t own = 0, soft = 0;
    for (size_t k = 0; k < np; ++k) {
      if (node->pin_counts[k] > 0) ++own;
      if (node->pin_counts[k] != pins_.count(node->hashes[k])) {
        return fail(describe(node) + ": pin count differs from the pin table's");
      }
      if (pins_.soft_count(node->hashes[k]) > 0) ++soft;
    }
    if (own != node->own_pinned_blocks) return fail(describe(node) + ": own_pinned_blocks drifted");
    if (soft != node->soft_pinned_blocks)
      return fail(describe(node) + ": soft_pinned_blocks drifted");
    const int32_t expect_lock =
        child_locks + (direct_locks.contains(node) ? direct_locks[node] : 0);
    if (expect_lock != node->lock_ref) return fail(describe(node) + ": lock_ref drifted");
    if (own + child_pins != node->pin_ref) return fail(describe(node) + ": pin_ref drifted");
    sub[node] = {node->lock_ref, node->pin_ref};
    if (node->is_leaf() && own > 0 && node->pin_counts[np - 1] == 0) {
      return fail(describe(node) + ": childless pinned node ends with an unpinned block");
    }
    if (belongs_in_evictable(node) != node->in_evictable_set)
      return fail(describe(node) + ": evictable flag wrong");
    if (node->in_evictable_set) {
      if (!eviction_->contains(EvictionSet::kDevice, node)) {
        return fail(describe(node) + ": missing from the evictable set");
      }
      evictable_pages += node->num_pages();
      ++evictable_nodes;
    }
    ++nodes;
    pages += node->num_pages();
    pinned += own;
    if (node->lock_ref > 0) ++locked;
  }
  if (nodes != stats_.num_nodes) return fail("node count drifted");
  if (acct_sum.device != stats_.cached_pages) return fail("cached page count drifted");
  if (static_cast<size_t>(pages) != index_.size()) return fail("hash index has stale entries");
  if (acct_sum.prot != stats_.protected_pages) return fail("protected page count drifted");
  if (acct_sum.bound != backup_bound_pages_) return fail("backup-bound page count drifted");
  if (acct_sum.host != stats_.host_cached_pages || acct_sum.host_only != stats_.host_only_pages ||
      acct_sum.host_prot != stats_.host_protected_pages || acct_sum.stored != stats_.stored_pages ||
      acct_sum.io != stats_.io_pending_nodes) {
    return fail("host tier counters drifted");
  }
  if (host_evictable_pages != stats_.host_evictable_pages ||
      static_cast<size_t>(host_evictable_nodes) != eviction_->size(EvictionSet::kHostOnly)) {
    return fail("host evictable set drifted");
  }
  if (evictable_pages != stats_.evictable_pages) return fail("evictable page count drifted");
  if (static_cast<size_t>(evictable_nodes) != eviction_->size(EvictionSet::kDevice))
    return fail("evictable set has stale entries");
  // Every record of the pin table names a cached, pinned block (counted above).
  if (pinned != pins_.pinned_blocks()) return fail("the pin table has stale records");
  if (locked != stats_.locked_nodes) return fail("locked node count drifted");
  if (Status s = pins_.check(); !s) return s;
  return {};
}

}  // namespace strata
