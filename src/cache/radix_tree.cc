#include "cache/radix_tree.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <unordered_set>
#include <utility>

#include "common/check.h"

namespace strata {
namespace {

template <typename T>
void move_prefix(std::vector<T>& from, std::vector<T>& to, size_t n) {
  if (from.empty()) return;  // an absent tier stays absent in both halves
  to.assign(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(n));
  from.erase(from.begin(), from.begin() + static_cast<std::ptrdiff_t>(n));
}

bool same_tokens(const TokenId* a, const TokenId* b, int32_t n) {
  return std::memcmp(a, b, sizeof(TokenId) * static_cast<size_t>(n)) == 0;
}

std::string describe(const RadixNode* n) {
  return "node " + std::to_string(n->id);
}

}  // namespace

Result<WritePolicy> parse_write_policy(std::string_view name) {
  if (name == "write_through") return WritePolicy::kWriteThrough;
  if (name == "write_through_selective") return WritePolicy::kWriteThroughSelective;
  if (name == "write_back") return WritePolicy::kWriteBack;
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown write policy '" + std::string(name) +
                        "' (write_through, write_through_selective or write_back)");
}

std::string_view write_policy_name(WritePolicy policy) {
  switch (policy) {
    case WritePolicy::kWriteThrough:
      return "write_through";
    case WritePolicy::kWriteThroughSelective:
      return "write_through_selective";
    case WritePolicy::kWriteBack:
      return "write_back";
  }
  return "write_through";
}

RadixTree::RadixTree(RadixTreeOptions options, PageAllocator* device_pages, KvEventSink* events,
                     const Clock* clock, PageAllocator* host_pages)
    : options_(options),
      device_pages_(device_pages),
      host_pages_(host_pages),
      events_(events),
      clock_(clock != nullptr ? clock : &SteadyClock::instance()),
      root_(std::make_unique<RadixNode>()) {
  STRATA_CHECK_MSG(options_.page_size >= 1 && options_.page_size <= 4096,
                   "page_size must be in [1, 4096]");
  STRATA_CHECK(device_pages_ != nullptr);
  STRATA_CHECK_MSG(options_.write_through_threshold >= 1, "write_through_threshold must be >= 1");
  root_->id = 0;
}

// What one node contributes to the tree's counters, from its current state. Every change
// of a node's state is bracketed by acct() before and apply(before, acct()) after, so the
// counters can never drift from the states (check_invariants recomputes them).
RadixTree::Acct RadixTree::acct(const RadixNode* n) const {
  Acct a;
  if (n == root_.get()) return a;
  const int64_t np = n->num_pages();
  const bool dev = n->has_device_pages();
  const bool host = n->has_host_pages();
  if (dev) a.device = np;
  if (host) a.host = np;
  if (host && !dev) a.host_only = np;
  // Device pages that eviction cannot free: what requests hold or copies use, and pins
  // when there is no host tier to demote them to.
  if (dev && (n->lock_ref > 0 || n->io_ref > 0 || n->loading ||
              (!hierarchical() && (n->pin_ref > 0 || n->host_ref > 0)))) {
    a.prot = np;
  }
  if (host && (n->pin_ref > 0 || n->host_ref > 0)) a.host_prot = np;
  for (uint8_t f : n->in_storage) a.stored += f != 0 ? 1 : 0;
  a.io = n->io_ref > 0 ? 1 : 0;
  return a;
}

void RadixTree::apply(const Acct& before, const Acct& after) {
  cached_pages_ += after.device - before.device;
  host_cached_pages_ += after.host - before.host;
  host_only_pages_ += after.host_only - before.host_only;
  protected_pages_ += after.prot - before.prot;
  host_protected_pages_ += after.host_prot - before.host_prot;
  stored_pages_ += after.stored - before.stored;
  io_pending_nodes_ += after.io - before.io;
}

void RadixTree::update_sets(RadixNode* node) {
  update_evictable(node);
  update_host_evictable(node);
}

bool RadixTree::is_device_leaf(const RadixNode* node) const {
  for (const auto& c : node->children) {
    if (c->has_device_pages()) return false;
  }
  return true;
}

void RadixTree::erase_host_evictable(RadixNode* node) {
  if (!node->in_host_evictable_set) return;
  host_evictable_.erase(EvictKey{node->last_access_tick, node->id, node});
  node->in_host_evictable_set = false;
  host_evictable_pages_ -= node->num_pages();
}

void RadixTree::update_host_evictable(RadixNode* node) {
  const bool should = node != root_.get() && node->on_host() && !node->has_device_pages() &&
                      node->is_leaf() && !node->is_protected() && node->io_ref == 0;
  if (should && !node->in_host_evictable_set) {
    host_evictable_.insert(EvictKey{node->last_access_tick, node->id, node});
    node->in_host_evictable_set = true;
    host_evictable_pages_ += node->num_pages();
  } else if (!should) {
    erase_host_evictable(node);
  }
}

void RadixTree::emit_stored(const RadixNode* node, Medium medium) {
  if (events_ == nullptr) return;
  BlockStored ev;
  ev.block_hashes = node->hashes;
  if (node->parent != root_.get()) ev.parent_block_hash = node->parent->hashes.back();
  ev.token_ids = node->tokens;
  ev.block_size = options_.page_size;
  ev.medium = medium;
  emit(std::move(ev));
}

RadixTree::~RadixTree() = default;

void RadixTree::emit(KvEvent event) {
  if (events_ != nullptr) events_->on_event(std::move(event));
}

BlockHash RadixTree::last_hash(const RadixNode* node) const {
  return node == root_.get() ? kRootParentHash : node->hashes.back();
}

RadixNode* RadixTree::find_child(const RadixNode* parent, std::span<const TokenId> first_page,
                                 std::string_view extra) const {
  const BlockHash h =
      hash_block(last_hash(parent), first_page, parent == root_.get() ? extra : std::string_view());
  const auto it = index_.find(h);
  if (it == index_.end()) return nullptr;
  const Loc& loc = it->second;
  if (loc.offset != 0 || loc.node->parent != parent) return nullptr;
  // Guard against a 64-bit collision: the tokens decide.
  if (!same_tokens(loc.node->tokens.data(), first_page.data(), options_.page_size)) return nullptr;
  return loc.node;
}

void RadixTree::erase_evictable(RadixNode* node) {
  if (!node->in_evictable_set) return;
  evictable_.erase(EvictKey{node->last_access_tick, node->id, node});
  node->in_evictable_set = false;
  evictable_pages_ -= node->num_pages();
}

void RadixTree::update_evictable(RadixNode* node) {
  // With a host tier a pinned node may leave the device (it is demoted, never dropped).
  const bool should = node != root_.get() && node->on_device() && is_device_leaf(node) &&
                      node->lock_ref == 0 && node->io_ref == 0 &&
                      (hierarchical() || !node->is_protected());
  if (should && !node->in_evictable_set) {
    evictable_.insert(EvictKey{node->last_access_tick, node->id, node});
    node->in_evictable_set = true;
    evictable_pages_ += node->num_pages();
  } else if (!should) {
    erase_evictable(node);
  }
}

