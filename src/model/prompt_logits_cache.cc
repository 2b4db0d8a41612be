#include "model/prompt_logits_cache.h"

#include <xxhash.h>

#include <algorithm>
#include <iterator>

namespace strata {

uint64_t PromptLogitsCache::key_of(std::span<const int32_t> tokens, std::string_view salt) {
  const uint64_t salt_hash = XXH3_64bits(salt.data(), salt.size());
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), salt_hash);
}

PromptLogitsCache::List::iterator PromptLogitsCache::lookup(uint64_t key,
                                                            std::span<const int32_t> tokens,
                                                            std::string_view salt) {
  auto [first, last] = index_.equal_range(key);
  for (auto it = first; it != last; ++it) {
    const Entry& e = *it->second;
    if (e.salt == salt &&
        std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin(), tokens.end()))
      return it->second;
  }
  return entries_.end();
}

void PromptLogitsCache::erase(List::iterator it) {
  auto [first, last] = index_.equal_range(it->key);
  for (auto i = first; i != last; ++i) {
    if (i->second == it) {
      index_.erase(i);
      break;
    }
  }
  bytes_ -= it->bytes();
  entries_.erase(it);
}

void PromptLogitsCache::put(std::span<const int32_t> tokens, std::string_view salt,
                            std::span<const float> logits) {
  const size_t need = salt.size() + tokens.size_bytes() + logits.size_bytes();
  const uint64_t key = key_of(tokens, salt);
  if (auto it = lookup(key, tokens, salt); it != entries_.end()) erase(it);
  if (need > capacity_bytes_) return;
  while (bytes_ + need > capacity_bytes_) erase(std::prev(entries_.end()));
  Entry entry;
  entry.key = key;
  entry.salt.assign(salt);
  entry.tokens.assign(tokens.begin(), tokens.end());
  entry.logits.assign(logits.begin(), logits.end());
  entries_.push_front(std::move(entry));
  index_.emplace(key, entries_.begin());
  bytes_ += need;
}

std::span<const float> PromptLogitsCache::find(std::span<const int32_t> tokens,
                                               std::string_view salt) {
  if (entries_.empty()) {
    ++misses_;
    return {};
  }
  auto it = lookup(key_of(tokens, salt), tokens, salt);
  if (it == entries_.end()) {
    ++misses_;
    return {};
  }
  ++hits_;
  entries_.splice(entries_.begin(), entries_, it);  // iterators stay valid
  return it->logits;
}

void PromptLogitsCache::clear() {
  entries_.clear();
  index_.clear();
  bytes_ = 0;
}

}  // namespace strata
