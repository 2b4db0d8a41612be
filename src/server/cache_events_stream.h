// The fan-out behind GET /cache/events (docs/kv-events.md): the engine's KV event batches,
// the ones the ZeroMQ publisher sends, as server-sent events for any number of HTTP
// subscribers up to a cap, whether or not ZeroMQ is on.
//
// Each batch becomes one event, encoded once (JSON, block hashes as the signed int64 of
// the wire) and shared by every subscriber's queue:
//   data: {"seq": N, "ts": <unix seconds>, "events": [...]}\n\n
// `seq` counts batches from 0, as the ZeroMQ publisher numbers them.
//
// Bounds: a subscriber's queue holds at most max_queued_bytes and max_queued_batches; a
// subscriber that falls that far behind is dropped (counted): its queue is freed and its
// stream is told `overflow`, so that publish() never waits and memory never grows with a
// slow reader. At most max_subscribers at once; more are refused.
//
// Threads: publish() is called by one thread at a time (the engine's scheduler) and takes
// one short lock; it encodes only while someone listens. subscribe(), a Subscription's
// calls and close() come from any thread (HTTP handlers). A subscription's wake function
// is called under the lock: it must be cheap and must not call back (Exchange::waker is).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cache/kv_event.h"
#include "common/result.h"

namespace strata {

struct CacheEventsOptions {
  int32_t max_subscribers = 32;                 // concurrent streams, >= 1
  int64_t max_queued_bytes = int64_t{4} << 20;  // a subscriber's unsent events, >= 1
  int64_t max_queued_batches = 10'000;          // the same in batches, >= 1
};

Status validate(const CacheEventsOptions& options);

// The JSON of one batch (the event's data), with the wire's names: {"type": "BlockStored",
// "block_hashes", "parent_block_hash" (null for a first block), "token_ids", "block_size",
// "lora_id" (null), "medium" ("GPU", "CPU_PINNED", "DISK")}, {"type": "BlockRemoved",
// "block_hashes", "medium"}, {"type": "AllBlocksCleared"}.
std::string encode_cache_events_json(uint64_t seq, double timestamp_s,
                                     const std::vector<KvEvent>& events);

class CacheEventsStream {
 public:
  class Subscription;

  explicit CacheEventsStream(CacheEventsOptions options = {});
  ~CacheEventsStream();
  CacheEventsStream(const CacheEventsStream&) = delete;
  CacheEventsStream& operator=(const CacheEventsStream&) = delete;

  // One batch (one sequence number; an empty batch is ignored, as by the ZeroMQ publisher).
  void publish(const std::vector<KvEvent>& events);

  // A new subscriber: it receives every batch from start_seq() on. `wake` is called when
  // something arrives for it (batches, an overflow, the close). kResourceExhausted when
  // max_subscribers are listening, kFailedPrecondition after close().
  Result<std::unique_ptr<Subscription>> subscribe(std::function<void()> wake);

  // Ends every stream (server shutdown): each subscription takes what is queued and then
  // reads closed; later batches are numbered but not queued, later subscribes fail.
  // Idempotent.
  void close();

  int64_t subscribers() const;           // listening now (not dropped, not gone)
  uint64_t dropped_subscribers() const;  // dropped for falling behind, since start
  uint64_t next_seq() const;             // batches published so far

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// One subscriber's end. Destroying it unsubscribes (a client gone is removed at once).
class CacheEventsStream::Subscription {
 public:
  struct State;  // the queue, shared with the stream (defined in the .cc)

  ~Subscription();
  Subscription(const Subscription&) = delete;
  Subscription& operator=(const Subscription&) = delete;

  // The sequence number of the first batch this subscriber receives.
  uint64_t start_seq() const { return start_seq_; }

  struct Taken {
    std::string frames;     // whole SSE events, in order ("" when none is queued)
    bool overflow = false;  // dropped for falling behind: nothing more will come
    uint64_t lost_seq = 0;  // with overflow: the first batch it did not receive
    bool closed = false;    // the stream was closed and nothing is left
  };
  // Moves queued events out, whole and in order, stopping once `max_bytes` or more are
  // taken (so at least one when any is queued, however large).
  Taken take(size_t max_bytes);

 private:
  friend class CacheEventsStream;
  Subscription(std::shared_ptr<CacheEventsStream::Impl> hub, std::shared_ptr<State> state,
               uint64_t start_seq)
      : hub_(std::move(hub)), state_(std::move(state)), start_seq_(start_seq) {}

  std::shared_ptr<CacheEventsStream::Impl> hub_;
  std::shared_ptr<State> state_;
  uint64_t start_seq_ = 0;
};

}  // namespace strata
