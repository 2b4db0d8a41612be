// The engine: one scheduler thread that owns the radix tree, the device page allocator
// and the KV pool, and runs continuous batching over them.
//
// Threads. HTTP threads call submit() and call(); both only enqueue and return. The
// scheduler thread does everything else: admission by radix match with lock receipts,
// chunked prefill mixed with decode in one forward pass, sampling, pages inserted into
// the tree as they fill, eviction when pages run short, retraction when even eviction
// cannot feed the running batch, cancellation, soft-pin expiry, the no-deadlock rule.
// Cache-control calls run as commands on the same thread, so they see a consistent tree.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cache/kv_event.h"
#include "cache/radix_tree.h"
#include "common/clock.h"
#include "common/result.h"
#include "engine/request.h"
#include "memory/kv_pool.h"
#include "memory/page_allocator.h"
#include "model/model.h"

namespace strata {

struct EngineOptions {
  int32_t page_size = 16;                // tokens per KV page, in [1, 256]
  int32_t kv_cache_tokens = 65'536;      // device pool size in tokens (rounded down to pages)
  KvDtype kv_dtype = KvDtype::kF32;      // device pool dtype
  int32_t max_running_requests = 32;     // requests in the running batch, >= 1
  int32_t chunked_prefill_size = 2'048;  // prefill tokens per step, >= page_size
  double max_pinned_ratio = 0.8;         // pinned pages / pool pages, in [0, 1]
};

Status validate(const EngineOptions& options);

// Counters the server exports (monotonic unless noted).
struct EngineCounters {
  uint64_t requests_finished = 0;
  uint64_t requests_cancelled = 0;
  uint64_t requests_retracted = 0;
  uint64_t prompt_tokens = 0;
  uint64_t generated_tokens = 0;
  uint64_t cached_prompt_tokens = 0;
  uint64_t auto_unpinned_blocks = 0;
  uint64_t forward_steps = 0;
  int64_t running = 0;  // gauge
  int64_t waiting = 0;  // gauge
};

// What the scheduler thread exposes to commands (cache control, inspection).
struct EngineState {
  RadixTree& tree;
  PageAllocator& device_pages;
  KvPool& kv_pool;
  const EngineOptions& options;
  const EngineCounters& counters;
  // Pages held privately by running requests (not in the tree).
  int64_t request_private_pages = 0;
  // Audits "every page is free, in the tree, or owned by exactly one request".
  std::function<Status()> audit_pages;
};

class Engine {
 public:
  // `model` must outlive the engine. `publish` (may be empty) receives the KV events of
  // each scheduler step as one batch, on the scheduler thread.
  static Result<std::unique_ptr<Engine>> create(Model* model, EngineOptions options,
                                                std::function<void(std::vector<KvEvent>)> publish,
                                                const Clock* clock = nullptr);
  ~Engine();  // stops the scheduler; unfinished requests end with kCancelled
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues a request. kInvalidArgument for an empty prompt, token ids out
  // of the vocabulary, max_tokens < 1, or prompt + max_tokens beyond the context;
  // kResourceExhausted for a prompt the device pool can never hold.
  Result<std::shared_ptr<RequestStream>> submit(RequestSpec spec);

  // Runs `fn` on the scheduler thread between steps and returns its result.
  template <typename F>
  auto call(F&& fn) -> std::future<decltype(fn(std::declval<EngineState&>()))> {
    using R = decltype(fn(std::declval<EngineState&>()));
    auto task = std::make_shared<std::packaged_task<R(EngineState&)>>(std::forward<F>(fn));
    auto fut = task->get_future();
    post([task](EngineState& s) { (*task)(s); });
    return fut;
  }

  const EngineOptions& options() const { return options_; }
  int32_t num_pages() const { return num_pages_; }
  const Model& model() const { return *model_; }
  // A copy of the counters (thread-safe).
  EngineCounters counters() const;

 private:
  struct Seq;
  Engine(Model* model, EngineOptions options, std::function<void(std::vector<KvEvent>)> publish,
         const Clock* clock);
  void post(std::function<void(EngineState&)> command);
  void run();
  bool step();  // one scheduler iteration; false when idle
  void admit();
  bool try_admit(Seq& seq);
  bool ensure_pages(Seq& seq, int64_t positions);
  void cache_computed_pages(Seq& seq);
  void finish(Seq& seq, FinishReason reason, std::string error = {}, int32_t stop_token = -1);
  void retract(Seq& seq);
  void release_seq_pages(Seq& seq);
  void flush_events();
  Status audit_pages() const;
  EngineState make_state();

  Model* model_;
  EngineOptions options_;
  std::function<void(std::vector<KvEvent>)> publish_;
  const Clock* clock_;
  int32_t num_pages_ = 0;
  std::unique_ptr<KvPool> kv_pool_;
  std::unique_ptr<PageAllocator> allocator_;
  VectorEventSink events_;
  std::unique_ptr<RadixTree> tree_;

  // Scheduler thread only.
  std::deque<std::unique_ptr<Seq>> waiting_;
  std::vector<std::unique_ptr<Seq>> running_;
  std::vector<float> logits_;
  EngineCounters counters_;
  int64_t last_expiry_check_ms_ = 0;

  // Inbox, shared with submitters.
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Seq>> inbox_;                  // GUARDED_BY(mutex_)
  std::deque<std::function<void(EngineState&)>> commands_;  // GUARDED_BY(mutex_)
  EngineCounters published_counters_;                       // GUARDED_BY(mutex_)
  bool stopping_ = false;                                   // GUARDED_BY(mutex_)
  std::atomic<uint64_t> next_id_{1};
  std::thread thread_;
};

}  // namespace strata
