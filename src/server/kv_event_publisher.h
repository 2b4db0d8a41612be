// Publishes the cache's KV events on ZeroMQ in the wire format of vLLM and SGLang, so
// that KV-aware routers written for them (Dynamo, llm-d) consume Strata's events as is.
//
// Wire format (docs/kv-events.md):
//   PUB socket, multipart [topic, sequence (u64 big-endian), payload]
//   payload = msgpack array [timestamp_s (float64), [event...], data_parallel_rank (int)]
//   event   = ["BlockStored", block_hashes, parent_block_hash|nil, token_ids, block_size,
//              lora_id|nil, medium, lora_name|nil(, extra_keys: one per block, [salt]|nil)]
//           | ["BlockRemoved", block_hashes, medium]
//           | ["AllBlocksCleared"]
//   block hashes are signed int64 (block_hash_to_wire); medium is "GPU", "CPU_PINNED", "DISK".
// Replay: a ROUTER socket; a DEALER sends ["", start_seq (u64 big-endian)] and receives
// ["", seq, payload] for every buffered batch with seq >= start_seq, then
// ["", -1 (i64 big-endian), ""].
//
// Thread: publish() may be called from any thread (the scheduler); one publisher thread
// owns both sockets, encodes and sends. Nothing blocks the caller but a short lock.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cache/kv_event.h"
#include "common/result.h"

namespace strata {

struct KvEventPublisherOptions {
  std::string endpoint = "tcp://127.0.0.1:5557";  // PUB socket (bind, or connect below)
  // Connect the PUB socket to `endpoint` instead of binding it: to a subscriber that binds
  // and collects every worker's events (llm-d's centralized KV-events mode).
  bool connect = false;
  std::string replay_endpoint;      // ROUTER socket (bind); empty: none
  std::string topic = "kv-events";  // first frame of every message
  int32_t data_parallel_rank = 0;
  size_t replay_buffer_batches = 10'000;  // batches kept for replay, in [1, 10^7]
};

// msgpack payload of one batch.
std::string encode_kv_event_batch(double timestamp_s, const std::vector<KvEvent>& events,
                                  int32_t data_parallel_rank);

class KvEventPublisher {
 public:
  // Binds (or connects) the sockets and starts the thread; fails with a clear message when
  // an endpoint is malformed or in use.
  static Result<std::unique_ptr<KvEventPublisher>> start(KvEventPublisherOptions options);
  ~KvEventPublisher();  // drains what was queued, then stops
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Queues one batch (one sequence number). An empty batch is ignored.
  void publish(std::vector<KvEvent> events);

  // Batches sent so far (the next sequence number).
  uint64_t published_batches() const;
  // The bound endpoints, with the port resolved when bound as "tcp://host:*".
  std::string endpoint() const;
  std::string replay_endpoint() const;

 private:
  struct Impl;
  explicit KvEventPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
