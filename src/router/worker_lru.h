// The one shape of the router's string-keyed tables (session bindings, response bindings,
// turn records): entries by key, each on one worker, kept in least-recently-used order,
// with a count per worker. The tables above it decide what an entry holds, when one is
// dropped (their bounds: a count, bytes, a TTL) and what they count; this keeps the list,
// the index and the per-worker counts consistent through every change.
//
// Contract. A plain data structure: no clock, no lock (its owner's lock covers it), no I/O.
// Iterators stay valid until their entry is erased (a std::list underneath); touch() and
// set_worker() keep them. The index's keys view the entries' own strings, so a key is
// stored once.
#pragma once

#include <cstdint>
#include <iterator>
#include <list>
#include <string>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "common/check.h"

namespace strata::router {

template <typename Value>
class WorkerLru {
 public:
  struct Entry {
    std::string key;
    uint32_t worker = 0;
    Value value;
  };
  using List = std::list<Entry>;  // most recently used first
  using iterator = typename List::iterator;
  using const_iterator = typename List::const_iterator;

  iterator end() { return lru_.end(); }
  const_iterator end() const { return lru_.end(); }
  // The least recently used entry; end() when empty.
  iterator oldest() { return lru_.empty() ? lru_.end() : std::prev(lru_.end()); }
  const_iterator oldest() const { return lru_.empty() ? lru_.end() : std::prev(lru_.end()); }

  // The entry of `key`, or end(). Not refreshed.
  iterator find(std::string_view key) {
    auto found = index_.find(key);
    return found == index_.end() ? lru_.end() : found->second;
  }
  const_iterator find(std::string_view key) const {
    auto found = index_.find(key);
    return found == index_.end() ? lru_.end() : const_iterator(found->second);
  }

  // Makes `key`'s entry the most recently used.
  void touch(iterator it) { lru_.splice(lru_.begin(), lru_, it); }

  // A new entry for `key` (which must not be present), the most recently used.
  iterator insert(std::string_view key, uint32_t worker, Value value) {
    STRATA_CHECK(!index_.contains(key));
    lru_.push_front(Entry{std::string(key), worker, std::move(value)});
    index_.emplace(std::string_view(lru_.front().key), lru_.begin());
    ++per_worker_[worker];
    return lru_.begin();
  }

  // Moves the entry to `worker` (its counts follow).
  void set_worker(iterator it, uint32_t worker) {
    if (it->worker == worker) return;
    decrement(it->worker);
    ++per_worker_[worker];
    it->worker = worker;
  }

  void erase(iterator it) {
    decrement(it->worker);
    index_.erase(std::string_view(it->key));
    lru_.erase(it);
  }

  // Erases `key`'s entry; false: there was none.
  bool erase(std::string_view key) {
    auto it = find(key);
    if (it == lru_.end()) return false;
    erase(it);
    return true;
  }

  // Erases every entry on `worker`, calling on_erase(entry) before each; returns how many.
  int64_t erase_worker(uint32_t worker) {
    return erase_worker(worker, [](const Entry&) {});
  }
  template <typename F>
  int64_t erase_worker(uint32_t worker, F on_erase) {
    int64_t n = 0;
    for (auto it = lru_.begin(); it != lru_.end();) {
      auto next = std::next(it);
      if (it->worker == worker) {
        on_erase(*it);
        erase(it);
        ++n;
      }
      it = next;
    }
    return n;
  }

  // Entries on `worker`.
  int64_t count_on(uint32_t worker) const {
    auto it = per_worker_.find(worker);
    return it == per_worker_.end() ? 0 : it->second;
  }
  // Every worker with at least one entry, and its count (unordered).
  const absl::flat_hash_map<uint32_t, int64_t>& per_worker() const { return per_worker_; }

  int64_t size() const { return static_cast<int64_t>(lru_.size()); }
  bool empty() const { return lru_.empty(); }

 private:
  struct KeyHash {
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  void decrement(uint32_t worker) {
    auto it = per_worker_.find(worker);
    STRATA_CHECK(it != per_worker_.end() && it->second > 0);
    if (--it->second == 0) per_worker_.erase(it);
  }

  List lru_;
  absl::flat_hash_map<std::string_view, iterator, KeyHash> index_;  // keys view Entry::key
  absl::flat_hash_map<uint32_t, int64_t> per_worker_;
};

}  // namespace strata::router
