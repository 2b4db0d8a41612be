// A generation request as the engine sees it (token ids in, token ids out), and the
// channel through which its results flow back to the thread that submitted it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/sampler.h"

namespace strata {

struct RequestSpec {
  std::vector<int32_t> prompt;  // token ids, at least one
  // Temperature, top-k/p, seed, logprobs, and stop_token_ids (the stop token ends the
  // request and is not returned).
  SamplingParams sampling;
  int32_t max_tokens = 256;  // generated tokens, >= 1 (capped by the context)
  std::string cache_salt;    // tenant isolation: enters the first block hash
  std::string session_id;    // optional: the conversation this turn belongs to
  // Scheduling priority as in vLLM: lower is served earlier, in [-100, 100]
  // (engine/queue_order.h; the cache's own classes come first).
  int32_t priority = 0;
  // Disaggregation (decode workers): the worker id of the prefill worker that should
  // compute this prompt's uncached part. Ignored (a local prefill) when the engine has no
  // such live peer; a router sets it (x-strata-prefill-peer).
  std::string prefill_peer;
};

enum class FinishReason { kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);

using GeneratedToken = SampledToken;

struct RequestUsage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = 0;  // prompt tokens served from the cache (all tiers)
  int32_t cached_device = 0;
  int32_t cached_host = 0;
  int32_t cached_storage = 0;
  // The prompt's KV came from a prefill worker: tokens and bytes moved, and the time from
  // the order to the pages received.
  bool kv_transferred = false;
  int32_t kv_transfer_tokens = 0;
  int64_t kv_transfer_bytes = 0;
  int64_t kv_transfer_ms = 0;
};

// One item from the engine: tokens, then exactly one finish.
struct StreamItem {
  std::vector<GeneratedToken> tokens;
  std::optional<FinishReason> finish;
  RequestUsage usage;       // valid with finish
  std::string error;        // with kError
  int32_t stop_token = -1;  // with kStop: the stop token sampled (not in tokens)
};

// A single-producer (scheduler) / single-consumer (HTTP thread) channel of results, and
// the consumer's cancel flag. Thread-safe.
class RequestStream {
 public:
  explicit RequestStream(uint64_t id) : id_(id) {}
  uint64_t id() const { return id_; }

  void push(StreamItem item) {
    {
      std::lock_guard lock(mutex_);
      items_.push_back(std::move(item));
      // Under the lock, so that once set_listener(nullptr) returns no call is under way.
      if (listener_) listener_();
    }
    cv_.notify_one();
  }
  // A callback run (on the producer's thread, under the stream's lock: it must be quick and
  // must not call back into this stream) after each push, for consumers that wait
  // asynchronously instead of in wait(). Cleared with nullptr; it fires at once when items
  // are already queued.
  void set_listener(std::function<void()> listener) {
    std::lock_guard lock(mutex_);
    listener_ = std::move(listener);
    if (listener_ && !items_.empty()) listener_();
  }
  // What is queued now, without waiting.
  std::vector<StreamItem> take() {
    std::lock_guard lock(mutex_);
    std::vector<StreamItem> out(std::make_move_iterator(items_.begin()),
                                std::make_move_iterator(items_.end()));
    items_.clear();
    return out;
  }
  // Waits up to timeout_ms for items; returns what is there (possibly nothing).
  std::vector<StreamItem> wait(int64_t timeout_ms) {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !items_.empty(); });
    std::vector<StreamItem> out(std::make_move_iterator(items_.begin()),
                                std::make_move_iterator(items_.end()));
    items_.clear();
    return out;
  }
  // The consumer is gone or wants to stop: the scheduler drops the request at its next
  // step and releases its pages.
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

 private:
  const uint64_t id_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<StreamItem> items_;    // GUARDED_BY(mutex_)
  std::function<void()> listener_;  // GUARDED_BY(mutex_)
  std::atomic<bool> cancelled_{false};
};

}  // namespace strata
