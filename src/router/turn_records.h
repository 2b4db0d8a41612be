// The exact tokens a worker keeps for each session and each stored response the router
// routed there, learned from the worker (docs/router.md, "Exact continuations"), so that
// the router predicts the prompt the worker computes for the next turn, token for token.
//
// Why. A worker continues a conversation with `session_id`, and a Responses request with
// `previous_response_id`, from the exact tokens of its previous turn (what the model
// generated, `<think>` blocks included), not from a re-rendering of the messages
// (request/turn_record.h). The router cannot know those tokens from the request: it asks
// the worker for them (the x-strata-turn-record extension) and keeps them here. With a
// session's record the router computes the worker's continuation itself (continue_turn, the
// worker's own code); with a stored response's it scores the recorded tokens (the router does
// not hold the stored conversation that the worker renders the new input after).
//
// Contract. A plain data structure, like SessionTable and ResponseTable: no clock, no lock
// (the router calls it under its own mutex), no I/O. A record is shared immutable
// (shared_ptr<const>), so that a caller reads its tokens after releasing the lock.
//
// Lifetime of a record. put() keeps the one a worker answered, replacing the key's previous
// one (a session's turn moved to another worker replaces it too: the router predicts for the
// worker that answered last). erase() drops it when the worker answered a turn of the key
// without one (it forgot the session's). forget_worker() drops every record of a worker that
// is removed or restarted: its records went with its process. Bounds: at most max_records
// records and max_bytes of tokens and text (an estimate of what each holds, its key included);
// putting one more drops the least recently used first; a record larger than max_bytes alone
// is not kept (the key's previous one is dropped). A record that is gone only costs
// precision: the router then reads the request by rendering it, as a worker without the
// record would.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"
#include "request/turn_record.h"
#include "router/worker_lru.h"

namespace strata::router {

struct TurnRecordOptions {
  int64_t max_records = 100'000;           // --max-turn-records: records held, >= 1
  int64_t max_bytes = int64_t{256} << 20;  // --max-turn-record-mb (in MiB there): >= 1 MiB
};

Status validate(const TurnRecordOptions& options);

// What a record belongs to: a session (`session_id`, x-session-id) or a stored response (its
// id, continued by previous_response_id). The two name spaces are apart.
enum class TurnKey : uint8_t { kSession, kResponse };

struct TurnEntry {
  uint32_t worker = 0;  // the worker that holds the record
  ConversationRecord record;
  // A stored response's instructions: a continuation with other instructions is rendered
  // afresh by the worker (instructions are not carried over). Nullopt for a session, and
  // for a response without instructions.
  std::optional<std::string> instructions;
};

struct TurnRecordStats {
  uint64_t puts = 0;       // records kept
  uint64_t lru_drops = 0;  // dropped for max_records or max_bytes
  uint64_t erased = 0;     // dropped by erase (the worker answered without one)
  uint64_t forgotten = 0;  // dropped by forget_worker
  uint64_t too_large = 0;  // not kept: larger than max_bytes alone
};

class TurnRecordTable {
 public:
  explicit TurnRecordTable(TurnRecordOptions options = {});

  // Keeps `entry` for (kind, key), replacing one that is there; false when it was not kept
  // (an empty key, or larger than max_bytes alone: the previous one is dropped then too).
  bool put(TurnKey kind, std::string_view key, TurnEntry entry);
  // The record of (kind, key), refreshed (most recently used); null: none.
  std::shared_ptr<const TurnEntry> find(TurnKey kind, std::string_view key);
  // Forgets (kind, key); false: there was none.
  bool erase(TurnKey kind, std::string_view key);
  // Drops every record held by `worker`; returns how many.
  int64_t forget_worker(uint32_t worker);

  int64_t size() const { return table_.size(); }
  int64_t bytes() const { return bytes_; }
  int64_t records_on(uint32_t worker) const;
  const TurnRecordStats& stats() const { return stats_; }
  const TurnRecordOptions& options() const { return options_; }

  // What a record holds, roughly, in bytes (its key of `key_bytes` included).
  static int64_t size_of(const TurnEntry& entry, size_t key_bytes);

 private:
  struct Slot {
    std::shared_ptr<const TurnEntry> entry;
    int64_t bytes = 0;
  };
  using Table = WorkerLru<Slot>;  // keyed by slot_key: the kind's tag, then the key

  static std::string slot_key(TurnKey kind, std::string_view key);
  void drop(Table::iterator it);

  TurnRecordOptions options_;
  Table table_;
  int64_t bytes_ = 0;
  TurnRecordStats stats_;
};

}  // namespace strata::router
