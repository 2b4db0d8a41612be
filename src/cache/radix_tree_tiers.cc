// Tiers (hierarchical cache): back-up, demotion, load-back, the transfer requests and
// their completion, host eviction, storage writes, tool-session host protection and
// offload_path.
//
// Contract: the tree decides what moves and allocates the destination pages; the bytes
// move on the engine's transfer threads. A node with a copy in flight holds io_ref (never
// evicted meanwhile); a loading node is invisible to match_prefix; a node marked
// demote_pending leaves the device once it is backed up, unlocked and a device leaf.
// Every completion finds its blocks by hash, so splits during a transfer are harmless:
// each part carries the transfer's io_ref and is finished once.
#include "cache/radix_tree.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/check.h"

namespace strata {

bool RadixTree::is_device_leaf(const RadixNode* node) const {
  if (node->children.empty()) return true;
  // Without a host tier every node holds device pages (the audit checks it): a node with
  // children is no device leaf, and a stem of a hundred conversations is not scanned at
  // each of its pins (issue 56).
  if (!hierarchical()) return false;
  for (const auto& c : node->children) {
    if (c->has_device_pages()) return false;
  }
  return true;
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
      ++stats_.backups_skipped_total;
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
  stats_.demoted_pages_total += static_cast<uint64_t>(node->num_pages());
  stats_.evicted_pages_total += static_cast<uint64_t>(node->num_pages());
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

int32_t RadixTree::evict_host(int32_t num_pages) {
  const bool batch = begin_unindex_batch();
  const EvictionScope scope(*this, EvictReason::kRoom);
  int32_t freed = 0;
  while (freed < num_pages) {
    RadixNode* leaf = eviction_->victim(EvictionSet::kHostOnly);
    if (leaf == nullptr) break;
    freed += leaf->num_pages();
    remove_leaf(leaf);
  }
  end_unindex_batch(batch);
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
        stats_.backed_up_pages_total += static_cast<uint64_t>(n->num_pages());
      } else {
        host_pages_->free(n->host_pages);
        n->host_pages.clear();
        n->host_valid = false;
        n->demote_pending = false;
      }
    } else {
      n->loading = false;
      if (ok) {
        stats_.loaded_pages_total += static_cast<uint64_t>(n->num_pages());
      } else {
        device_pages_->free(n->device_pages);
        std::fill(n->device_pages.begin(), n->device_pages.end(), kInvalidPage);
      }
    }
    apply(before, acct(n));
    update_sets(n);
    if (n->parent != root_.get()) update_sets(n->parent);
    if (ok)
      emit_stored(n, request.direction == TransferDirection::kDeviceToHost ? Medium::kHost
                                                                           : Medium::kDevice);
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
      } else {
        run.first_block_salt = n->first_page_salt;
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

}  // namespace strata