void RadixTree::touch(RadixNode* node, uint64_t tick, int64_t now_ms) {
  const bool was_in = node->in_evictable_set;
  const bool was_in_host = node->in_host_evictable_set;
  erase_evictable(node);
  erase_host_evictable(node);
  node->last_access_tick = tick;
  node->last_access_ms = now_ms;
  if (was_in) update_evictable(node);
  if (was_in_host) update_host_evictable(node);
}

void RadixTree::add_lock_ref(RadixNode* node, int32_t delta) {
  for (RadixNode* n = node; n != root_.get(); n = n->parent) {
    const Acct before = acct(n);
    const bool was_locked = n->lock_ref > 0;
    n->lock_ref += delta;
    STRATA_CHECK_MSG(n->lock_ref >= 0, "lock_ref underflow at " + describe(n));
    if (was_locked != (n->lock_ref > 0)) locked_nodes_ += n->lock_ref > 0 ? 1 : -1;
    apply(before, acct(n));
    update_sets(n);
    if (n->lock_ref == 0) try_demote(n);
  }
}

void RadixTree::add_pin_ref(RadixNode* node, int32_t delta) {
  for (RadixNode* n = node; n != root_.get(); n = n->parent) {
    const Acct before = acct(n);
    n->pin_ref += delta;
    STRATA_CHECK_MSG(n->pin_ref >= 0, "pin_ref underflow at " + describe(n));
    apply(before, acct(n));
    update_sets(n);
  }
}

void RadixTree::protect_host(RadixNode* node, int32_t delta) {
  STRATA_CHECK(node != nullptr);
  for (RadixNode* n = node; n != root_.get(); n = n->parent) {
    const Acct before = acct(n);
    n->host_ref += delta;
    STRATA_CHECK_MSG(n->host_ref >= 0, "host_ref underflow at " + describe(n));
    apply(before, acct(n));
    update_sets(n);
  }
}

RadixNode* RadixTree::split(RadixNode* node, int32_t at) {
  STRATA_CHECK(node != root_.get());
  STRATA_CHECK(at > 0 && at < node->num_pages());
  const int32_t ps = options_.page_size;
  const int32_t total = node->num_pages();
  const Acct before = acct(node);
  erase_evictable(node);
  erase_host_evictable(node);

  auto upper_owned = std::make_unique<RadixNode>();
  RadixNode* upper = upper_owned.get();
  upper->id = next_node_id_++;
  upper->parent = node->parent;
  move_prefix(node->tokens, upper->tokens, static_cast<size_t>(at) * static_cast<size_t>(ps));
  move_prefix(node->hashes, upper->hashes, static_cast<size_t>(at));
  move_prefix(node->pin_counts, upper->pin_counts, static_cast<size_t>(at));
  move_prefix(node->device_pages, upper->device_pages, static_cast<size_t>(at));
  move_prefix(node->host_pages, upper->host_pages, static_cast<size_t>(at));
  move_prefix(node->in_storage, upper->in_storage, static_cast<size_t>(at));
  upper->first_page_extra = std::move(node->first_page_extra);
  node->first_page_extra.clear();
  // Both halves are in whatever transfer the node was in: each is finished by it.
  upper->loading = node->loading;
  upper->host_valid = node->host_valid;
  upper->demote_pending = node->demote_pending;
  upper->io_ref = node->io_ref;
  upper->host_ref = node->host_ref;
  upper->lock_ref = node->lock_ref;
  for (int32_t k = 0; k < at; ++k) {
    if (upper->pin_counts[static_cast<size_t>(k)] > 0) ++upper->own_pinned_blocks;
  }
  node->own_pinned_blocks -= upper->own_pinned_blocks;
  if (node->soft_pinned_blocks > 0) {
    for (BlockHash h : upper->hashes) {
      if (soft_pins_.contains(h)) ++upper->soft_pinned_blocks;
    }
    node->soft_pinned_blocks -= upper->soft_pinned_blocks;
  }
  // Every pin below or in the old node is below or in the upper half.
  upper->pin_ref = node->pin_ref;
  node->pin_ref -= upper->own_pinned_blocks;
  upper->last_access_tick = node->last_access_tick;
  upper->last_access_ms = node->last_access_ms;
  upper->hit_count = node->hit_count;

  // Re-link: the parent now owns `upper`, which owns `node`.
  RadixNode* parent = node->parent;
  std::unique_ptr<RadixNode>& slot = parent->children[node->index_in_parent];
  STRATA_CHECK_MSG(slot.get() == node, "split: stale index_in_parent");
  std::unique_ptr<RadixNode> lower = std::move(slot);
  upper->index_in_parent = node->index_in_parent;
  slot = std::move(upper_owned);
  node->parent = upper;
  node->index_in_parent = 0;
  upper->children.push_back(std::move(lower));

  for (int32_t k = 0; k < at; ++k) index_[upper->hashes[static_cast<size_t>(k)]] = Loc{upper, k};
  for (int32_t k = 0; k < total - at; ++k) {
    index_[node->hashes[static_cast<size_t>(k)]] = Loc{node, k};
  }

  ++num_nodes_;
  if (upper->lock_ref > 0) ++locked_nodes_;
  Acct after = acct(upper);
  const Acct lower_acct = acct(node);
  after.device += lower_acct.device;
  after.host += lower_acct.host;
  after.host_only += lower_acct.host_only;
  after.prot += lower_acct.prot;
  after.host_prot += lower_acct.host_prot;
  after.stored += lower_acct.stored;
  after.io += lower_acct.io;
  apply(before, after);
  update_sets(node);
  update_sets(upper);
  return upper;
}

void RadixTree::restore_pin_tail(RadixNode* node) {
  if (node == root_.get() || !node->is_leaf() || node->own_pinned_blocks == 0) return;
  int32_t last = node->num_pages() - 1;
  while (node->pin_counts[static_cast<size_t>(last)] == 0) --last;
  if (last + 1 < node->num_pages()) split(node, last + 1);
}

RadixNode* RadixTree::descend(RadixNode* node, std::span<const TokenId> tokens, int32_t at_page,
                              std::string_view extra, int32_t& matched, bool& partial, Walk walk) {
  const int32_t ps = options_.page_size;
  const int32_t n_pages = static_cast<int32_t>(tokens.size() / static_cast<size_t>(ps));
  RadixNode* child = find_child(node, tokens.subspan(static_cast<size_t>(at_page) * ps, ps), extra);
  if (child == nullptr) return nullptr;
  const bool host_only = child->on_host() && !child->has_device_pages();
  const bool ok = walk == Walk::kDevice     ? child->on_device()
                  : walk == Walk::kHostOnly ? host_only
                                            : (child->on_device() || host_only);
  if (!ok) return nullptr;
  const int32_t limit = std::min(child->num_pages(), n_pages - at_page);
  int32_t j = 1;
  while (j < limit && same_tokens(child->tokens.data() + static_cast<size_t>(j) * ps,
                                  tokens.data() + static_cast<size_t>(at_page + j) * ps, ps)) {
    ++j;
  }
  partial = j < child->num_pages();
  if (partial) child = split(child, j);
  matched = j;
  return child;
}

