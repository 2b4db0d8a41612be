// A KV event subscriber, as a KV-aware router runs one: a ZeroMQ SUB socket on a Strata
// server's --kv-events-endpoint, decoding vLLM's wire format (docs/kv-events.md). The
// depth-sweep scenario uses it to learn the block hashes of the VIP conversation while it
// warms (nothing else runs then), and pins exactly those.
//
// Threads: one receiver thread owns the socket; the accessors are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace strata::bench {

struct KvEventRecord {
  enum class Kind { kStored, kRemoved, kAllCleared };
  Kind kind = Kind::kStored;
  std::vector<int64_t> block_hashes;  // wire form: signed int64
  std::string medium;                 // "GPU", "CPU_PINNED", "DISK"; empty for kAllCleared
};

struct KvEventBatch {
  double timestamp_s = 0;
  std::vector<KvEventRecord> events;
  int64_t data_parallel_rank = 0;
};

// Decodes one msgpack payload [timestamp, [event...], rank]; kCorrupt names what is wrong.
// Never reads outside `payload`; bytes after the one object are an error. A rank that is
// not an integer (vLLM sends nil without data parallelism) reads as 0. This is the router's
// decoder (router/kv_event_wire.h) in its strict mode: Strata's own format, every field.
Result<KvEventBatch> decode_kv_event_batch(std::string_view payload);

class KvEventSubscriber {
 public:
  // Connects a SUB socket (all topics) and starts receiving. The subscription reaches the
  // publisher asynchronously: callers synchronise by observing a batch (see
  // depth_sweep.cc) before relying on the stream.
  static Result<std::unique_ptr<KvEventSubscriber>> connect(const std::string& endpoint);
  ~KvEventSubscriber();
  KvEventSubscriber(const KvEventSubscriber&) = delete;
  KvEventSubscriber& operator=(const KvEventSubscriber&) = delete;

  // Forgets the captured blocks; blocks stored from now on are captured.
  void start_capture();
  // Hashes stored since start_capture() and not removed since, first-stored first, once
  // each (a block stored on several tiers counts once).
  std::vector<int64_t> captured_blocks() const;

  uint64_t batches_received() const;
  // Missing sequence numbers seen between consecutive batches.
  uint64_t sequence_gaps() const;
  std::string last_error() const;

  // Waits until more than `count` batches arrived in total; false on timeout.
  bool wait_batches_above(uint64_t count, double timeout_s) const;
  // Waits until no batch arrived for `quiet_s`; false when batches kept coming until
  // `timeout_s`.
  bool wait_quiet(double quiet_s, double timeout_s) const;

 private:
  struct Impl;
  explicit KvEventSubscriber(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::bench
