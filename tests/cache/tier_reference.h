// Test helpers for the tiered (hierarchical) radix tree: a per-medium replay of the event
// stream, the tree's per-tier residency as snapshot() reports it, and a direct view of each
// block's pages and copy state read from the tree's nodes.
//
// Ownership: views hold raw pointers into the tree; they are valid until the tree changes.
// Thread: single-threaded, like the tree.
#pragma once

#include <array>
#include <set>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "cache/kv_event.h"
#include "cache/radix_tree.h"

namespace strata::tier_test {

// Hashes [from, to) of a block hash list.
inline std::vector<BlockHash> slice(const std::vector<BlockHash>& v, size_t from, size_t to) {
  return std::vector<BlockHash>(v.begin() + static_cast<std::ptrdiff_t>(from),
                                v.begin() + static_cast<std::ptrdiff_t>(to));
}

// One block as its node holds it.
struct BlockView {
  const RadixNode* node = nullptr;
  int32_t offset = 0;

  PageId device_page() const { return node->device_pages[static_cast<size_t>(offset)]; }
  PageId host_page() const {
    return node->host_pages.empty() ? kInvalidPage : node->host_pages[static_cast<size_t>(offset)];
  }
  bool has_device_pages() const { return node->has_device_pages(); }  // readable or loading
  bool on_device() const { return node->on_device(); }                // readable
  bool loading() const { return node->loading; }
  bool on_host() const { return node->on_host(); }  // a valid host copy
  bool backup_in_flight() const { return node->has_host_pages() && !node->host_valid; }
  bool host_only() const { return node->on_host() && !node->has_device_pages(); }
  bool stored() const {
    return !node->in_storage.empty() && node->in_storage[static_cast<size_t>(offset)] != 0;
  }
};

// Every block of the tree, found by walking it from the root.
inline std::unordered_map<BlockHash, BlockView> view_blocks(const RadixTree& tree) {
  std::unordered_map<BlockHash, BlockView> out;
  std::vector<const RadixNode*> stack{tree.root()};
  while (!stack.empty()) {
    const RadixNode* n = stack.back();
    stack.pop_back();
    for (int32_t k = 0; k < n->num_pages(); ++k) {
      out[n->hashes[static_cast<size_t>(k)]] = BlockView{n, k};
    }
    for (const auto& c : n->children) stack.push_back(c.get());
  }
  return out;
}

// Every node of the tree except the root.
inline std::vector<const RadixNode*> all_nodes(const RadixTree& tree) {
  std::vector<const RadixNode*> out;
  std::vector<const RadixNode*> stack{tree.root()};
  while (!stack.empty()) {
    const RadixNode* n = stack.back();
    stack.pop_back();
    if (n != tree.root()) out.push_back(n);
    for (const auto& c : n->children) stack.push_back(c.get());
  }
  return out;
}

// The blocks per tier, as snapshot() reports them.
struct Residency {
  std::set<BlockHash> device;   // on_device: readable device copy
  std::set<BlockHash> host;     // on_host: valid host copy
  std::set<BlockHash> storage;  // in_storage (per node)
  std::set<BlockHash> all;      // every block of the tree
};

inline Residency residency_of(const RadixTree& tree) {
  Residency r;
  for (const NodeSnapshot& s : tree.snapshot()) {
    for (BlockHash h : s.block_hashes) {
      r.all.insert(h);
      if (s.on_device) r.device.insert(h);
      if (s.on_host) r.host.insert(h);
      if (s.in_storage) r.storage.insert(h);
    }
  }
  return r;
}

// "+h" for blocks only in `a`, "-h" for blocks only in `b`: what makes two sets differ.
inline std::string set_diff(const std::set<BlockHash>& a, const std::set<BlockHash>& b) {
  std::string out;
  for (BlockHash h : a) {
    if (!b.contains(h)) out += " +" + std::to_string(h);
  }
  for (BlockHash h : b) {
    if (!a.contains(h)) out += " -" + std::to_string(h);
  }
  return out;
}

// Rebuilds per-medium block sets from the event stream. Device and host are exact sets:
// storing a block twice in one medium, or removing one that is absent, is an error. The
// storage medium only grows (the tree never removes blocks from shared storage, and may
// announce a block again after it re-entered the tree).
class MediumReplay {
 public:
  // Applies one event; returns a description of an impossible event, or "".
  std::string apply(const KvEvent& event) {
    if (const auto* st = std::get_if<BlockStored>(&event)) {
      auto& set = sets_[index(st->medium)];
      for (BlockHash h : st->block_hashes) {
        if (!set.insert(h).second && st->medium != Medium::kStorage) {
          return "stored twice on " + std::string(medium_wire_name(st->medium));
        }
      }
    } else if (const auto* rm = std::get_if<BlockRemoved>(&event)) {
      if (rm->medium == Medium::kStorage) return "a block removed from storage";
      auto& set = sets_[index(rm->medium)];
      for (BlockHash h : rm->block_hashes) {
        if (set.erase(h) != 1) {
          return "removed while absent from " + std::string(medium_wire_name(rm->medium));
        }
      }
    } else {
      for (auto& s : sets_) s.clear();
    }
    return {};
  }
  const std::set<BlockHash>& blocks(Medium m) const { return sets_[index(m)]; }
  bool has(Medium m, BlockHash h) const { return blocks(m).contains(h); }

 private:
  static size_t index(Medium m) { return static_cast<size_t>(m); }
  std::array<std::set<BlockHash>, 3> sets_;
};

}  // namespace strata::tier_test