MatchResult RadixTree::match_prefix(std::span<const TokenId> tokens, std::string_view cache_salt) {
  ++match_calls_;
  MatchResult result;
  const int32_t ps = options_.page_size;
  const int32_t n_pages = static_cast<int32_t>(tokens.size() / static_cast<size_t>(ps));
  const std::string extra = first_page_extra_keys(cache_salt);
  const uint64_t tick = ++tick_;
  const int64_t now_ms = clock_->now_ms();
  RadixNode* node = root_.get();
  int32_t i = 0;
  bool partial = false;
  while (i < n_pages) {
    int32_t j = 0;
    RadixNode* child = descend(node, tokens, i, extra, j, partial);
    if (child == nullptr) break;
    result.device_pages.insert(result.device_pages.end(), child->device_pages.begin(),
                               child->device_pages.end());
    result.block_hashes.insert(result.block_hashes.end(), child->hashes.begin(),
                               child->hashes.end());
    ++child->hit_count;
    child->demote_pending = false;  // wanted on the device again
    touch(child, tick, now_ms);
    if (hierarchical() && options_.write_policy == WritePolicy::kWriteThroughSelective &&
        !child->has_host_pages() &&
        child->hit_count >= static_cast<uint64_t>(options_.write_through_threshold)) {
      start_backup(child);
    }
    if (child->soft_pinned_blocks > 0) {
      for (BlockHash h : child->hashes) {
        auto it = soft_pins_.find(h);
        if (it == soft_pins_.end()) continue;
        const int64_t expiry = now_ms + it->second.ttl_ms;
        if (expiry > it->second.expiry_ms) {
          soft_expiry_.erase({it->second.expiry_ms, h});
          it->second.expiry_ms = expiry;
          soft_expiry_.insert({expiry, h});
        }
      }
    }
    node = child;
    i += j;
    if (partial) break;
  }
  result.num_pages = i;
  result.last_node = node;
  matched_pages_total_ += static_cast<uint64_t>(i);
  // The continuation that only the host holds.
  if (hierarchical() && !partial) {
    int32_t h = i;
    while (h < n_pages) {
      int32_t j = 0;
      bool host_partial = false;
      RadixNode* child = descend(node, tokens, h, extra, j, host_partial, Walk::kHostOnly);
      if (child == nullptr) break;
      ++child->hit_count;
      touch(child, tick, now_ms);
      node = child;
      h += j;
      if (host_partial) break;
    }
    if (h > i) {
      result.host_num_pages = h - i;
      result.host_last_node = node;
    }
  }
  return result;
}

InsertResult RadixTree::insert(std::span<const TokenId> tokens, std::span<const PageId> pages,
                               std::string_view cache_salt) {
  InsertResult result;
  const int32_t ps = options_.page_size;
  const int32_t n_pages = static_cast<int32_t>(tokens.size() / static_cast<size_t>(ps));
  STRATA_CHECK_MSG(static_cast<int32_t>(pages.size()) == n_pages,
                   "insert: " + std::to_string(pages.size()) + " pages for " +
                       std::to_string(n_pages) + " full pages of tokens");
  const std::string extra = first_page_extra_keys(cache_salt);
  const uint64_t tick = ++tick_;
  const int64_t now_ms = clock_->now_ms();
  RadixNode* node = root_.get();
  int32_t i = 0;
  while (i < n_pages) {
    int32_t j = 0;
    bool partial = false;
    RadixNode* child = descend(node, tokens, i, extra, j, partial, Walk::kAnyTier);
    if (child == nullptr) break;
    if (!child->has_device_pages()) {
      // The block is on the host only and the caller computed it again: adopt its pages
      // as the device copy instead of keeping two.
      const Acct before = acct(child);
      child->demote_pending = false;
      child->device_pages.assign(pages.begin() + i, pages.begin() + i + j);
      apply(before, acct(child));
      update_sets(child);
      update_sets(node);
      emit_stored(child, Medium::kDevice);
    }
    for (int32_t k = 0; k < j; ++k) {
      const PageId passed = pages[static_cast<size_t>(i + k)];
      if (passed != child->device_pages[static_cast<size_t>(k)]) {
        result.rejected_pages.push_back(passed);
      }
    }
    result.block_hashes.insert(result.block_hashes.end(), child->hashes.begin(),
                               child->hashes.end());
    touch(child, tick, now_ms);
    node = child;
    i += j;
    if (partial) break;
  }
  result.num_existing_pages = i;
  result.last_node = node;
  if (i == n_pages) return result;

  // A new leaf under `node` with pages i..n_pages, hashes chained from node's last.
  auto leaf_owned = std::make_unique<RadixNode>();
  RadixNode* leaf = leaf_owned.get();
  BlockHash parent_hash = last_hash(node);
  int32_t count = 0;
  for (int32_t k = i; k < n_pages; ++k) {
    const BlockHash h =
        hash_block(parent_hash, tokens.subspan(static_cast<size_t>(k) * ps, ps),
                   (node == root_.get() && k == i) ? std::string_view(extra) : std::string_view());
    // A block hash already cached elsewhere is a 64-bit collision (the tokens differ, or
    // find_child would have matched): stop there rather than corrupt the index.
    if (index_.contains(h)) break;
    leaf->hashes.push_back(h);
    parent_hash = h;
    ++count;
  }
  for (int32_t k = i + count; k < n_pages; ++k) {
    result.rejected_pages.push_back(pages[static_cast<size_t>(k)]);
  }
  if (count == 0) return result;

  leaf->id = next_node_id_++;
  leaf->parent = node;
  leaf->tokens.assign(tokens.begin() + static_cast<std::ptrdiff_t>(i) * ps,
                      tokens.begin() + static_cast<std::ptrdiff_t>(i + count) * ps);
  leaf->device_pages.assign(pages.begin() + i, pages.begin() + i + count);
  leaf->pin_counts.assign(static_cast<size_t>(count), 0);
  if (node == root_.get()) leaf->first_page_extra = extra;
  leaf->last_access_tick = tick;
  leaf->last_access_ms = now_ms;
  for (int32_t k = 0; k < count; ++k) index_[leaf->hashes[static_cast<size_t>(k)]] = Loc{leaf, k};
  leaf->index_in_parent = static_cast<uint32_t>(node->children.size());
  node->children.push_back(std::move(leaf_owned));
  update_sets(node);  // no longer a leaf
  ++num_nodes_;
  apply(Acct{}, acct(leaf));
  inserted_pages_total_ += static_cast<uint64_t>(count);
  update_sets(leaf);
  emit_stored(leaf, Medium::kDevice);
  if (hierarchical() && options_.write_policy == WritePolicy::kWriteThrough) start_backup(leaf);

  result.num_new_pages = count;
  result.block_hashes.insert(result.block_hashes.end(), leaf->hashes.begin(), leaf->hashes.end());
  result.last_node = leaf;
  return result;
}

LockReceipt RadixTree::lock(RadixNode* node) {
  STRATA_CHECK(node != nullptr);
  uint32_t slot;
  if (!free_receipts_.empty()) {
    slot = free_receipts_.back();
    free_receipts_.pop_back();
  } else {
    slot = static_cast<uint32_t>(receipts_.size());
    receipts_.push_back(ReceiptSlot{});
  }
  ReceiptSlot& s = receipts_[slot];
  s.node = node;
  s.live = true;
  add_lock_ref(node, +1);
  ++outstanding_locks_;
  return LockReceipt{slot, s.generation};
}

