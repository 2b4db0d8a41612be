// What the server remembers of each conversation sent with a session_id: the exact tokens
// of its last turn, so that the next turn continues them instead of re-rendering
// (docs/sessions.md). Bounded: at most `max_records` (least recently used dropped first)
// and none idle longer than `idle_ttl_ms`. A conversation whose record is gone is simply
// rendered in full again, and answers the same.
//
// Thread-safe (one mutex; every operation is O(1) amortised).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "request/turn_record.h"  // ConversationRecord

namespace strata {

class ConversationRecords {
 public:
  struct Stats {
    size_t records = 0;
    uint64_t dropped_capacity = 0;  // dropped for --max-conversations (least recently used)
    uint64_t dropped_idle = 0;      // dropped after --conversation-ttl-s without a turn
  };

  // `clock` may be null (the steady clock).
  ConversationRecords(size_t max_records, int64_t idle_ttl_ms, const Clock* clock = nullptr);

  // A copy of the record (and marks it used), or nothing.
  std::optional<ConversationRecord> find(const std::string& id);
  void put(const std::string& id, ConversationRecord record);
  void erase(const std::string& id);
  Stats stats() const;

 private:
  struct Entry {
    ConversationRecord record;
    int64_t used_ms = 0;
    std::list<std::string>::iterator lru;  // position in lru_ (front: most recent)
  };
  void drop_expired(int64_t now_ms);  // mutex_ held

  const size_t max_records_;
  const int64_t idle_ttl_ms_;
  const Clock* clock_;
  mutable std::mutex mutex_;
  std::unordered_map<std::string, Entry> records_;  // GUARDED_BY(mutex_)
  std::list<std::string> lru_;                      // GUARDED_BY(mutex_)
  uint64_t dropped_capacity_ = 0;                   // GUARDED_BY(mutex_)
  uint64_t dropped_idle_ = 0;                       // GUARDED_BY(mutex_)
};

}  // namespace strata
