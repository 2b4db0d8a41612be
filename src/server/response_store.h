// The responses kept for GET /v1/responses/{id} and for `previous_response_id`
// (docs/openai-responses.md): each stored response's answer, the chat messages that follow
// its instructions (its input and output included: what a next turn continues), and the
// exact tokens of its turn (a ConversationRecord, as a session_id's), so that the next turn
// continues those tokens instead of re-rendering them and hits the cache completely.
//
// Bounded: at most `max_responses` responses and `max_bytes` (an estimate of what each
// holds); the least recently used goes first. A response that is gone is answered 404 by
// GET and refused (400, as OpenAI does) as a previous_response_id.
//
// Also the groups of `prompt_cache_key`: the block hashes a key's last turn pinned, so that
// the next turn of the same key pins only the blocks after them (bounded like the
// responses, by count).
//
// Thread-safe (one mutex; every operation is O(1) amortised, plus the size of what is put).
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/block_hash.h"
#include "server/conversations.h"

namespace strata {

struct StoredResponse {
  nlohmann::json response;  // the response object as answered
  std::optional<std::string> instructions;
  // The chat messages after the instructions: the previous response's, this input, this
  // output (an assistant message with its tool calls).
  nlohmann::ordered_json history = nlohmann::ordered_json::array();
  // The turn's exact tokens (num_messages counts the instructions' message); absent when
  // the turn ended so that no exact record exists (an error, a cancelled turn).
  std::optional<ConversationRecord> record;
};

class ResponseStore {
 public:
  struct Stats {
    size_t responses = 0;
    size_t bytes = 0;
    uint64_t dropped = 0;  // dropped for the bounds (least recently used first)
  };

  ResponseStore(size_t max_responses, size_t max_bytes);

  // The response (and marks it used), or null.
  std::shared_ptr<const StoredResponse> find(const std::string& id);
  void put(const std::string& id, std::shared_ptr<const StoredResponse> response);
  // Whether it was there.
  bool erase(const std::string& id);
  Stats stats() const;

  // prompt_cache_key groups: the hashes pinned for a key so far, until when (steady
  // clock, ms: a soft pin's TTL runs from its last hit, and every turn of the group hits
  // them).
  struct GroupPins {
    std::vector<BlockHash> hashes;
    int64_t expires_ms = 0;
  };
  GroupPins group_pins(const std::string& key);
  void set_group_pins(const std::string& key, GroupPins pins);

  // What a stored response holds, roughly, in bytes.
  static size_t size_of(const StoredResponse& r);

 private:
  struct Entry {
    std::shared_ptr<const StoredResponse> response;
    size_t bytes = 0;
    std::list<std::string>::iterator lru;  // position in lru_ (front: most recent)
  };
  void drop_one();  // mutex_ held: drops the least recently used

  const size_t max_responses_;
  const size_t max_bytes_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Entry> entries_;  // GUARDED_BY(mutex_)
  std::list<std::string> lru_;                      // GUARDED_BY(mutex_)
  size_t bytes_ = 0;                                // GUARDED_BY(mutex_)
  uint64_t dropped_ = 0;                            // GUARDED_BY(mutex_)
  // prompt_cache_key -> hashes pinned; at most max_responses_ keys, the oldest dropped.
  std::unordered_map<std::string, GroupPins> groups_;  // GUARDED_BY(mutex_)
  std::list<std::string> group_order_;                 // GUARDED_BY(mutex_)
};

}  // namespace strata
