// Structure: nodes, match_prefix, the one insert path, split, the hash index, lock
// receipts and the counters (acct/apply).
//
// Contract kept here: the hash index maps every cached block to its node and offset at
// all times; a split keeps the deeper half as the original node (so receipts, pins and
// transfers that name it stay valid); every change of a node's state is bracketed by
// acct() before and apply(before, acct()) after, so the counters never drift.
#include "cache/radix_tree.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
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

// The node pool's bounds: how many removed nodes wait for reuse, and the largest vectors
// a waiting node keeps (a bigger node gives its memory back), so that the pool holds at
// most a few MiB whatever the tree held before.
constexpr size_t kMaxSpareNodes = 256;
constexpr size_t kMaxSpareTokens = 4096;

// Under AddressSanitizer removed nodes are freed, not reused, so that a stale node pointer
// is still reported as a use after free.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kReuseNodes = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kReuseNodes = false;
#else
constexpr bool kReuseNodes = true;
#endif
#else
constexpr bool kReuseNodes = true;
#endif

// Empties `v`, keeping its capacity unless it is larger than a spare node may keep.
template <typename T>
void clear_keeping(std::vector<T>& v, size_t max_capacity) {
  if (v.capacity() > max_capacity) {
    std::vector<T>().swap(v);
  } else {
    v.clear();
  }
}

}  // namespace

RadixTree::RadixTree(RadixTreeOptions options, PageAllocator* device_pages, KvEventSink* events,
                     const Clock* clock, PageAllocator* host_pages,
                     std::unique_ptr<EvictionPolicy> eviction)
    : options_(options),
      device_pages_(device_pages),
      host_pages_(host_pages),
      events_(events),
      clock_(clock != nullptr ? clock : &SteadyClock::instance()),
      root_(std::make_unique<RadixNode>()),
      eviction_(eviction != nullptr ? std::move(eviction) : make_lru_eviction_policy()),
      evicted_((device_pages != nullptr ? device_pages->num_pages() : 0) +
               (host_pages != nullptr ? host_pages->num_pages() : 0)) {
  STRATA_CHECK_MSG(options_.page_size >= 1 && options_.page_size <= 4096,
                   "page_size must be in [1, 4096]");
  STRATA_CHECK(device_pages_ != nullptr);
  STRATA_CHECK_MSG(options_.write_through_threshold >= 1, "write_through_threshold must be >= 1");
  root_->id = 0;
}

RadixTree::~RadixTree() = default;

std::string RadixTree::describe(const RadixNode* node) {
  return "node " + std::to_string(node->id);
}

std::unique_ptr<RadixNode> RadixTree::new_node() {
  if (spare_nodes_.empty()) return std::make_unique<RadixNode>();
  std::unique_ptr<RadixNode> node = std::move(spare_nodes_.back());
  spare_nodes_.pop_back();
  return node;
}

void RadixTree::recycle_node(std::unique_ptr<RadixNode> node) {
  STRATA_CHECK(node != nullptr && node->is_leaf());
  if (!kReuseNodes || spare_nodes_.size() >= kMaxSpareNodes) return;  // destroyed here
  // Every field back to its default, the vectors' capacity kept: a fresh node takes over
  // the emptied vectors, then replaces the old state wholesale.
  const size_t max_tokens = kMaxSpareTokens;
  const size_t max_pages = kMaxSpareTokens / static_cast<size_t>(options_.page_size) + 1;
  RadixNode fresh;
  clear_keeping(node->tokens, max_tokens);
  clear_keeping(node->hashes, max_pages);
  clear_keeping(node->chain_tails, max_pages);
  clear_keeping(node->pin_counts, max_pages);
  clear_keeping(node->device_pages, max_pages);
  clear_keeping(node->host_pages, max_pages);
  clear_keeping(node->in_storage, max_pages);
  fresh.tokens.swap(node->tokens);
  fresh.hashes.swap(node->hashes);
  fresh.chain_tails.swap(node->chain_tails);
  fresh.pin_counts.swap(node->pin_counts);
  fresh.device_pages.swap(node->device_pages);
  fresh.host_pages.swap(node->host_pages);
  fresh.in_storage.swap(node->in_storage);
  *node = std::move(fresh);
  spare_nodes_.push_back(std::move(node));
}

