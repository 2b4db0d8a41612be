// Which worker stored each response: response id -> worker, for the Responses API through
// `strata route` (docs/openai-responses.md, docs/router.md). A stored response lives in the
// memory of the worker that answered it (its messages and the exact tokens of its turn,
// server/response_store.h), so a request continuing from it (previous_response_id) and
// GET / DELETE /v1/responses/{id} must reach that worker.
//
// Contract. A plain data structure, like SessionTable: no clock, no lock (the router calls
// it under its own mutex, from one thread at a time), no I/O.
//
// Lifetime of a binding. bind() makes one when a worker answers a stored response (its id
// read from the answer's body, or from a stream's response.created event). lookup()
// refreshes it (a continuation, a GET). At most max_responses bindings are held: binding
// one more drops the least recently used, the order in which a worker's own store drops
// its responses. There is no TTL: a worker keeps a stored response until its own bounds
// drop it, and then answers for it as for an unknown id (the router erase()s the binding
// when it sees that answer, or a DELETE). unbind_worker() drops every binding of a worker
// that is removed or restarted: its stored responses went with its process. A binding is
// only the router's memory: an id without one (a restarted router, a dropped binding) is
// asked of the workers and bound again (response_holders.h: find_response_holder).
//
// Misses. An id no worker had when asked is remembered as missing for miss_ttl_ms
// (remember_missing, known_missing), so that a client repeating an unknown id does not make
// the router ask every worker each time; at most kMaxMisses are remembered (the oldest go
// first), and bind() forgets a miss at once. The table has no clock: the caller passes now.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "common/result.h"
#include "router/worker_lru.h"

namespace strata::router {

struct ResponseTableOptions {
  int64_t max_responses = 100'000;  // --max-response-bindings: bindings held, >= 1
  int32_t max_id_bytes = 256;       // longer ids are never bound, >= 1
  int64_t miss_ttl_ms = 2'000;      // --response-miss-ttl-ms: a miss remembered, >= 0 (0: none)
};

Status validate(const ResponseTableOptions& options);

struct ResponseTableStats {
  uint64_t binds = 0;              // bindings made (or moved to another worker)
  uint64_t lru_drops = 0;          // bindings dropped for max_responses
  uint64_t erased = 0;             // bindings dropped by erase (deleted, or gone on the worker)
  uint64_t unbound = 0;            // bindings dropped by unbind_worker
  uint64_t misses_remembered = 0;  // remember_missing calls that stored a miss
  uint64_t miss_hits = 0;          // known_missing answers true
};

class ResponseTable {
 public:
  explicit ResponseTable(ResponseTableOptions options = {});

  // Binds response `id` to `worker` (made, or moved and refreshed). kInvalidArgument: an
  // empty id, or one longer than max_id_bytes.
  Status bind(std::string_view id, uint32_t worker);
  // The worker that holds `id`, refreshed (most recently used); nullopt: unknown.
  std::optional<uint32_t> lookup(std::string_view id);
  // The same without refreshing it.
  std::optional<uint32_t> peek(std::string_view id) const;
  // Forgets `id`; false: it was not bound.
  bool erase(std::string_view id);
  // Drops every binding to `worker`; returns how many.
  int64_t unbind_worker(uint32_t worker);

  // The most misses remembered at once.
  static constexpr size_t kMaxMisses = 10'000;
  // Remembers that no worker had `id` when asked, until now_ms + miss_ttl_ms (nothing when
  // miss_ttl_ms is 0, or `id` is empty or longer than max_id_bytes).
  void remember_missing(std::string_view id, int64_t now_ms);
  // Whether `id` is remembered missing at now_ms.
  bool known_missing(std::string_view id, int64_t now_ms);
  // Misses remembered (some may have run out, not yet dropped).
  int64_t misses() const { return static_cast<int64_t>(misses_.size()); }

  // Bindings to `worker`.
  int64_t responses_on(uint32_t worker) const;
  int64_t size() const { return table_.size(); }
  const ResponseTableStats& stats() const { return stats_; }
  const ResponseTableOptions& options() const { return options_; }

 private:
  struct None {};
  ResponseTableOptions options_;
  WorkerLru<None> table_;  // response id -> its worker
  // Misses: id -> until when, and the order they were remembered in (their ends are in that
  // order, the TTL being one); an order entry whose id was remembered again or bound since
  // is skipped when it reaches the front.
  absl::flat_hash_map<std::string, int64_t> misses_;
  std::deque<std::pair<int64_t, std::string>> miss_order_;
  ResponseTableStats stats_;
};

}  // namespace strata::router
