#include "cache/eviction_policy.h"

#include <iterator>
#include <string>

#include "common/check.h"

namespace strata {

void LruEvictionPolicy::insert(EvictionSet set, RadixNode* node) {
  const bool added = of(set).insert(key_of(node)).second;
  STRATA_CHECK_MSG(added, "eviction policy: node " + std::to_string(node->id) + " inserted twice");
}

void LruEvictionPolicy::erase(EvictionSet set, RadixNode* node) {
  const size_t erased = of(set).erase(key_of(node));
  STRATA_CHECK_MSG(erased == 1, "eviction policy: node " + std::to_string(node->id) +
                                    " erased but not in the set under its key");
}

RadixNode* LruEvictionPolicy::victim(EvictionSet set,
                                     absl::FunctionRef<bool(const RadixNode*)> skip) const {
  for (const Key& k : of(set)) {
    if (!skip(k.node)) return k.node;
  }
  return nullptr;
}

RadixNode* LruEvictionPolicy::victim(EvictionSet set) const {
  const absl::btree_set<Key>& s = of(set);
  if (s.empty()) return nullptr;
  // An eviction takes the victims one after the other: start loading the next one's
  // node now, so that it is in the cache when its turn comes (a pure hint).
  if (const auto next = std::next(s.begin()); next != s.end()) {
    const char* p = reinterpret_cast<const char*>(next->node);
    for (size_t at = 0; at < sizeof(RadixNode); at += 64) __builtin_prefetch(p + at);
  }
  return s.begin()->node;
}

bool LruEvictionPolicy::contains(EvictionSet set, const RadixNode* node) const {
  return of(set).contains(key_of(node));
}

void LruEvictionPolicy::clear() {
  device_.clear();
  host_only_.clear();
}

std::unique_ptr<EvictionPolicy> make_lru_eviction_policy() {
  return std::make_unique<LruEvictionPolicy>();
}

}  // namespace strata