bool RadixTree::begin_unindex_batch() {
  if (unindex_batch_open_) return false;
  unindex_batch_open_ = true;
  return true;
}

void RadixTree::end_unindex_batch(bool opened) {
  if (!opened) return;
  index_.erase(unindex_batch_);
  unindex_batch_.clear();
  // A flush can batch the whole tree's blocks: keep a bounded scratch only.
  constexpr size_t kMaxKeptBatch = 64 * 1024;
  if (unindex_batch_.capacity() > kMaxKeptBatch) {
    std::vector<BlockIndex::Owned>().swap(unindex_batch_);
  }
  unindex_batch_open_ = false;
}

void RadixTree::emit(KvEvent event) {
  if (events_ != nullptr) events_->on_event(std::move(event));
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
  if (hierarchical() && dev && !host && a.prot == 0 && (n->pin_ref > 0 || n->host_ref > 0)) {
    a.bound = np;
  }
  for (uint8_t f : n->in_storage) a.stored += f != 0 ? 1 : 0;
  a.io = n->io_ref > 0 ? 1 : 0;
  return a;
}

void RadixTree::apply(const Acct& before, const Acct& after) {
  Acct d = after;
  d += -before;
  stats_.cached_pages += d.device;
  stats_.host_cached_pages += d.host;
  stats_.host_only_pages += d.host_only;
  stats_.protected_pages += d.prot;
  backup_bound_pages_ += d.bound;
  stats_.host_protected_pages += d.host_prot;
  stats_.stored_pages += d.stored;
  stats_.io_pending_nodes += d.io;
}

void RadixTree::emit_stored(const RadixNode* node, Medium medium) {
  if (events_ == nullptr) return;
  BlockStored ev;
  ev.block_hashes = node->hashes;
  if (node->parent != root_.get()) ev.parent_block_hash = node->parent->hashes.back();
  if (node->parent == root_.get()) ev.first_block_salt = node->first_page_salt;
  ev.token_ids = node->tokens;
  ev.block_size = options_.page_size;
  ev.medium = medium;
  emit(std::move(ev));
}

BlockHash RadixTree::last_hash(const RadixNode* node) const {
  return node == root_.get() ? options_.hasher.root().hash : node->hashes.back();
}

ChainValue RadixTree::last_chain(const RadixNode* node) const {
  if (node == root_.get()) return options_.hasher.root();
  return ChainValue{.hash = node->hashes.back(),
                    .tail = node->chain_tails.empty() ? ChainTail{} : node->chain_tails.back()};
}

RadixNode* RadixTree::find_child(const RadixNode* parent, std::span<const TokenId> first_page,
                                 std::string_view extra) const {
  const std::string_view first_extra = parent == root_.get() ? extra : std::string_view();
  // Strata's own hash straight (the hot path); a digest chain through the hasher.
  const BlockHash h = options_.hasher.chains_digests()
                          ? options_.hasher.hash(last_chain(parent), first_page, first_extra).hash
                          : hash_block(last_hash(parent), first_page, first_extra);
  const auto it = index_.find_first(h);  // a node's first block: never deferred
  if (it == index_.end()) return nullptr;
  const Loc& loc = it->second;
  if (loc.offset != 0 || loc.node->parent != parent) return nullptr;
  // Guard against a 64-bit collision: the tokens decide.
  if (!same_tokens(loc.node->tokens.data(), first_page.data(), options_.page_size)) return nullptr;
  return loc.node;
}

void RadixTree::touch(RadixNode* node, uint64_t tick, int64_t now_ms) {
  const bool was_in = node->in_evictable_set;
  const bool was_in_host = node->in_host_evictable_set;
  leave_sets(node);
  node->last_access_tick = tick;
  node->last_access_ms = now_ms;
  if (was_in) update_evictable(node);
  if (was_in_host) update_host_evictable(node);
}