RadixNode* RadixTree::locked_node(LockReceipt receipt) const {
  if (receipt.slot >= receipts_.size()) return nullptr;
  const ReceiptSlot& s = receipts_[receipt.slot];
  return (s.live && s.generation == receipt.generation) ? s.node : nullptr;
}

Status RadixTree::release(LockReceipt receipt) {
  RadixNode* node = locked_node(receipt);
  if (node == nullptr) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "lock receipt is not live (released twice, or never issued)");
  }
  ReceiptSlot& s = receipts_[receipt.slot];
  s.live = false;
  s.node = nullptr;
  ++s.generation;
  free_receipts_.push_back(receipt.slot);
  add_lock_ref(node, -1);
  --outstanding_locks_;
  return {};
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
    ++pinned_blocks_;
    add_pin_ref(node, +1);
  } else if (was && count == 0) {
    --node->own_pinned_blocks;
    --pinned_blocks_;
    add_pin_ref(node, -1);
  }
}

PinResult RadixTree::pin(std::span<const BlockHash> hashes, PinOptions options) {
  PinResult result;
  const int64_t now_ms = clock_->now_ms();
  std::vector<RadixNode*> touched;
  for (BlockHash h : hashes) {
    const auto it = index_.find(h);
    if (it == index_.end()) {
      ++result.unknown;
      continue;
    }
    const Loc loc = it->second;
    change_pin(loc, +1);
    if (options.ttl_ms > 0) {
      SoftPin& rec = soft_pins_[h];
      if (rec.count == 0) {
        ++loc.node->soft_pinned_blocks;
        rec.priority = options.priority;
      } else {
        soft_expiry_.erase({rec.expiry_ms, h});
      }
      ++rec.count;
      rec.ttl_ms = std::max(rec.ttl_ms, options.ttl_ms);
      rec.priority = std::max(rec.priority, options.priority);
      rec.expiry_ms = std::max(rec.expiry_ms, now_ms + options.ttl_ms);
      soft_expiry_.insert({rec.expiry_ms, h});
    }
    ++result.pinned;
    touched.push_back(loc.node);
  }
  // Splits never delete node objects, so the pointers stay valid.
  for (RadixNode* n : touched) restore_pin_tail(n);
  return result;
}

void RadixTree::drop_soft_record(BlockHash hash) {
  auto it = soft_pins_.find(hash);
  if (it == soft_pins_.end()) return;
  soft_expiry_.erase({it->second.expiry_ms, hash});
  soft_pins_.erase(it);
  const auto loc = index_.find(hash);
  STRATA_CHECK(loc != index_.end());
  --loc->second.node->soft_pinned_blocks;
}

int32_t RadixTree::unpin_soft(BlockHash hash, int32_t count) {
  auto it = soft_pins_.find(hash);
  if (it == soft_pins_.end() || count <= 0) return 0;
  const int32_t n = std::min(count, it->second.count);
  const Loc loc = index_.at(hash);
  for (int32_t k = 0; k < n; ++k) change_pin(loc, -1);
  it->second.count -= n;
  if (it->second.count == 0) drop_soft_record(hash);
  return n;
}

UnpinResult RadixTree::unpin(std::span<const BlockHash> hashes) {
  UnpinResult result;
  std::vector<RadixNode*> touched;
  for (BlockHash h : hashes) {
    const auto it = index_.find(h);
    if (it == index_.end()) {
      ++result.unknown;
      continue;
    }
    const Loc loc = it->second;
    const uint32_t count = loc.node->pin_counts[static_cast<size_t>(loc.offset)];
    if (count == 0) {
      ++result.not_pinned;
      continue;
    }
    const auto soft = soft_pins_.find(h);
    const uint32_t soft_count =
        soft == soft_pins_.end() ? 0 : static_cast<uint32_t>(soft->second.count);
    if (count > soft_count) {
      change_pin(loc, -1);
    } else {
      unpin_soft(h, 1);
    }
    ++result.unpinned;
    touched.push_back(loc.node);
  }
  for (RadixNode* n : touched) restore_pin_tail(n);
  return result;
}

int32_t RadixTree::expire_soft_pins() {
  const int64_t now_ms = clock_->now_ms();
  int32_t expired = 0;
  while (!soft_expiry_.empty() && soft_expiry_.begin()->first <= now_ms) {
    const BlockHash h = soft_expiry_.begin()->second;
    RadixNode* node = index_.at(h).node;
    expired += unpin_soft(h, soft_pins_.at(h).count);
    restore_pin_tail(node);
  }
  expired_pins_total_ += static_cast<uint64_t>(expired);
  return expired;
}

std::vector<BlockHash> RadixTree::release_pins_for(int64_t pages) {
  struct Candidate {
    bool hard;
    int32_t priority;
    uint64_t tick;
    BlockHash hash;
  };
  std::vector<Candidate> candidates;
  std::vector<const RadixNode*> stack{root_.get()};
  while (!stack.empty()) {
    const RadixNode* n = stack.back();
    stack.pop_back();
    for (const auto& c : n->children) stack.push_back(c.get());
    if (n->own_pinned_blocks == 0) continue;
    for (size_t k = 0; k < n->hashes.size(); ++k) {
      if (n->pin_counts[k] == 0) continue;
      const auto soft = soft_pins_.find(n->hashes[k]);
      const bool hard =
          soft == soft_pins_.end() || n->pin_counts[k] > static_cast<uint32_t>(soft->second.count);
      candidates.push_back(Candidate{hard, soft == soft_pins_.end() ? 0 : soft->second.priority,
                                     n->last_access_tick, n->hashes[k]});
    }
  }
  // Deeper blocks of one node share its tick; unpinning the deepest first frees tails.
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) {
                     if (a.hard != b.hard) return !a.hard;
                     if (a.priority != b.priority) return a.priority < b.priority;
                     return a.tick < b.tick;
                   });
  std::vector<BlockHash> released;
  const int64_t start = protected_pages_;
  for (const Candidate& c : candidates) {
    if (start - protected_pages_ >= pages) break;
    const auto it = index_.find(c.hash);
    if (it == index_.end()) continue;
    const Loc loc = it->second;
    const auto soft = soft_pins_.find(c.hash);
    if (soft != soft_pins_.end()) unpin_soft(c.hash, soft->second.count);
    const uint32_t hard_left = loc.node->pin_counts[static_cast<size_t>(loc.offset)];
    if (hard_left > 0) change_pin(loc, -static_cast<int32_t>(hard_left));
    restore_pin_tail(loc.node);
    released.push_back(c.hash);
  }
  return released;
}

int64_t RadixTree::soft_pinned_blocks_at_most(int32_t priority) const {
  int64_t n = 0;
  for (const auto& [hash, rec] : soft_pins_) n += rec.priority <= priority ? 1 : 0;
  return n;
}

uint32_t RadixTree::pin_count(BlockHash hash) const {
  const auto it = index_.find(hash);
  if (it == index_.end()) return 0;
  return it->second.node->pin_counts[static_cast<size_t>(it->second.offset)];
}

