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
#include <unordered_map>
#include <vector>

#include "cache/kv_event.h"
#include "cache/radix_tree.h"
#include "common/clock.h"
#include "common/result.h"
#include "engine/request.h"
#include "engine/tool_sessions.h"
#include "memory/host_kv_pool.h"
#include "memory/kv_pool.h"
#include "memory/page_allocator.h"
#include "memory/transfer_engine.h"
#include "model/model.h"
#include "storage/storage_backend.h"

namespace strata {

// When a request whose prefix is in storage stops waiting for the prefetch.
enum class PrefetchPolicy : uint8_t { kBestEffort, kWaitComplete, kTimeout };
Result<PrefetchPolicy> parse_prefetch_policy(std::string_view name);

// The hierarchical cache (SGLang HiCache's options; docs/hierarchical-cache.md).
struct HierarchicalCacheOptions {
  bool enabled = false;
  double ratio = 2.0;    // host pages = ratio x device pages, > 1
  double size_gb = 0.0;  // host pool in GB (1e9 bytes); overrides ratio when > 0
  WritePolicy write_policy = WritePolicy::kWriteThrough;
  int32_t write_through_threshold = 2;
  HostLayout layout = HostLayout::kLayerFirst;
  int32_t transfer_threads = 1;
  std::string storage_backend;       // "" (none), "file" or "redis"
  std::string storage_extra_config;  // JSON object or @file
  std::string storage_namespace;     // isolates models sharing one store (set by serve)
  PrefetchPolicy prefetch_policy = PrefetchPolicy::kBestEffort;
};

struct EngineOptions {
  int32_t page_size = 16;                // tokens per KV page, in [1, 256]
  int32_t kv_cache_tokens = 65'536;      // device pool size in tokens (rounded down to pages)
  KvDtype kv_dtype = KvDtype::kF32;      // device pool dtype
  int32_t max_running_requests = 32;     // requests in the running batch, >= 1
  int32_t chunked_prefill_size = 2'048;  // prefill tokens per step, >= page_size
  double max_pinned_ratio = 0.8;         // pinned pages / pool pages, in [0, 1]
  // Pins a client makes without the admin key (a message's cache_control): always soft,
  // their TTL capped, inside a budget of their own (engine/pin_policy.h).
  int64_t max_client_pin_ttl_ms = 300'000;  // --max-client-pin-ttl-s, >= 1 s
  double max_client_pinned_ratio = 0.2;     // client-pinned pages / pool pages, in [0, 1]
  HierarchicalCacheOptions hicache;
  int64_t tool_session_ttl_ms = 3'600'000;  // --tool-session-ttl-s
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
  uint64_t cached_host_tokens = 0;     // prompt tokens loaded back from the host
  uint64_t cached_storage_tokens = 0;  // prompt tokens prefetched from storage
  uint64_t loads_failed = 0;           // load-backs refused for want of device pages
  uint64_t prefetches_started = 0;
  uint64_t prefetch_pages_read = 0;
  uint64_t storage_pages_written = 0;
  uint64_t storage_faults = 0;         // items a backend failed (down, full, corrupt)
  uint64_t prefetch_timeouts = 0;      // requests that stopped waiting for a prefetch
  uint64_t tool_sessions_expired = 0;  // offloaded sessions released by the TTL
  int64_t running = 0;                 // gauge
  int64_t waiting = 0;                 // gauge
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
  // Hierarchical cache (null / 0 without it).
  PageAllocator* host_pages = nullptr;
  StorageBackend* storage = nullptr;
  ToolSessions* sessions = nullptr;
  // Pages --max-pinned-ratio applies to: the host pool with a host tier, else the device.
  int64_t pin_budget_pages = 0;
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
  enum class Admission : uint8_t { kAdmitted, kNoRoom, kParked };
  Admission try_admit(Seq& seq);
  bool ensure_pages(Seq& seq, int64_t positions);
  void cache_computed_pages(Seq& seq);
  void finish(Seq& seq, FinishReason reason, std::string error = {}, int32_t stop_token = -1);
  void retract(Seq& seq);
  void release_seq_pages(Seq& seq);
  void flush_events();
  Status audit_pages() const;
  // Hierarchical cache, all on the scheduler thread.
  Status init_hicache();
  // Hands the tree's requested copies to the transfer threads; a load among them wakes
  // the parked request `load_for_seq` when it lands.
  void submit_transfers(uint64_t load_for_seq = 0);
  void poll_io();
  void start_prefetch(Seq& seq, const MatchResult& m);
  void unpark(uint64_t seq_id);
  bool io_busy() const;
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
  // Hierarchical cache (null without it).
  std::unique_ptr<HostKvPool> host_pool_;
  std::unique_ptr<PageAllocator> host_allocator_;
  std::unique_ptr<TransferEngine> transfers_;
  std::unique_ptr<StorageBackend> storage_;
  std::unique_ptr<class StorageWorker> storage_worker_;
  StorageConfig storage_config_;
  struct PendingTransfer {
    TransferRequest request;
    uint64_t waiting_seq = 0;  // a parked request waiting for this load, or 0
  };
  std::unordered_map<TransferTicket, PendingTransfer> pending_transfers_;
  struct PendingStorage {
    uint64_t seq_id = 0;          // the request that asked (prefetch), or 0
    std::vector<int32_t> tokens;  // prefetch: tokens through the last fetched page
    std::string cache_salt;
    int32_t first_page = 0;
  };
  std::unordered_map<uint64_t, PendingStorage> pending_storage_;
  std::vector<PageId> storage_read_pages_;  // host pages being read (owned by no node)
  // Requests parked until a load or prefetch lands (or its deadline passes).
  std::vector<std::unique_ptr<Seq>> parked_;
  std::unique_ptr<ToolSessions> sessions_;
  int64_t last_session_tick_ms_ = 0;

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