void RadixTree::add_lock_ref(RadixNode* node, int32_t delta) {
  for (RadixNode* n = node; n != root_.get(); n = n->parent) {
    // Only a change between locked and unlocked can change the counters or the sets.
    if ((n->lock_ref > 0) == (n->lock_ref + delta > 0)) {
      n->lock_ref += delta;
      STRATA_CHECK_MSG(n->lock_ref >= 0, "lock_ref underflow at " + describe(n));
      continue;
    }
    const Acct before = acct(n);
    const bool was_locked = n->lock_ref > 0;
    n->lock_ref += delta;
    STRATA_CHECK_MSG(n->lock_ref >= 0, "lock_ref underflow at " + describe(n));
    if (was_locked != (n->lock_ref > 0)) stats_.locked_nodes += n->lock_ref > 0 ? 1 : -1;
    apply(before, acct(n));
    update_sets(n);
    if (n->lock_ref == 0) try_demote(n);
  }
}

RadixNode* RadixTree::split(RadixNode* node, int32_t at) {
  STRATA_CHECK(node != root_.get());
  STRATA_CHECK(at > 0 && at < node->num_pages());
  const int32_t ps = options_.page_size;
  const Acct before = acct(node);
  leave_sets(node);

  std::unique_ptr<RadixNode> upper_owned = new_node();
  RadixNode* upper = upper_owned.get();
  upper->id = next_node_id_++;
  upper->parent = node->parent;
  move_prefix(node->tokens, upper->tokens, static_cast<size_t>(at) * static_cast<size_t>(ps));
  move_prefix(node->hashes, upper->hashes, static_cast<size_t>(at));
  move_prefix(node->chain_tails, upper->chain_tails, static_cast<size_t>(at));
  move_prefix(node->pin_counts, upper->pin_counts, static_cast<size_t>(at));
  move_prefix(node->device_pages, upper->device_pages, static_cast<size_t>(at));
  move_prefix(node->host_pages, upper->host_pages, static_cast<size_t>(at));
  move_prefix(node->in_storage, upper->in_storage, static_cast<size_t>(at));
  upper->first_page_salt = std::move(node->first_page_salt);
  node->first_page_salt.clear();
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
      if (pins_.soft_count(h) > 0) ++upper->soft_pinned_blocks;
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

  index_.split(upper, node);

  ++stats_.num_nodes;
  if (upper->lock_ref > 0) ++stats_.locked_nodes;
  Acct after = acct(upper);
  const Acct lower_acct = acct(node);
  after.device += lower_acct.device;
  after.host += lower_acct.host;
  after.host_only += lower_acct.host_only;
  after.prot += lower_acct.prot;
  after.host_prot += lower_acct.host_prot;
  after.bound += lower_acct.bound;
  after.stored += lower_acct.stored;
  after.io += lower_acct.io;
  apply(before, after);
  update_sets(node);
  update_sets(upper);
  return upper;
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
  // Pages 1.. of the child: whole runs of kRunPages pages in one comparison while they
  // agree (one call instead of one per page), then page by page to find the mismatch.
  constexpr int32_t kRunPages = 16;
  const auto same_pages = [&](int32_t from, int32_t count) {
    return same_tokens(child->tokens.data() + static_cast<size_t>(from) * ps,
                       tokens.data() + static_cast<size_t>(at_page + from) * ps, count * ps);
  };
  int32_t j = 1;
  while (limit - j >= kRunPages && same_pages(j, kRunPages)) j += kRunPages;
  while (j < limit && same_pages(j, 1)) ++j;
  partial = j < child->num_pages();
  if (partial) child = split(child, j);
  matched = j;
  return child;
}

