// The last-position logits of recently computed prompts, so that a prompt seen again (a
// full prefix hit) samples its first token without a forward pass (docs/full-hit.md).
//
// Why this is exact: the logits at a prompt's last position are a function of the model and
// the prompt's tokens only (not of which pages hold the KV, nor of the batch it ran in, up to
// float summation order), so an entry stays valid for the model's lifetime. Entries are
// keyed by (cache_salt, tokens) and compared token by token on lookup: a hash collision
// never serves another prompt's logits, and a tenant's salt keeps its prompts apart as it
// does in the radix tree.
//
// Bounded: entries are evicted least recently used first so that their bytes (logits and
// tokens) stay within the budget given at construction; an entry larger than the whole
// budget is not kept.
//
// Thread: not thread-safe; one owner (the engine's scheduler thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace strata {

class PromptLogitsCache {
 public:
  // capacity_bytes: the most bytes of logits and tokens kept (0: keeps nothing).
  explicit PromptLogitsCache(size_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}
  PromptLogitsCache(const PromptLogitsCache&) = delete;
  PromptLogitsCache& operator=(const PromptLogitsCache&) = delete;

  // Remembers the logits computed at the last position of `tokens` (under `salt`),
  // replacing an entry for the same key; it becomes the most recently used.
  void put(std::span<const int32_t> tokens, std::string_view salt, std::span<const float> logits);

  // The logits remembered for exactly these tokens under this salt, or an empty span. A hit
  // becomes the most recently used. The span is valid until the next put() or clear().
  std::span<const float> find(std::span<const int32_t> tokens, std::string_view salt);

  void clear();

  size_t size() const { return entries_.size(); }
  size_t bytes() const { return bytes_; }
  size_t capacity_bytes() const { return capacity_bytes_; }
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }

 private:
  struct Entry {
    uint64_t key = 0;
    std::string salt;
    std::vector<int32_t> tokens;
    std::vector<float> logits;
    size_t bytes() const {
      return salt.size() + tokens.size() * sizeof(int32_t) + logits.size() * sizeof(float);
    }
  };
  using List = std::list<Entry>;  // most recently used first

  static uint64_t key_of(std::span<const int32_t> tokens, std::string_view salt);
  List::iterator lookup(uint64_t key, std::span<const int32_t> tokens, std::string_view salt);
  void erase(List::iterator it);

  const size_t capacity_bytes_;
  size_t bytes_ = 0;
  List entries_;
  std::unordered_multimap<uint64_t, List::iterator> index_;  // key -> entry (one per entry)
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
};

}  // namespace strata
