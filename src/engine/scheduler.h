// The scheduler: one thread that owns the radix tree, the page pools, the transfer and
// storage workers and the tool sessions, and runs continuous batching over them. Internal
// to the engine: the public face is engine/engine.h (submit, cache control).
//
// Threads. Other threads call submit() and post(); both only enqueue and return. The
// scheduler thread does everything else: admission by radix match with lock receipts,
// chunked prefill mixed with decode in one forward pass, sampling, pages inserted into
// the tree as they fill, eviction when pages run short, retraction when even eviction
// cannot feed the running batch, cancellation, soft-pin expiry, the no-deadlock rule.
// Commands (engine/cache_control.cc) run on the same thread between steps, so they see a
// consistent tree.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cache/kv_event.h"
#include "cache/radix_tree.h"
#include "common/clock.h"
#include "common/result.h"
#include "engine/engine_options.h"
#include "engine/engine_state.h"
#include "engine/pd_link.h"
#include "engine/pd_stage.h"
#include "engine/queue_order.h"
#include "engine/request.h"
#include "engine/step_budget.h"
#include "engine/tool_sessions.h"
#include "memory/copy_device.h"
#include "memory/host_kv_pool.h"
#include "memory/kv_pool.h"
#include "memory/kv_transfers.h"
#include "memory/page_allocator.h"
#include "model/forward_model.h"
#include "model/prompt_logits_cache.h"
#include "storage/storage_backend.h"

namespace strata {

class Scheduler {
 public:
  // `model` must outlive the engine. `publish` (may be empty) receives the KV events of
  // each scheduler step as one batch, on the scheduler thread.
  static Result<std::unique_ptr<Scheduler>> create(
      ForwardModel* model, EngineOptions options, std::function<void(std::vector<KvEvent>)> publish,
      const Clock* clock = nullptr);
  ~Scheduler();  // stops the scheduler; unfinished requests end with kCancelled
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Validates and queues a request. kInvalidArgument for an empty prompt, token ids out
  // of the vocabulary, max_tokens < 1, a priority outside [-100, 100], or a prompt
  // beyond the context; kResourceExhausted for a prompt the device pool can never hold.
  // max_tokens is capped by the context and by the device pool (prompt + output must fit
  // it): a request that reaches the cap ends with kLength, never with an error.
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
  // The cache's block hasher (block_hasher_for(options())); immutable.
  const BlockHasher& block_hasher() const { return hasher_; }
  int32_t num_pages() const { return num_pages_; }
  const ForwardModel& model() const { return *model_; }
  // Tool sessions (engine/tool_sessions.h), for CacheControl: tool_start (no `end_epoch`)
  // or tool_end. The future is ready once the move has landed: the offload on the host,
  // or the restore on the device (RUNNABLE). A restore without device room makes room by
  // retracting running requests (between steps) and otherwise waits for room, up to
  // kRestoreRoomWaitMs, before it answers kOutOfPages. `on_ready` (may be empty) is called
  // on the scheduler thread once the future is ready (an HTTP handler's waker).
  std::future<Result<ToolSessionView>> tool_session(std::string id,
                                                    std::optional<uint64_t> end_epoch,
                                                    std::function<void()> on_ready);
  static constexpr int64_t kRestoreRoomWaitMs = 10'000;
  static constexpr int64_t kSessionMoveWaitMs = 30'000;  // then it answers where the KV is

  // A copy of the counters (thread-safe).
  EngineCounters counters() const;
  // The worker's disaggregation (thread-safe).
  PdInfo pd_info() const;

