// The order in which evictable nodes leave a tier.
//
// Contract. The tree decides *which* nodes are evictable (unprotected device leaves, and
// unprotected host-only leaves) and tells the policy through insert() and erase(); the
// policy decides only the *order* in which victim() offers them. Two sets are kept:
// EvictionSet::kDevice and EvictionSet::kHostOnly; a node is in each at most once, and
// the tree mirrors membership in RadixNode::in_evictable_set / in_host_evictable_set.
//
// Keys. A policy orders nodes by a key it reads from the node when inserting. The tree
// never changes a field a policy may read (last_access_tick, last_access_ms, id) while the
// node is in a set: it erases the node, changes the field and inserts it again (an
// access moves a node). A policy that keys on something else (TensorRT-LLM-style
// retention priority per token range, valid for a duration: key (priority, last access))
// reads new node fields under the same rule and, for priorities that lapse with time,
// re-keys its nodes itself from the clock it is given.
//
// Cost: insert, erase and victim are O(log n) on an ordered set kept incrementally;
// nothing scans the tree. The set is a B-tree (absl::btree_set: many keys a cache line, a
// few lines a search) rather than a red-black tree's node per key: a pin or an unpin moves a
// node out of the set or into it, and a thousand spread pins spent a fifth of their time in
// the red-black tree's pointer chasing (issue 56).
//
// Thread: not thread-safe; the tree's owner thread (the scheduler) calls it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include <absl/container/btree_set.h>
#include <absl/functional/function_ref.h>

#include "cache/radix_node.h"

namespace strata {

enum class EvictionSet : uint8_t {
  kDevice,    // device leaves: evict() frees (or demotes) them
  kHostOnly,  // host-only leaves: evict_host() drops them
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;

  virtual std::string_view name() const = 0;
  // Adds `node` to `set`. Precondition: not in it.
  virtual void insert(EvictionSet set, RadixNode* node) = 0;
  // Removes `node` from `set`. Precondition: in it, with the key it was inserted with.
  virtual void erase(EvictionSet set, RadixNode* node) = 0;
  // The first node of `set` in eviction order that `skip` does not reject; null when
  // none. Does not remove it.
  virtual RadixNode* victim(EvictionSet set,
                            absl::FunctionRef<bool(const RadixNode*)> skip) const = 0;
  virtual RadixNode* victim(EvictionSet set) const = 0;
  // For audits: whether `node` is in `set` under its current key.
  virtual bool contains(EvictionSet set, const RadixNode* node) const = 0;
  virtual size_t size(EvictionSet set) const = 0;
  // Empties both sets (the tree dropped every node).
  virtual void clear() = 0;
};

// Least recently used first: key (last_access_tick, id); ids break ties between nodes
// touched by one operation (a split's halves share a tick).
class LruEvictionPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "lru"; }
  void insert(EvictionSet set, RadixNode* node) override;
  void erase(EvictionSet set, RadixNode* node) override;
  RadixNode* victim(EvictionSet set, absl::FunctionRef<bool(const RadixNode*)> skip) const override;
  RadixNode* victim(EvictionSet set) const override;
  bool contains(EvictionSet set, const RadixNode* node) const override;
  size_t size(EvictionSet set) const override { return of(set).size(); }
  void clear() override;

 private:
  struct Key {
    uint64_t tick;
    NodeId id;
    RadixNode* node;
    bool operator<(const Key& o) const { return tick != o.tick ? tick < o.tick : id < o.id; }
  };
  static Key key_of(const RadixNode* node) {
    return Key{node->last_access_tick, node->id, const_cast<RadixNode*>(node)};
  }
  absl::btree_set<Key>& of(EvictionSet set) {
    return set == EvictionSet::kDevice ? device_ : host_only_;
  }
  const absl::btree_set<Key>& of(EvictionSet set) const {
    return set == EvictionSet::kDevice ? device_ : host_only_;
  }

  absl::btree_set<Key> device_;     // unprotected device leaves, LRU first
  absl::btree_set<Key> host_only_;  // unprotected host-only leaves, LRU first
};

std::unique_ptr<EvictionPolicy> make_lru_eviction_policy();

}  // namespace strata