int32_t RadixTree::remove_leaf(RadixNode* leaf) {
  STRATA_CHECK(leaf != root_.get() && leaf->is_leaf() && !leaf->is_protected() &&
               leaf->io_ref == 0);
  erase_evictable(leaf);
  erase_host_evictable(leaf);
  const Acct before = acct(leaf);
  const int32_t n = leaf->has_device_pages() ? leaf->num_pages() : 0;
  const bool had_host = leaf->has_host_pages();
  if (n > 0) device_pages_->free(leaf->device_pages);
  if (had_host) {
    host_pages_->free(leaf->host_pages);
    host_evicted_pages_total_ += static_cast<uint64_t>(leaf->num_pages());
  }
  for (BlockHash h : leaf->hashes) index_.erase(h);
  if (n > 0 && had_host) emit(BlockRemoved{leaf->hashes, Medium::kDevice});
  // The leaf is destroyed below: its hash vector moves into the last event.
  if (events_ != nullptr) {
    emit(BlockRemoved{std::move(leaf->hashes), had_host ? Medium::kHost : Medium::kDevice});
  }
  apply(before, Acct{});
  --num_nodes_;
  evicted_pages_total_ += static_cast<uint64_t>(n);
  RadixNode* parent = leaf->parent;
  auto& siblings = parent->children;
  const uint32_t at = leaf->index_in_parent;
  STRATA_CHECK_MSG(at < siblings.size() && siblings[at].get() == leaf, "stale index_in_parent");
  if (at + 1 != siblings.size()) {
    siblings[at] = std::move(siblings.back());
    siblings[at]->index_in_parent = at;
  }
  siblings.pop_back();  // destroys leaf
  update_sets(parent);
  restore_pin_tail(parent);
  try_demote(parent);
  return n;
}

bool RadixTree::needs_backup_to_leave(const RadixNode* node) const {
  // A node leaves the device without a host copy only by being dropped, which a pin, a
  // session's protection, host-only children or the write_back policy forbid.
  return options_.write_policy == WritePolicy::kWriteBack || node->pin_ref > 0 ||
         node->host_ref > 0 || !node->is_leaf();
}

bool RadixTree::allocate_host(int32_t count, std::vector<PageId>& out) {
  if (host_pages_->num_free() < count) evict_host(count - host_pages_->num_free());
  return host_pages_->allocate(count, out).has_value();
}

bool RadixTree::start_backup(RadixNode* node) {
  if (!hierarchical() || !node->on_device() || node->has_host_pages()) return false;
  std::vector<PageId> host;
  // Making host room removes host leaves, which can split this node (a pinned node that
  // becomes childless splits off its unpinned tail): size the pages after that settles.
  std::vector<RadixNode*> split_heads;  // parts split off this node meanwhile
  for (int attempt = 0;; ++attempt) {
    const int32_t n = node->num_pages();
    const RadixNode* parent_before = node->parent;
    if (!allocate_host(n, host)) {
      ++backups_skipped_total_;
      return false;
    }
    if (node->parent != parent_before) split_heads.push_back(node->parent);
    if (n == node->num_pages()) break;
    host_pages_->free(host);
    host.clear();
    STRATA_CHECK_MSG(attempt < 8, "start_backup: node keeps changing size");
  }
  const Acct before = acct(node);
  node->host_pages = host;
  node->host_valid = false;
  ++node->io_ref;
  apply(before, acct(node));
  update_sets(node);
  transfers_.push_back(TransferRequest{TransferDirection::kDeviceToHost, node->hashes,
                                       node->device_pages, std::move(host)});
  // The head split off (it carries the same demote mark) needs its own copy.
  for (RadixNode* head : split_heads) start_backup(head);
  return true;
}

void RadixTree::demote(RadixNode* node) {
  STRATA_CHECK(node->on_host() && node->on_device() && node->io_ref == 0 && node->lock_ref == 0);
  const Acct before = acct(node);
  device_pages_->free(node->device_pages);
  std::fill(node->device_pages.begin(), node->device_pages.end(), kInvalidPage);
  node->demote_pending = false;
  apply(before, acct(node));
  demoted_pages_total_ += static_cast<uint64_t>(node->num_pages());
  evicted_pages_total_ += static_cast<uint64_t>(node->num_pages());
  emit(BlockRemoved{node->hashes, Medium::kDevice});
  update_sets(node);
  RadixNode* parent = node->parent;
  if (parent != root_.get()) {
    update_sets(parent);
    try_demote(parent);
  }
}

void RadixTree::try_demote(RadixNode* node) {
  if (node == root_.get() || !node->demote_pending) return;
  if (node->on_host() && node->on_device() && node->io_ref == 0 && node->lock_ref == 0 &&
      is_device_leaf(node)) {
    demote(node);
  }
}

EvictResult RadixTree::evict(int32_t num_pages) {
  EvictResult result;
  std::unordered_set<const RadixNode*> skipped;  // pinned nodes with no host room
  while (result.evicted_pages < num_pages) {
    auto it = evictable_.begin();
    while (it != evictable_.end() && skipped.contains(it->node)) ++it;
    if (it == evictable_.end()) break;
    RadixNode* leaf = it->node;
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
  return result;
}

int32_t RadixTree::evict_host(int32_t num_pages) {
  int32_t freed = 0;
  while (freed < num_pages && !host_evictable_.empty()) {
    RadixNode* leaf = host_evictable_.begin()->node;
    freed += leaf->num_pages();
    remove_leaf(leaf);
  }
  return freed;
}

Status RadixTree::load_back(const MatchResult& m) {
  if (!hierarchical() || m.host_num_pages == 0 || m.host_last_node == nullptr) {
    return make_error(ErrorCode::kInvalidArgument, "nothing to load");
  }
  STRATA_CHECK_MSG(m.host_last_node->lock_ref > 0,
                   "load_back: the caller must lock the host path first");
  const int32_t need = m.host_num_pages;
  if (device_pages_->num_free() < need) evict(need - device_pages_->num_free());
  std::vector<PageId> pages;
  if (!device_pages_->allocate(need, pages)) {
    return make_error(ErrorCode::kOutOfPages,
                      "no room on the device to load " + std::to_string(need) + " pages back");
  }
  // The path after eviction made room (eviction may split its nodes; the walk up from the
  // locked deepest node to the device part still covers exactly the same blocks).
  std::vector<RadixNode*> path;
  int32_t covered = 0;
  for (RadixNode* n = m.host_last_node; n != m.last_node; n = n->parent) {
    STRATA_CHECK_MSG(n != root_.get() && n->on_host() && !n->has_device_pages(),
                     "load_back: stale match");
    path.push_back(n);
    covered += n->num_pages();
  }
  STRATA_CHECK_MSG(covered == need, "load_back: the host path changed size");
  std::reverse(path.begin(), path.end());
  TransferRequest req{TransferDirection::kHostToDevice, {}, {}, {}};
  size_t at = 0;
  for (RadixNode* n : path) {
    const Acct before = acct(n);
    n->device_pages.assign(pages.begin() + static_cast<std::ptrdiff_t>(at),
                           pages.begin() + static_cast<std::ptrdiff_t>(at) + n->num_pages());
    at += static_cast<size_t>(n->num_pages());
    n->loading = true;
    ++n->io_ref;
    apply(before, acct(n));
    update_sets(n);
    update_sets(n->parent);
    req.hashes.insert(req.hashes.end(), n->hashes.begin(), n->hashes.end());
    req.device_pages.insert(req.device_pages.end(), n->device_pages.begin(), n->device_pages.end());
    req.host_pages.insert(req.host_pages.end(), n->host_pages.begin(), n->host_pages.end());
  }
  transfers_.push_back(std::move(req));
  return {};
}

std::vector<TransferRequest> RadixTree::take_transfers() {
  std::vector<TransferRequest> out;
  out.swap(transfers_);
  return out;
}

void RadixTree::complete_transfer(const TransferRequest& request, bool ok) {
  // The blocks' nodes now, in path order (a node may have been split meanwhile: each
  // part carries the transfer's io_ref and is finished once).
  std::vector<RadixNode*> nodes;
  for (BlockHash h : request.hashes) {
    const auto it = index_.find(h);
    STRATA_CHECK_MSG(it != index_.end(), "complete_transfer: a block in flight left the tree");
    if (nodes.empty() || nodes.back() != it->second.node) nodes.push_back(it->second.node);
  }
  for (RadixNode* n : nodes) {
    const Acct before = acct(n);
    STRATA_CHECK(n->io_ref > 0);
    --n->io_ref;
    if (request.direction == TransferDirection::kDeviceToHost) {
      if (ok) {
        n->host_valid = true;
        backed_up_pages_total_ += static_cast<uint64_t>(n->num_pages());
      } else {
        host_pages_->free(n->host_pages);
        n->host_pages.clear();
        n->host_valid = false;
        n->demote_pending = false;
      }
    } else {
      n->loading = false;
      if (ok) {
        loaded_pages_total_ += static_cast<uint64_t>(n->num_pages());
      } else {
        device_pages_->free(n->device_pages);
        std::fill(n->device_pages.begin(), n->device_pages.end(), kInvalidPage);
      }
    }
    apply(before, acct(n));
    update_sets(n);
    if (n->parent != root_.get()) update_sets(n->parent);
    if (ok)
      emit_stored(n,
                  request.direction == TransferDirection::kDeviceToHost ? Medium::kHost : Medium::kDevice);
  }
  // Deepest first, so that a demoted child lets its parent go too.
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) try_demote(*it);
}