MatchResult RadixTree::match_prefix(std::span<const TokenId> tokens, std::string_view cache_salt) {
  ++stats_.match_calls;
  MatchResult result;
  const int32_t ps = options_.page_size;
  const int32_t n_pages = static_cast<int32_t>(tokens.size() / static_cast<size_t>(ps));
  const std::string extra = options_.hasher.first_page_extra_keys(cache_salt);
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
      for (BlockHash h : child->hashes) pins_.refresh(h, now_ms);
    }
    node = child;
    i += j;
    if (partial) break;
  }
  result.num_pages = i;
  result.last_node = node;
  stats_.matched_pages_total += static_cast<uint64_t>(i);
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
  const int32_t n_pages = static_cast<int32_t>(tokens.size() / static_cast<size_t>(page_size()));
  STRATA_CHECK_MSG(static_cast<int32_t>(pages.size()) == n_pages,
                   "insert: " + std::to_string(pages.size()) + " pages for " +
                       std::to_string(n_pages) + " full pages of tokens");
  return insert_blocks(tokens, cache_salt, InsertPages{Medium::kDevice, 0, pages});
}

InsertResult RadixTree::insert_host(std::span<const TokenId> tokens, int32_t first_page,
                                    std::span<const PageId> host_pages,
                                    std::string_view cache_salt) {
  STRATA_CHECK(hierarchical());
  const int32_t n_pages = static_cast<int32_t>(tokens.size() / static_cast<size_t>(page_size()));
  STRATA_CHECK(first_page >= 0 && first_page + static_cast<int32_t>(host_pages.size()) == n_pages);
  return insert_blocks(tokens, cache_salt, InsertPages{Medium::kHost, first_page, host_pages});
}