 private:
  struct Seq;
  struct RemoteOrder;
  struct SessionWaiter;
  // Advances the callers waiting on tool_session() (scheduler thread, between steps or
  // during a forward pass: `s.make_device_room` says whether requests may step back).
  void serve_session_waiters(EngineState& s);
  // One waiter: its answer, or nullopt while it waits.
  std::optional<Result<ToolSessionView>> advance(SessionWaiter& w, EngineState& s);
  Scheduler(ForwardModel* model, EngineOptions options,
            std::function<void(std::vector<KvEvent>)> publish, const Clock* clock);
  void post(std::function<void(EngineState&)> command);
  void run();
  bool step();  // one scheduler iteration; false when idle
  void admit();
  // kRemote: the prompt's KV is ordered from a prefill worker (the request waits in remote_).
  enum class Admission : uint8_t { kAdmitted, kNoRoom, kParked, kRemote };
  Admission try_admit(Seq& seq);
  // Whether `seq` should wait this step because a running request is prefilling at least
  // shared_prefill_wait_tokens of the prompt they share beyond what the tree holds: those
  // pages join the tree as it computes them, and `seq` then matches them instead of
  // computing them a second time.
  bool waits_for_shared_prefill(Seq& seq);
  bool ensure_pages(Seq& seq, int64_t positions);
  // Device pages the running requests still need to finish their prompts, plus one decode
  // slot each; admission leaves them this room.
  int64_t running_reserve() const;
  void cache_computed_pages(Seq& seq);
  void finish(Seq& seq, FinishReason reason, std::string error = {}, int32_t stop_token = -1);
  void retract(Seq& seq);
  // Hands a sampled token to the stream; finishes at a stop token or max_tokens (true).
  bool emit_sampled(Seq& seq, GeneratedToken tok);
  // The token of one output row: sampled from logits, or the one the model chose.
  SampledToken sample_row(Seq& seq, std::span<const float> row);
  RowSampling take_draw(Seq& seq);
  // The usage figures of a request's first admission (what the cache saved, per tier).
  void count_admission(Seq& seq);