std::vector<std::pair<BlockHash, PageId>> RadixTree::begin_storage_write(
    std::span<const BlockHash> hashes) {
  std::vector<std::pair<BlockHash, PageId>> out;
  std::vector<RadixNode*> nodes;
  for (BlockHash h : hashes) {
    const auto it = index_.find(h);
    if (it == index_.end()) continue;
    RadixNode* n = it->second.node;
    if (!n->on_host() || std::find(nodes.begin(), nodes.end(), n) != nodes.end()) continue;
    if (n->stored() &&
        std::all_of(n->in_storage.begin(), n->in_storage.end(), [](uint8_t f) { return f != 0; })) {
      continue;
    }
    nodes.push_back(n);
  }
  // Whole nodes, so that a split while the write runs leaves each part in it.
  for (RadixNode* n : nodes) {
    const Acct before = acct(n);
    ++n->io_ref;
    apply(before, acct(n));
    update_sets(n);
    for (int32_t k = 0; k < n->num_pages(); ++k) {
      out.emplace_back(n->hashes[static_cast<size_t>(k)], n->host_pages[static_cast<size_t>(k)]);
    }
  }
  return out;
}

void RadixTree::finish_storage_write(std::span<const BlockHash> hashes,
                                     std::span<const uint8_t> written) {
  STRATA_CHECK(hashes.size() == written.size());
  std::vector<RadixNode*> nodes;
  BlockStored run;  // consecutive blocks newly in storage, one event per run
  run.block_size = options_.page_size;
  run.medium = Medium::kStorage;
  const RadixNode* run_node = nullptr;
  int32_t run_end = -1;
  auto close_run = [&] {
    if (!run.block_hashes.empty()) emit(std::move(run));
    run = BlockStored{};
    run.block_size = options_.page_size;
    run.medium = Medium::kStorage;
    run_node = nullptr;
  };
  for (size_t i = 0; i < hashes.size(); ++i) {
    const auto it = index_.find(hashes[i]);
    STRATA_CHECK_MSG(it != index_.end(), "finish_storage_write: a block in flight left the tree");
    RadixNode* n = it->second.node;
    const int32_t off = it->second.offset;
    if (std::find(nodes.begin(), nodes.end(), n) == nodes.end()) nodes.push_back(n);
    if (written[i] == 0 || (!n->in_storage.empty() && n->in_storage[static_cast<size_t>(off)])) {
      close_run();
      continue;
    }
    const Acct before = acct(n);
    if (n->in_storage.empty()) n->in_storage.assign(static_cast<size_t>(n->num_pages()), 0);
    n->in_storage[static_cast<size_t>(off)] = 1;
    apply(before, acct(n));
    if (run_node != n || run_end != off) close_run();
    if (run.block_hashes.empty()) {
      if (off > 0) {
        run.parent_block_hash = n->hashes[static_cast<size_t>(off - 1)];
      } else if (n->parent != root_.get()) {
        run.parent_block_hash = n->parent->hashes.back();
      }
    }
    run.block_hashes.push_back(hashes[i]);
    const auto ps = static_cast<size_t>(options_.page_size);
    run.token_ids.insert(run.token_ids.end(),
                         n->tokens.begin() + static_cast<std::ptrdiff_t>(off * ps),
                         n->tokens.begin() + static_cast<std::ptrdiff_t>((off + 1) * ps));
    run_node = n;
    run_end = off + 1;
  }
  close_run();
  for (RadixNode* n : nodes) {
    const Acct before = acct(n);
    --n->io_ref;
    apply(before, acct(n));
    update_sets(n);
    if (n->parent != root_.get()) update_sets(n->parent);
  }
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) try_demote(*it);
}