// Walks the cached prefix, then hangs one new leaf with the rest below it.
//  - Device pages: a block the tree has only on the host takes the passed page as its
//    device copy (the caller computed it again); a passed page that differs from the
//    tree's own is rejected. block_hashes lists every block of `tokens`.
//  - Host pages (blocks read from storage): a block the tree has in any tier rejects
//    its passed page; if the cached prefix ends before first_page the new blocks cannot
//    hang below it and every page is rejected. block_hashes lists the new blocks.
// A first block whose hash is cached elsewhere is a 64-bit collision (the tokens differ,
// or descend would have matched): no leaf is made and its pages are rejected, rather than
// corrupt the index. A collision further into the leaf is only seen when the index gets to
// that block (block_index.h).
InsertResult RadixTree::insert_blocks(std::span<const TokenId> tokens, std::string_view cache_salt,
                                      const InsertPages& in) {
  InsertResult result;
  const bool device = in.medium == Medium::kDevice;
  const int32_t ps = options_.page_size;
  const int32_t n_pages = static_cast<int32_t>(tokens.size() / static_cast<size_t>(ps));
  result.block_hashes.reserve(static_cast<size_t>(n_pages));
  const auto page_of = [&](int32_t k) { return in.pages[static_cast<size_t>(k - in.first_page)]; };
  const std::string extra = options_.hasher.first_page_extra_keys(cache_salt);
  const uint64_t tick = ++tick_;
  const int64_t now_ms = clock_->now_ms();
  RadixNode* node = root_.get();
  int32_t i = 0;
  while (i < n_pages) {
    int32_t j = 0;
    bool partial = false;
    RadixNode* child = descend(node, tokens, i, extra, j, partial, Walk::kAnyTier);
    if (child == nullptr) break;
    if (device) {
      if (!child->has_device_pages()) {
        // On the host only: adopt the passed pages as the device copy instead of keeping
        // two.
        const Acct before = acct(child);
        child->demote_pending = false;
        child->device_pages.assign(in.pages.begin() + i, in.pages.begin() + i + j);
        apply(before, acct(child));
        update_sets(child);
        update_sets(node);
        emit_stored(child, Medium::kDevice);
      }
      for (int32_t k = 0; k < j; ++k) {
        const PageId passed = page_of(i + k);
        if (passed != child->device_pages[static_cast<size_t>(k)]) {
          result.rejected_pages.push_back(passed);
        }
      }
      result.block_hashes.insert(result.block_hashes.end(), child->hashes.begin(),
                                 child->hashes.end());
    }
    touch(child, tick, now_ms);
    node = child;
    i += j;
    if (partial) break;
  }
  result.num_existing_pages = i;
  result.last_node = node;
  // Host pages of blocks the tree has, or that cannot hang below what it has, go back.
  const int32_t from = std::max(i, in.first_page);
  if (!device) {
    for (int32_t k = in.first_page; k < from; ++k) result.rejected_pages.push_back(page_of(k));
  }
  if (i < in.first_page || i == n_pages) {
    for (int32_t k = from; k < n_pages; ++k) result.rejected_pages.push_back(page_of(k));
    return result;
  }

  // A new leaf under `node` with pages i..n_pages, hashes chained from node's last.
  std::unique_ptr<RadixNode> leaf_owned = new_node();
  RadixNode* leaf = leaf_owned.get();
  leaf->hashes.resize(static_cast<size_t>(n_pages - i));
  const auto extra_of = [&](int32_t k) {
    return (node == root_.get() && k == i) ? std::string_view(extra) : std::string_view();
  };
  if (!options_.hasher.chains_digests()) {
    BlockHash parent_hash = last_hash(node);
    for (int32_t k = i; k < n_pages; ++k) {
      parent_hash =
          hash_block(parent_hash, tokens.subspan(static_cast<size_t>(k) * ps, ps), extra_of(k));
      leaf->hashes[static_cast<size_t>(k - i)] = parent_hash;
      // The one entry made now (block_index.h): start its miss while the rest is hashed.
      if (k == i) index_.prefetch(parent_hash);
    }
  } else {
    ChainValue parent = last_chain(node);
    leaf->chain_tails.resize(static_cast<size_t>(n_pages - i));
    for (int32_t k = i; k < n_pages; ++k) {
      parent = options_.hasher.hash(parent, tokens.subspan(static_cast<size_t>(k) * ps, ps),
                                    extra_of(k));
      leaf->hashes[static_cast<size_t>(k - i)] = parent.hash;
      leaf->chain_tails[static_cast<size_t>(k - i)] = parent.tail;
      if (k == i) index_.prefetch(parent.hash);
    }
  }
  // A first block that the index has already (a collision) makes no node.
  if (!index_.add(leaf)) {
    for (int32_t k = i; k < n_pages; ++k) result.rejected_pages.push_back(page_of(k));
    recycle_node(std::move(leaf_owned));
    return result;
  }
  const int32_t count = n_pages - i;

  leaf->id = next_node_id_++;
  leaf->parent = node;
  leaf->tokens.assign(tokens.begin() + static_cast<std::ptrdiff_t>(i) * ps,
                      tokens.begin() + static_cast<std::ptrdiff_t>(i + count) * ps);
  const auto first = in.pages.begin() + (i - in.first_page);
  if (device) {
    leaf->device_pages.assign(first, first + count);
  } else {
    leaf->device_pages.assign(static_cast<size_t>(count), kInvalidPage);
    leaf->host_pages.assign(first, first + count);
    leaf->host_valid = true;
    leaf->in_storage.assign(static_cast<size_t>(count), 1);
  }
  leaf->pin_counts.assign(static_cast<size_t>(count), 0);
  if (node == root_.get()) leaf->first_page_salt = cache_salt;
  leaf->last_access_tick = tick;
  leaf->last_access_ms = now_ms;
  leaf->index_in_parent = static_cast<uint32_t>(node->children.size());
  node->children.push_back(std::move(leaf_owned));
  update_sets(node);  // no longer a leaf
  ++stats_.num_nodes;
  apply(Acct{}, acct(leaf));
  if (device) {
    stats_.inserted_pages_total += static_cast<uint64_t>(count);
    count_recomputed(leaf, now_ms);
  }
  update_sets(leaf);
  emit_stored(leaf, in.medium);
  if (device && hierarchical() && options_.write_policy == WritePolicy::kWriteThrough) {
    start_backup(leaf);
  }

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
  ++stats_.outstanding_locks;
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
  --stats_.outstanding_locks;
  return {};
}

