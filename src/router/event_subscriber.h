// One worker's KV event stream into the PrefixIndex: a ZeroMQ SUB socket on the worker's
// event endpoint (multipart [topic, seq u64 big-endian, payload], docs/kv-events.md),
// decoded with decode_kv_event_batch() and applied for one WorkerId.
//
// Sequence numbers (the publisher numbers its batches 0, 1, 2, ...):
// - The first batch sets the sequence (or, with replay_on_join, a first batch after 0
//   asks the replay socket for everything from 0 that the worker's ring still holds).
// - A gap (seq > last + 1) asks the replay socket (DEALER: ["", start u64 BE]; answers
//   ["", seq, payload]... then the end marker ["", -1 as 8 bytes, ""]) for last + 1 on.
//   Batches that arrive on SUB meanwhile are held back (at most max_buffered_batches) and
//   applied after the replayed ones, in sequence order, each once. If the replay times out
//   (replay_timeout_ms for the whole answer), the ring no longer holds part of the range,
//   or there is no replay endpoint, the worker's index is marked stale and on_stale runs;
//   the stream goes on (later batches are still applied) and the owner rebuilds the index
//   (PrefixIndex::rebuild_worker, then mark_stale(false)).
// - A sequence that goes backwards (seq <= last: the worker restarted) clears the worker's
//   blocks, marks it stale, calls on_stale, and resynchronises from the new sequence
//   (replaying from 0 when the batch is not 0 and a replay endpoint is known).
// - A snapshot of the worker's tree installed in the index (the owner's rebuild) comes with
//   the worker's sequence number at the snapshot, `resync(next)`: the snapshot holds every
//   batch before `next`, so batches the thread applied after it (the install replaced
//   them) or has not yet received are replayed from `next`, and live batches below `next`
//   still in flight are dropped, not read as a restart.
// - The worker's own count of published batches, `note_published(n)` (its load reports),
//   shows losses no later batch reveals (batches sent before the subscription took
//   effect): when n stays ahead of the last applied batch for published_grace_ms, the
//   thread replays the difference.
// - An undecodable batch marks the worker stale (its changes are lost) and calls on_stale.
// on_stale is called when the worker goes from fresh to stale (a restart: always).
//
// Threads. start() creates the sockets and one thread that owns them from then on; ZeroMQ
// connects lazily, so start() does not wait for the worker. stats() is thread-safe.
// on_stale runs on that thread: it must return quickly and must not stop or destroy this
// subscriber (stop() joins the thread). stop() (and the destructor) returns within about
// poll_interval_ms: the thread polls in steps of that length, during a replay too, and
// checks the stop flag between them; the sockets linger 0.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/result.h"
#include "router/prefix_index.h"

namespace strata::router {

struct EventSubscriberOptions {
  std::string endpoint;          // the worker's event PUB address to connect, e.g. tcp://h:5557
  std::string replay_endpoint;   // its replay ROUTER address; empty: gaps cannot be repaired
  std::string topic;             // subscription prefix; empty: every topic
  int replay_timeout_ms = 1000;  // whole replay, request to end marker; 1 to 600000
  int poll_interval_ms = 20;     // how often the thread checks for stop(); 1 to 100
  size_t max_buffered_batches = 100000;  // held back during a replay; beyond: replay fails
  bool replay_on_join = false;           // a first batch after seq 0 replays from 0
  int published_grace_ms = 500;          // note_published ahead this long: replay; 0 to 600000
};

// kInvalidArgument naming the field.
Status validate(const EventSubscriberOptions& options);

struct EventSubscriberStats {
  uint64_t batches = 0;          // batches applied (live and replayed)
  uint64_t events = 0;           // events in them
  uint64_t gaps = 0;             // gaps seen in the live sequence
  uint64_t missing_batches = 0;  // sequence numbers those gaps skipped
  uint64_t replays_ok = 0;
  uint64_t replays_failed = 0;
  uint64_t decode_errors = 0;   // undecodable payloads or malformed messages
  uint64_t restarts = 0;        // sequence went backwards
  uint64_t skipped_events = 0;  // events the decoder skipped (unknown tags or media)
  int64_t last_seq = -1;        // last sequence number applied; -1 before the first
  int64_t last_batch_ms = 0;    // steady clock (SteadyClock::now_ms) of the last batch; 0: none
  std::string last_error;       // the last failure, for GET /workers; empty if none
};

class EventSubscriber {
 public:
  // reason: one line for logs ("replay of 12..40 timed out").
  using StaleCallback = std::function<void(WorkerId worker, const std::string& reason)>;

  // `index` must outlive the subscriber and have `worker` added (batches for a worker
  // that is not in the index are dropped by PrefixIndex::apply).
  static Result<std::unique_ptr<EventSubscriber>> start(WorkerId worker, PrefixIndex* index,
                                                        EventSubscriberOptions options,
                                                        StaleCallback on_stale);
  ~EventSubscriber();  // stop()
  EventSubscriber(const EventSubscriber&) = delete;
  EventSubscriber& operator=(const EventSubscriber&) = delete;

  // Stops the thread and closes the sockets; idempotent. Not from on_stale.
  void stop();

  // A snapshot holding every batch before `next_seq` was installed in the index (call it
  // after PrefixIndex::rebuild_worker). Thread-safe; acted on by the subscriber's thread.
  void resync(uint64_t next_seq);
  // The owner saw the worker restart (another process, PrefixIndex::reset_worker done): the
  // sequence starts again. Call before the new process's snapshot's resync. Thread-safe.
  void restarted();
  // The worker reports having published `published` batches (0 .. published - 1).
  // Thread-safe.
  void note_published(uint64_t published);

  WorkerId worker() const { return worker_; }
  EventSubscriberStats stats() const;

 private:
  struct Impl;
  EventSubscriber(WorkerId worker, std::unique_ptr<Impl> impl);
  WorkerId worker_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::router