  // Prefill/decode disaggregation (scheduler_pd.cc; docs/pd-disaggregation.md).
  Status init_pd();
  // Applies the channel's messages, the rooms' or leases' deadlines and the transfers'
  // completions; called every iteration.
  void pd_poll();
  bool pd_busy() const;
  // Decode side.
  std::optional<Admission> try_remote(Seq& seq, const MatchResult& m);
  void pd_room_event(const pd::RoomEvent& ev);
  void pd_fallback(std::unique_ptr<Seq> seq, PdFallback reason);
  void pd_land(Seq& seq);
  std::vector<PageId> detach_room_pages(Seq& seq);
  std::unique_ptr<Seq> take_remote(uint64_t room);
  // Prefill side.
  void pd_take_order(const std::string& peer, pd::PrefillOrder order, int64_t received_ms);
  void pd_send_ready(Seq& seq, bool final);
  void pd_abort(uint64_t room, bool tell_peer, const std::string& why);
  void pd_settle_orders();
  // With a stage (a model with KV memory of its own): sends wait for stage pages and their
  // device -> stage copy, then go to the transport; a received room's stage pages are
  // copied to its device pages before it decodes.
  void pd_queue_staged_send(uint64_t room, PageBatch batch);
  void pd_pump_stage();
  void pd_stage_outcome(const TransferOutcome& o);
  // The room's stage pages go back (or wait out the quarantine with the room).
  void pd_free_stage(Seq& seq);
  // The received room's first token goes out and the request decodes.
  void pd_deliver(std::unique_ptr<Seq> seq);
  // The pages the peer of a failed room may still write: the stage's, or the device's.
  void pd_release_room_pages(uint64_t room, std::vector<PageId> device_pages,
                             std::vector<PageId> stage_pages, bool reclaimable);
  // The pool the transports read and write: the stage's, or the engine's.
  KvPool& pd_pool();
  void pd_free_quarantined(std::vector<PageId>& pages);
  bool sample_full_hits();
  // Orders running_ best first (queue_order.h), so that running_.back() is the request to
  // retract first; waiting_ likewise, so that front() is the next to admit.
  void order_queues();
  QueueKey queue_key(const Seq& seq) const;
  // A tool_end restore found no device room: retracts running requests (worst first,
  // never a kResume one) until `pages` device pages are free or evictable. Returns the
  // requests retracted.
  int32_t make_room_for_restore(int64_t pages);
  // Waits for the host -> device copies in flight (a restore's pages: a copy per page, far
  // shorter than a step) and lets the tool sessions advance, so that a tool_end answers
  // with its session RUNNABLE instead of waiting for the next iteration.
  void land_loads();
  // The gauges a router reads through GET /load: free and evictable pages, prompt tokens
  // still to prefill.
  void publish_load_gauges();
  // A request of a better class than `head` waits: the worst running request of a worse
  // class steps back (retracted, queued again). False when there is none.
  bool preempt_for(const Seq& head);
  // The no-deadlock rule (admit(), when the head of the queue finds no room):
  // Whether pages come back without anyone letting go: running requests, copies or
  // storage calls in flight, parked requests, P/D rooms, sends and quarantines.
  bool pages_will_return() const;
  // Queued requests that loaded their prefix back hold it until their turn: they let go
  // (and load again, or match on the device, when it comes). False when none held any.
  bool release_queued_holds();
  // Releases pins (pin_table.h's order) for `seq`'s shortfall: device pins without a host
  // tier; with one, only pins of device pages the host cannot take. False: none released.
  bool unpin_for(const Seq& seq);
  // The index in running_ of the worst-ranked request `eligible` accepts, or -1.
  std::ptrdiff_t worst_running(const std::function<bool(const Seq&)>& eligible) const;
  // Retracts running_[index] and queues it again (counted as preempted).
  void step_back(std::ptrdiff_t index);
  // Device pages that are free or that eviction (demotion, with a host tier) can free:
  // TreeStats::unevictable_pages is what it cannot.
  int64_t reclaimable_pages() const;
  // The room computation of admission (try_admit, try_remote): the device pages a request
  // whose cached prefix ends at `path` (locked on admission; null or the root: none) can
  // take now, beside what the running requests still need (running_reserve).
  int64_t device_room(const RadixNode* path) const;
  // Gives back a request's pages and locks (its computed full pages join the tree first);
  // the caller moves it to its next state.
  void release_seq_pages(Seq& seq);
  // Prefill side: an order's request ends (sent, or the order aborted). It ends without
  // finish(): nobody reads its stream, and the order's own counters count it.
  void end_order_request(Seq& seq);
  void flush_events();
  // Every page of both pools accounted for, and every request in the container of its
  // state (engine/seq_state.h).
  Status audit_pages() const;
  Status audit_states() const;
  // The forward pass runs on the forward thread and, while it runs, the commands that
  // arrive (cache control, tool_end's restore, kv_meta): a command waits for at most the
  // scheduler's bookkeeping between steps, not for a whole step. Commands then see the
  // tree and pools as between steps; they only may not retract running requests (the
  // batch in flight is theirs): make_device_room answers 0 meanwhile, and a restore that
  // needs it waits for the step's end (serve_session_waiters).
  //
  // Overlapped steps (EngineOptions::overlap_schedule). A batch owns copies of what its rows
  // point to (tokens, page tables), so the scheduler may change its requests while it runs.
  // While batch N runs, prepare_next() makes N+1 when every running request continues from
  // a row of N that gives its next token: each gets one row whose input is that token (a
  // future: Planned::future), filled in by resolve_futures() once N has run, on the forward
  // thread (from the token the model drew, or drawn there from the row's logits with the
  // request's RowSampling). N's results are read meanwhile; a request that ends in N while
  // it has a row in N+1 (`ahead`) finishes after N+1 has run (Seq::ending), and pages it
  // lets go of meanwhile wait in deferred_free_. Commands and tool-session waiters may not
  // retract requests while a batch is in flight.
  struct Planned {
    Seq* seq = nullptr;
    int64_t start = 0;
    int64_t count = 0;
    int32_t future = -1;  // >= 0: the input is the token of this logits row of the batch before
  };
  struct Batch;
  Batch& free_batch();
  void fill_batch(Batch& b, std::vector<Planned> plan);
  void launch(Batch& b);
  // Waits for `b` to have run, running the commands that arrive meanwhile.
  Status wait_serving_commands(Batch& b);
  void run_batch(Batch& b);  // the forward thread's part
  void resolve_futures(Batch& next, Batch& prev);
  Batch* prepare_next(Batch& cur);
  // Step N (cur_) runs: prepares N+1 if it can, waits for N and reads its results.
  bool finish_step();
  void read_batch(Batch& b);
  void fail_batch(Batch& b, const Status& st);
  // A request has a row in a batch launched after the one being read.
  bool ahead(const Seq& seq) const;
  // The requests that ended in a batch before `b` (Seq::ending) finish; `b` has run.
  void finish_ended(Batch& b);
  // Any batch in flight runs and is read (shutdown).
  void drain_batches();
  void run_forward_thread();
  void run_commands(std::deque<std::function<void(EngineState&)>>& commands, bool may_retract);
  // Hierarchical cache, all on the scheduler thread.
  Status init_hicache();
  // Hands the tree's requested copies to the transfer threads; a load among them wakes
  // the parked request `load_for_seq` when it lands, or, `overlapped`, is read by that
  // running request's forward pass layer by layer. Returns the load's ticket (0: none).
  TransferTicket submit_transfers(uint64_t load_for_seq = 0, bool overlapped = false);
  // Overlapped load-backs (LoadOverlap::kLayer). After the forward pass that read `seq`'s
  // loading prefix: the load has resolved, or counts as failed (load_failed).
  void settle_load(Seq& seq);
  // Running requests whose overlapped load failed or stalled step back: their own pages go
  // back uncached, and they compute the prefix when admitted again.
  void abandon_failed_loads();
  // `force`: every finished copy lands now, whatever copy_gate_ says.
  void poll_io(bool force = false);
  // A copy job resolved or stalled (poll_io).
  void on_transfer(const TransferOutcome& outcome);
  // Tests: every copy in flight lands, then `device` does the copies from now on.
  Status use_copy_device(CopyDevice& device, int64_t stall_timeout_ms);
  void start_prefetch(Seq& seq, const MatchResult& m);
  void unpark(uint64_t seq_id);
  bool io_busy() const;
  EngineState make_state();