std::vector<BlockHash> RadixTree::block_hashes_of(std::span<const TokenId> tokens,
                                                  std::string_view cache_salt) const {
  return options_.hasher.hash_blocks(tokens, options_.page_size, cache_salt);
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

int64_t RadixTree::unevictable_pages() const {
  if (!hierarchical() || backup_bound_pages_ == 0) return stats_.protected_pages;
  // Pinned pages leave the device by a backup and a demotion: as many as the host can take.
  const int64_t host_room = host_pages_->num_free() + stats_.host_evictable_pages;
  return stats_.protected_pages + std::max<int64_t>(0, backup_bound_pages_ - host_room);
}

void RadixTree::count_recomputed(const RadixNode* leaf, int64_t now_ms) {
  if (evicted_.size() == 0) return;
  int64_t n = 0;
  for (BlockHash h : leaf->hashes) n += evicted_.take(h);
  if (n == 0) return;
  stats_.recomputed_pages_total += static_cast<uint64_t>(n);
  recomputed_recent_ = recomputed_pages_recent() + static_cast<double>(n);
  recomputed_recent_ms_ = now_ms;
}

double RadixTree::recomputed_pages_recent() const {
  if (recomputed_recent_ == 0.0) return 0.0;
  const int64_t elapsed = std::max<int64_t>(0, clock_->now_ms() - recomputed_recent_ms_);
  return recomputed_recent_ *
         std::exp(-static_cast<double>(elapsed) / static_cast<double>(kRecomputedWindowMs));
}

TreeStats RadixTree::stats() const {
  TreeStats s = stats_;
  s.page_size = options_.page_size;
  s.hierarchical = hierarchical();
  s.unevictable_pages = unevictable_pages();
  s.pinned_blocks = pins_.pinned_blocks();
  s.soft_pinned_blocks = pins_.soft_pinned_blocks();
  s.host_capacity_pages = hierarchical() ? host_pages_->num_pages() : 0;
  return s;
}

NodeSnapshot RadixTree::snapshot_of(const RadixNode& n) const {
  NodeSnapshot s;
  s.id = n.id;
  s.parent_id = n.parent->id;
  s.num_tokens = static_cast<int32_t>(n.tokens.size());
  s.block_hashes = n.hashes;
  s.pin_counts = n.pin_counts;
  s.lock_ref = n.lock_ref;
  s.pin_ref = n.pin_ref;
  s.soft_pinned_blocks = n.soft_pinned_blocks;
  s.soft_pin_ttl_ms.reserve(n.hashes.size());
  for (size_t k = 0; k < n.hashes.size(); ++k) {
    s.soft_pin_ttl_ms.push_back(n.pin_counts[k] > 0 ? pins_.max_soft_ttl_ms(n.hashes[k]) : 0);
  }
  s.last_access_ms = n.last_access_ms;
  s.hit_count = n.hit_count;
  s.on_device = n.on_device();
  s.on_host = n.on_host();
  s.in_storage = n.stored();
  s.loading = n.loading;
  s.host_ref = n.host_ref;
  s.evictable = n.in_evictable_set || n.in_host_evictable_set;
  return s;
}

std::vector<NodeSnapshot> RadixTree::snapshot() const {
  std::vector<NodeSnapshot> out;
  std::vector<const RadixNode*> stack;
  for (const auto& c : root_->children) stack.push_back(c.get());
  while (!stack.empty()) {
    const RadixNode* n = stack.back();
    stack.pop_back();
    out.push_back(snapshot_of(*n));
    for (const auto& c : n->children) stack.push_back(c.get());
  }
  return out;
}

const RadixNode* RadixTree::find_node(NodeId id) const {
  if (id == root_->id) return nullptr;
  std::vector<const RadixNode*> stack{root_.get()};
  while (!stack.empty()) {
    const RadixNode* n = stack.back();
    stack.pop_back();
    if (n->id == id) return n;
    for (const auto& c : n->children) stack.push_back(c.get());
  }
  return nullptr;
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

}  // namespace strata