InsertResult RadixTree::insert_host(std::span<const TokenId> tokens, int32_t first_page,
                                    std::span<const PageId> host_pages,
                                    std::string_view cache_salt) {
  InsertResult result;
  STRATA_CHECK(hierarchical());
  const int32_t ps = options_.page_size;
  const int32_t n_pages = static_cast<int32_t>(tokens.size() / static_cast<size_t>(ps));
  STRATA_CHECK(first_page >= 0 && first_page + static_cast<int32_t>(host_pages.size()) == n_pages);
  const std::string extra = first_page_extra_keys(cache_salt);
  const uint64_t tick = ++tick_;
  const int64_t now_ms = clock_->now_ms();
  RadixNode* node = root_.get();
  int32_t i = 0;
  while (i < n_pages) {
    int32_t j = 0;
    bool partial = false;
    RadixNode* child = descend(node, tokens, i, extra, j, partial, Walk::kAnyTier);
    if (child == nullptr) break;
    touch(child, tick, now_ms);
    node = child;
    i += j;
    if (partial) break;
  }
  result.num_existing_pages = i;
  result.last_node = node;
  // Pages of blocks the tree has, or that cannot hang below what it has, go back.
  const int32_t from = std::max(i, first_page);
  for (int32_t k = first_page; k < from; ++k) {
    result.rejected_pages.push_back(host_pages[static_cast<size_t>(k - first_page)]);
  }
  if (i < first_page || i == n_pages) {
    for (int32_t k = from; k < n_pages; ++k) {
      result.rejected_pages.push_back(host_pages[static_cast<size_t>(k - first_page)]);
    }
    return result;
  }
  auto leaf_owned = std::make_unique<RadixNode>();
  RadixNode* leaf = leaf_owned.get();
  BlockHash parent_hash = last_hash(node);
  int32_t count = 0;
  for (int32_t k = i; k < n_pages; ++k) {
    const BlockHash h =
        hash_block(parent_hash, tokens.subspan(static_cast<size_t>(k) * ps, ps),
                   (node == root_.get() && k == i) ? std::string_view(extra) : std::string_view());
    if (index_.contains(h)) break;
    leaf->hashes.push_back(h);
    parent_hash = h;
    ++count;
  }
  for (int32_t k = i + count; k < n_pages; ++k) {
    result.rejected_pages.push_back(host_pages[static_cast<size_t>(k - first_page)]);
  }
  if (count == 0) return result;
  leaf->id = next_node_id_++;
  leaf->parent = node;
  leaf->tokens.assign(tokens.begin() + static_cast<std::ptrdiff_t>(i) * ps,
                      tokens.begin() + static_cast<std::ptrdiff_t>(i + count) * ps);
  leaf->device_pages.assign(static_cast<size_t>(count), kInvalidPage);
  leaf->host_pages.assign(host_pages.begin() + (i - first_page),
                          host_pages.begin() + (i - first_page) + count);
  leaf->host_valid = true;
  leaf->in_storage.assign(static_cast<size_t>(count), 1);
  leaf->pin_counts.assign(static_cast<size_t>(count), 0);
  if (node == root_.get()) leaf->first_page_extra = extra;
  leaf->last_access_tick = tick;
  leaf->last_access_ms = now_ms;
  for (int32_t k = 0; k < count; ++k) index_[leaf->hashes[static_cast<size_t>(k)]] = Loc{leaf, k};
  leaf->index_in_parent = static_cast<uint32_t>(node->children.size());
  node->children.push_back(std::move(leaf_owned));
  update_sets(node);
  ++num_nodes_;
  apply(Acct{}, acct(leaf));
  update_sets(leaf);
  emit_stored(leaf, Medium::kHost);
  result.num_new_pages = count;
  result.block_hashes = leaf->hashes;
  result.last_node = leaf;
  return result;
}

std::vector<BlockHash> RadixTree::block_hashes_of(std::span<const TokenId> tokens,
                                                  std::string_view cache_salt) const {
  const int32_t ps = options_.page_size;
  const size_t n_pages = tokens.size() / static_cast<size_t>(ps);
  const std::string extra = first_page_extra_keys(cache_salt);
  std::vector<BlockHash> out;
  out.reserve(n_pages);
  BlockHash parent = kRootParentHash;
  for (size_t k = 0; k < n_pages; ++k) {
    parent =
        hash_block(parent, tokens.subspan(k * static_cast<size_t>(ps), static_cast<size_t>(ps)),
                   k == 0 ? std::string_view(extra) : std::string_view());
    out.push_back(parent);
  }
  return out;
}

RadixNode* RadixTree::node_ending_at(BlockHash hash) {
  const auto it = index_.find(hash);
  if (it == index_.end()) return nullptr;
  const Loc loc = it->second;
  if (loc.offset + 1 == loc.node->num_pages()) return loc.node;
  return split(loc.node, loc.offset + 1);
}

RadixNode* RadixTree::node_of(BlockHash hash) const {
  const auto it = index_.find(hash);
  return it == index_.end() ? nullptr : it->second.node;
}

int32_t RadixTree::back_up(std::span<const BlockHash> hashes) {
  if (!hierarchical()) return 0;
  int32_t started = 0;
  for (BlockHash h : hashes) {
    const auto it = index_.find(h);
    if (it == index_.end()) continue;
    RadixNode* n = it->second.node;
    if (n->on_device() && !n->has_host_pages() && start_backup(n)) ++started;
  }
  return started;
}

int32_t RadixTree::offload_path(RadixNode* node) {
  int32_t leaving = 0;
  if (!hierarchical() || node == root_.get()) return 0;
  // Host room for the backups must never come from this path itself.
  protect_host(node, +1);
  std::vector<RadixNode*> path;
  for (RadixNode* n = node; n != root_.get(); n = n->parent) path.push_back(n);
  for (RadixNode* n : path) {
    if (!n->has_device_pages() || n->loading) continue;
    n->demote_pending = true;
    leaving += n->num_pages();
    if (!n->has_host_pages()) start_backup(n);
  }
  protect_host(node, -1);
  for (RadixNode* n : path) try_demote(n);
  return leaving;
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
  const int64_t before = cached_pages_;
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
  result.evicted_blocks = static_cast<int32_t>(before - cached_pages_);
  return result;
}

FlushResult RadixTree::flush() {
  FlushResult result;
  if (!hierarchical()) {
    result.evicted_pages = evict(std::numeric_limits<int32_t>::max()).evicted_pages;
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
    const int64_t device_before = cached_pages_;
    const uint64_t host_before = host_evicted_pages_total_;
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
    result.evicted_pages = static_cast<int32_t>(device_before - cached_pages_) + pending;
    result.evicted_host_pages = static_cast<int32_t>(host_evicted_pages_total_ - host_before);
  }
  result.pinned_preserved = static_cast<int32_t>(pinned_blocks_);
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
  if (outstanding_locks_ > 0) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "reset refused: " + std::to_string(outstanding_locks_) +
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
  evictable_.clear();
  host_evictable_.clear();
  host_cached_pages_ = 0;
  host_only_pages_ = 0;
  host_evictable_pages_ = 0;
  host_protected_pages_ = 0;
  stored_pages_ = 0;
  io_pending_nodes_ = 0;
  soft_pins_.clear();
  soft_expiry_.clear();
  num_nodes_ = 0;
  cached_pages_ = 0;
  protected_pages_ = 0;
  evictable_pages_ = 0;
  pinned_blocks_ = 0;
  locked_nodes_ = 0;
  emit(AllBlocksCleared{});
  return {};
}

TreeStats RadixTree::stats() const {
  TreeStats s;
  s.page_size = options_.page_size;
  s.num_nodes = num_nodes_;
  s.cached_pages = cached_pages_;
  s.protected_pages = protected_pages_;
  s.evictable_pages = evictable_pages_;
  s.pinned_blocks = pinned_blocks_;
  s.soft_pinned_blocks = static_cast<int64_t>(soft_pins_.size());
  s.locked_nodes = locked_nodes_;
  s.outstanding_locks = outstanding_locks_;
  s.match_calls = match_calls_;
  s.matched_pages_total = matched_pages_total_;
  s.evicted_pages_total = evicted_pages_total_;
  s.inserted_pages_total = inserted_pages_total_;
  s.expired_pins_total = expired_pins_total_;
  s.hierarchical = hierarchical();
  s.host_capacity_pages = hierarchical() ? host_pages_->num_pages() : 0;
  s.host_cached_pages = host_cached_pages_;
  s.host_only_pages = host_only_pages_;
  s.host_evictable_pages = host_evictable_pages_;
  s.host_protected_pages = host_protected_pages_;
  s.stored_pages = stored_pages_;
  s.io_pending_nodes = io_pending_nodes_;
  s.demoted_pages_total = demoted_pages_total_;
  s.backed_up_pages_total = backed_up_pages_total_;
  s.loaded_pages_total = loaded_pages_total_;
  s.host_evicted_pages_total = host_evicted_pages_total_;
  s.backups_skipped_total = backups_skipped_total_;
  return s;
}