  ForwardModel* model_;
  EngineOptions options_;
  BlockHasher hasher_;  // made from options_ once they validated; read by any thread
  std::function<void(std::vector<KvEvent>)> publish_;
  const Clock* clock_;
  const bool chooses_tokens_;  // the model's ForwardModel::chooses_tokens()
  int32_t num_pages_ = 0;
  std::unique_ptr<KvPool> kv_pool_;
  std::unique_ptr<PageAllocator> allocator_;
  VectorEventSink events_;
  std::unique_ptr<RadixTree> tree_;
  // Hierarchical cache (null without it).
  std::unique_ptr<HostKvPool> host_pool_;
  std::unique_ptr<PageAllocator> host_allocator_;
  // A model with KV memory of its own (the GPU's): its copy device, which the
  // StreamTransferEngine below drives (declared first, so it outlives the engine's copies).
  std::unique_ptr<CopyDevice> copy_device_;
  // The CPU build's TransferEngine, or a StreamTransferEngine over copy_device_ (tests put
  // one over a copy device of theirs in its place: EngineState::use_copy_device).
  std::unique_ptr<KvTransfers> transfers_;
  std::unique_ptr<StorageBackend> storage_;
  std::unique_ptr<class StorageWorker> storage_worker_;
  StorageConfig storage_config_;
  struct PendingTransfer {
    TransferRequest request;
    uint64_t waiting_seq = 0;  // a parked request waiting for this load, or 0
    uint64_t running_seq = 0;  // a running request reading it as it lands (overlapped), or 0
    bool stalled = false;      // reported kStalled: nobody waits for it any more
  };
  // A load (host -> device) in flight was reported stalled.
  bool loads_stalled() const;
  // Copies are in flight and every one of them was reported stalled: nothing to wait for.
  bool only_stalled_copies() const;
  std::unordered_map<TransferTicket, PendingTransfer> pending_transfers_;
  // Tests (EngineState::set_copy_gate): asked for each finished copy at each poll; false
  // keeps it in flight (in held_copies_) until a later poll, as a busy machine would.
  std::function<bool()> copy_gate_;
  std::vector<TransferOutcome> held_copies_;
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
  std::vector<SessionWaiter> session_waiters_;  // tool_session() callers, scheduler thread
  int64_t last_session_tick_ms_ = 0;
  // Disaggregation on a model with KV memory of its own: the host pool the transports read
  // and write (null otherwise). Declared before pd_: the transport goes first.
  std::unique_ptr<PdStage> pd_stage_;
  struct StagedSend {
    uint64_t room = 0;
    PageBatch batch;            // src_pages: the device pages, then the stage pages
    std::vector<PageId> stage;  // empty while it waits for stage pages
    TransferTicket ticket = 0;  // its device -> stage copy, once submitted
  };
  // Prefill side: sends waiting for stage pages or their copy, in order; and the stage pages
  // the transport reads, by (room, first index) until its completion.
  std::deque<StagedSend> stage_sends_;
  std::map<std::pair<uint64_t, int32_t>, std::vector<PageId>> stage_in_send_;
  // Decode side: stage -> device copies of received rooms, by ticket.
  std::unordered_map<TransferTicket, uint64_t> stage_loads_;
  // Disaggregation (null without it). Declared after the pool: the transport goes first.
  std::unique_ptr<PdLink> pd_;
  // Decode side: requests whose prompt a prefill worker computes; pages of failed rooms the
  // peer may still write into, by room, until the quarantine ends.
  std::vector<std::unique_ptr<Seq>> remote_;
  // (With a stage: the stage's pages; the room's device pages went back at once.)
  std::unordered_map<uint64_t, std::vector<PageId>> quarantine_;
  // Prefill side: the orders taken, by room; requests whose last pages are on their way.
  std::unordered_map<uint64_t, RemoteOrder> orders_;
  std::vector<std::unique_ptr<Seq>> pd_sending_;

  // Scheduler thread only.
  std::deque<std::unique_ptr<Seq>> waiting_;
  std::vector<std::unique_ptr<Seq>> running_;
  // The two batches (one running, one prepared beside it), the one launched and not yet
  // read (null: none), ids, and what waits for the batch in flight.
  std::array<std::unique_ptr<Batch>, 2> batches_;
  Batch* cur_ = nullptr;
  uint64_t next_batch_id_ = 1;
  uint64_t ahead_batch_ = 0;  // while a batch is read: the id of the one launched after it
  std::vector<PageId> deferred_free_;
  // The last-position logits of recent prompts (full hits sample from them): 32 MiB holds
  // ~230 prompts of 3,000 tokens with a 32,000-token vocabulary, ~50 with Qwen3's.
  PromptLogitsCache prompt_logits_{size_t{32} << 20};
  StepBudget budget_;
  EngineCounters counters_;
  int64_t last_expiry_check_ms_ = 0;

  // Inbox, shared with submitters.
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Seq>> inbox_;                  // GUARDED_BY(mutex_)
  std::deque<std::function<void(EngineState&)>> commands_;  // GUARDED_BY(mutex_)
  EngineCounters published_counters_;                       // GUARDED_BY(mutex_)
  bool stopping_ = false;                                   // GUARDED_BY(mutex_)
  bool pd_signal_ = false;  // GUARDED_BY(mutex_): messages or completions arrived
  // The forward thread: the batches to run in order (at most two), handed over and back
  // under mutex_ (Batch::done).
  std::deque<Batch*> forward_queue_;  // GUARDED_BY(mutex_)
  // Set only once the scheduler thread has exited: it may hand the forward thread a batch
  // until its last step, so the forward thread outlives it (~Scheduler).
  bool forward_stopping_ = false;  // GUARDED_BY(mutex_)
  std::condition_variable forward_wake_;
  bool inline_forward_ = false;  // STRATA_INLINE_FORWARD: no forward thread
  std::thread forward_thread_;
  std::atomic<uint64_t> next_id_{1};
  std::thread thread_;
};

}  // namespace strata