std::vector<NodeSnapshot> RadixTree::snapshot() const {
  std::vector<NodeSnapshot> out;
  std::vector<const RadixNode*> stack;
  for (const auto& c : root_->children) stack.push_back(c.get());
  while (!stack.empty()) {
    const RadixNode* n = stack.back();
    stack.pop_back();
    NodeSnapshot s;
    s.id = n->id;
    s.parent_id = n->parent->id;
    s.num_tokens = static_cast<int32_t>(n->tokens.size());
    s.block_hashes = n->hashes;
    s.pin_counts = n->pin_counts;
    s.lock_ref = n->lock_ref;
    s.pin_ref = n->pin_ref;
    s.last_access_ms = n->last_access_ms;
    s.hit_count = n->hit_count;
    s.on_device = n->on_device();
    s.on_host = n->on_host();
    s.in_storage = n->stored();
    s.loading = n->loading;
    s.host_ref = n->host_ref;
    s.evictable = n->in_evictable_set || n->in_host_evictable_set;
    out.push_back(std::move(s));
    for (const auto& c : n->children) stack.push_back(c.get());
  }
  return out;
}

void RadixTree::collect_device_pages(std::vector<PageId>& out) const {
  std::vector<const RadixNode*> stack{root_.get()};
  while (!stack.empty()) {
    const RadixNode* n = stack.back();
    stack.pop_back();
    for (PageId p : n->device_pages) {
      if (p != kInvalidPage) out.push_back(p);
    }
    for (const auto& c : n->children) stack.push_back(c.get());
  }
}

void RadixTree::collect_host_pages(std::vector<PageId>& out) const {
  std::vector<const RadixNode*> stack{root_.get()};
  while (!stack.empty()) {
    const RadixNode* n = stack.back();
    stack.pop_back();
    if (n->has_host_pages()) out.insert(out.end(), n->host_pages.begin(), n->host_pages.end());
    for (const auto& c : n->children) stack.push_back(c.get());
  }
}

std::vector<BlockHash> RadixTree::all_block_hashes() const {
  std::vector<BlockHash> out;
  out.reserve(index_.size());
  for (const auto& [h, loc] : index_) out.push_back(h);
  return out;
}

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
  if (live != outstanding_locks_) return fail("outstanding lock count drifted");

  int64_t nodes = 0, pages = 0, evictable_pages = 0, pinned = 0, locked = 0;
  int64_t evictable_nodes = 0, host_evictable_pages = 0, host_evictable_nodes = 0;
  Acct acct_sum;
  size_t soft_seen = 0;
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
    {
      const Acct a = acct(node);
      acct_sum.device += a.device;
      acct_sum.host += a.host;
      acct_sum.host_only += a.host_only;
      acct_sum.prot += a.prot;
      acct_sum.host_prot += a.host_prot;
      acct_sum.stored += a.stored;
      acct_sum.io += a.io;
    }
    const bool should_host = node->on_host() && !node->has_device_pages() && node->is_leaf() &&
                             !node->is_protected() && node->io_ref == 0;
    if (should_host != node->in_host_evictable_set) {
      return fail(describe(node) + ": host evictable flag wrong");
    }
    if (node->in_host_evictable_set) {
      if (!host_evictable_.contains(
              EvictKey{node->last_access_tick, node->id, const_cast<RadixNode*>(node)})) {
        return fail(describe(node) + ": missing from the host evictable set");
      }
      host_evictable_pages += node->num_pages();
      ++host_evictable_nodes;
    }
    // Chained hashes.
    BlockHash parent_hash = last_hash(node->parent);
    for (size_t k = 0; k < np; ++k) {
      const std::string_view extra = (node->parent == root_.get() && k == 0)
                                         ? std::string_view(node->first_page_extra)
                                         : std::string_view();
      const BlockHash h = hash_block(
          parent_hash, std::span<const TokenId>(node->tokens).subspan(k * ps, ps), extra);
      if (h != node->hashes[k]) return fail(describe(node) + ": block hash chain broken");
      parent_hash = h;
      const auto it = index_.find(h);
      if (it == index_.end() || it->second.node != node ||
          it->second.offset != static_cast<int32_t>(k)) {
        return fail(describe(node) + ": hash index entry wrong for page " + std::to_string(k));
      }
    }
    int32_t own = 0, soft = 0;
    for (size_t k = 0; k < np; ++k) {
      if (node->pin_counts[k] > 0) ++own;
      const auto sp = soft_pins_.find(node->hashes[k]);
      if (sp != soft_pins_.end()) {
        ++soft;
        ++soft_seen;
        if (sp->second.count <= 0 ||
            node->pin_counts[k] < static_cast<uint32_t>(sp->second.count)) {
          return fail(describe(node) + ": soft pin count exceeds pin count");
        }
        if (!soft_expiry_.contains({sp->second.expiry_ms, node->hashes[k]})) {
          return fail(describe(node) + ": soft pin missing from expiry order");
        }
      }
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
    const bool should_evict = node->on_device() && is_device_leaf(node) && node->lock_ref == 0 &&
                              node->io_ref == 0 && (hierarchical() || !node->is_protected());
    if (should_evict != node->in_evictable_set)
      return fail(describe(node) + ": evictable flag wrong");
    if (node->in_evictable_set) {
      if (!evictable_.contains(
              EvictKey{node->last_access_tick, node->id, const_cast<RadixNode*>(node)})) {
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
  if (nodes != num_nodes_) return fail("node count drifted");
  if (acct_sum.device != cached_pages_) return fail("cached page count drifted");
  if (static_cast<size_t>(pages) != index_.size()) return fail("hash index has stale entries");
  if (acct_sum.prot != protected_pages_) return fail("protected page count drifted");
  if (acct_sum.host != host_cached_pages_ || acct_sum.host_only != host_only_pages_ ||
      acct_sum.host_prot != host_protected_pages_ || acct_sum.stored != stored_pages_ ||
      acct_sum.io != io_pending_nodes_) {
    return fail("host tier counters drifted");
  }
  if (host_evictable_pages != host_evictable_pages_ ||
      static_cast<size_t>(host_evictable_nodes) != host_evictable_.size()) {
    return fail("host evictable set drifted");
  }
  if (evictable_pages != evictable_pages_) return fail("evictable page count drifted");
  if (static_cast<size_t>(evictable_nodes) != evictable_.size())
    return fail("evictable set has stale entries");
  if (pinned != pinned_blocks_) return fail("pinned block count drifted");
  if (locked != locked_nodes_) return fail("locked node count drifted");
  if (soft_seen != soft_pins_.size() || soft_pins_.size() != soft_expiry_.size()) {
    return fail("soft pin records have stale entries");
  }
  return {};
}

}  // namespace strata
