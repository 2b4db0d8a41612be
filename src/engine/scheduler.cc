#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>

#include "common/check.h"
#include "common/log.h"
#include "engine/page_math.h"
#include "engine/scheduler_seq.h"
#include "engine/step_plan.h"
#include "engine/storage_worker.h"
#include "memory/stream_transfer_engine.h"
#include "memory/transfer_engine.h"

namespace strata {

// One forward pass handed to the forward thread (scheduler.h, "Overlapped steps"). `rows`
// point into `tokens` and `pages`, which the batch owns; `future` rows have their token
// written into `tokens` by resolve_futures() before the pass.
struct Scheduler::Batch {
  uint64_t id = 0;
  std::vector<Planned> plan;
  std::vector<ForwardSequence> rows;
  std::vector<int32_t> tokens;
  std::vector<PageId> pages;
  std::vector<size_t> token_at;     // per row: where its tokens start in `tokens`
  std::vector<int32_t> logits_row;  // per row: its row of the output, or -1
  // Per output row: the draw its token is taken with when the next batch needs that token
  // before the scheduler reads this one (set by prepare_next), and the token so drawn on the
  // forward thread (resolve_futures), which read_batch() then uses.
  std::vector<std::optional<RowSampling>> draws;
  std::vector<std::optional<SampledToken>> resolved;
  Batch* prev = nullptr;  // the batch whose tokens the future rows take
  bool poisoned = false;  // the batch before failed: not run
  int64_t prefill_tokens = 0;
  int64_t decode_tokens = 0;
  ForwardOutput output;
  Status status;
  double forward_ms = 0.0;
  bool done = true;  // GUARDED_BY(mutex_) while handed over
};

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "error";
}

Result<std::unique_ptr<Scheduler>> Scheduler::create(
    ForwardModel* model, EngineOptions options, std::function<void(std::vector<KvEvent>)> publish,
    const Clock* clock) {
  STRATA_CHECK(model != nullptr);
  if (const std::optional<ExternalKv> external = model->external_kv();
      external && kv_dtype_is_scaled(options.kv_dtype) &&
      external->shape.dtype != options.kv_dtype) {
    // A model with KV memory of its own (a GPU's) keeps its pages in its own dtype; its
    // kernels read no 8-bit pages (issue 54).
    std::string m = "--kv-cache-dtype ";
    m.append(kv_dtype_name(options.kv_dtype))
        .append(": this model keeps its KV pages in memory of its own, as ")
        .append(kv_dtype_name(external->shape.dtype))
        .append("; 8-bit pages run on the CPU engine (--device cpu)");
    return bad_argument(std::move(m));
  }
  if (options.kv_cache_memory_bytes > 0) {
    // The pages of the model's shape: its memory's own for a model that keeps it (a GPU's);
    // else the config's, so that a simulated worker (whose pages hold hashes) is sized as
    // the model it stands for.
    const std::optional<ExternalKv> external = model->external_kv();
    const ModelConfig& c = model->config();
    KvPoolShape shape =
        external ? external->shape : KvPoolShape{c.num_layers,      c.num_kv_heads,  c.head_dim, 1,
                                                 options.page_size, options.kv_dtype};
    shape.num_pages = 1;
    shape.page_size = options.page_size;
    if (auto st = validate_kv_pool_shape(shape); !st) return std::unexpected(st.error());
    if (auto st = size_pool_by_memory(options, kv_page_bytes(shape)); !st) {
      return std::unexpected(st.error());
    }
  }
  if (auto st = validate(options); !st) return std::unexpected(st.error());
  std::unique_ptr<Scheduler> engine(new Scheduler(model, options, std::move(publish), clock));
  auto pool = model->make_kv_pool(engine->num_pages_, options.page_size, options.kv_dtype);
  if (!pool) return std::unexpected(pool.error());
  engine->kv_pool_ = std::move(*pool);
  if (options.hicache.enabled) {
    if (auto st = engine->init_hicache(); !st) return std::unexpected(st.error());
  }
  if (options.pd.enabled()) {
    if (auto st = engine->init_pd(); !st) return std::unexpected(st.error());
  }
  engine->sessions_ =
      std::make_unique<ToolSessions>(*engine->tree_, *engine->clock_, options.tool_session_ttl_ms,
                                     options.max_sessions, options.session_idle_ttl_ms);
  engine->forward_thread_ = std::thread([raw = engine.get()] { raw->run_forward_thread(); });
  engine->thread_ = std::thread([raw = engine.get()] { raw->run(); });
  return engine;
}

Scheduler::Scheduler(ForwardModel* model, EngineOptions options,
                     std::function<void(std::vector<KvEvent>)> publish, const Clock* clock)
    : model_(model),
      options_(options),
      publish_(std::move(publish)),
      clock_(clock != nullptr ? clock : &SteadyClock::instance()),
      chooses_tokens_(model->chooses_tokens()),
      budget_(StepBudgetOptions{.itl_target_ms = options.itl_target_ms,
                                .min_prefill_tokens = options.min_prefill_tokens,
                                .max_prefill_tokens = options.chunked_prefill_size}) {
  num_pages_ = options_.kv_cache_tokens / options_.page_size;
  auto hasher = block_hasher_for(options_);
  STRATA_CHECK(hasher.has_value());  // create() validated the options
  hasher_ = *hasher;
  // A measurement knob (docs/scheduling.md): the forward pass on the scheduler thread, as
  // before commands ran during it.
  inline_forward_ = std::getenv("STRATA_INLINE_FORWARD") != nullptr;
  for (auto& b : batches_) b = std::make_unique<Batch>();
  allocator_ = std::make_unique<PageAllocator>(num_pages_);
  tree_ = std::make_unique<RadixTree>(
      RadixTreeOptions{.page_size = options_.page_size, .hasher = hasher_}, allocator_.get(),
      &events_, clock_);
}

Scheduler::~Scheduler() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  // The scheduler thread first: a step it is in may still hand the forward thread a batch
  // and wait for it. Stopping both at once let the forward thread exit first and left that
  // step waiting forever (seen under ThreadSanitizer, which widens the window).
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard lock(mutex_);
    forward_stopping_ = true;
  }
  forward_wake_.notify_one();
  if (forward_thread_.joinable()) forward_thread_.join();
  // Its transfers end (and report through the wake-up) while everything here still lives.
  pd_.reset();
}

Status Scheduler::init_hicache() {
  const HierarchicalCacheOptions& h = options_.hicache;
  // A model with KV memory of its own (the GPU's): the host pool takes its pages' real
  // shape (the engine's pool only counts them), and copies go through its copy device.
  const std::optional<ExternalKv> external = model_->external_kv();
  if (!external && h.io_backend != CopyPath::kDirect) {
    return bad_argument(
        "--hicache-io-backend kernel needs --device cuda (the CPU engine copies with threads)");
  }
  KvPoolShape shape = external ? external->shape : kv_pool_->shape();
  if (auto st = validate_kv_pool_shape(shape); !st) return st;
  if (shape.num_pages != num_pages_ || shape.page_size != options_.page_size) {
    return make_error(ErrorCode::kInternal,
                      "the model's KV memory has " + std::to_string(shape.num_pages) +
                          " pages of " + std::to_string(shape.page_size) +
                          " tokens, the engine's pool " + std::to_string(num_pages_) + " of " +
                          std::to_string(options_.page_size));
  }
  const size_t page_bytes = kv_page_bytes(shape);
  const double host_pages_d = h.size_gb > 0 ? h.size_gb * 1e9 / static_cast<double>(page_bytes)
                                            : h.ratio * static_cast<double>(num_pages_);
  if (host_pages_d <= num_pages_) {
    return make_error(ErrorCode::kInvalidArgument,
                      "the host pool (" + std::to_string(static_cast<int64_t>(host_pages_d)) +
                          " pages) must be larger than the device pool (" +
                          std::to_string(num_pages_) + " pages)");
  }
  if (host_pages_d > 1e9) return make_error(ErrorCode::kInvalidArgument, "host pool too large");
  shape.num_pages = static_cast<int32_t>(host_pages_d);
  auto host = HostKvPool::create(shape, h.layout);
  if (!host) return std::unexpected(host.error());
  host_pool_ = std::move(*host);
  if (external) {
    const auto host_blocks = host_pool_->block_layout();
    if (!host_blocks) {
      return bad_argument(
          "--hicache-mem-layout page_first: a GPU copies whole blocks, which that layout "
          "interleaves; use layer_first or page_first_direct");
    }
    auto device = model_->make_copy_device(
        std::span<std::byte>(host_pool_->data(), host_pool_->total_bytes()), h.io_backend);
    if (!device) return std::unexpected(device.error());
    copy_device_ = std::move(*device);
    transfers_ = std::make_unique<StreamTransferEngine>(
        *copy_device_, external->blocks, *host_blocks, StreamTransferOptions{}, *clock_);
  } else {
    transfers_ = std::make_unique<TransferEngine>(*kv_pool_, *host_pool_, h.transfer_threads);
  }
  host_allocator_ = std::make_unique<PageAllocator>(shape.num_pages);
  RadixTreeOptions topts{.page_size = options_.page_size,
                         .write_policy = h.write_policy,
                         .write_through_threshold = h.write_through_threshold,
                         .hasher = hasher_};
  tree_ =
      std::make_unique<RadixTree>(topts, allocator_.get(), &events_, clock_, host_allocator_.get());
  if (!h.storage_backend.empty()) {
    auto cfg = parse_storage_config(h.storage_backend, h.storage_extra_config);
    if (!cfg) return std::unexpected(cfg.error());
    storage_config_ = std::move(*cfg);
    if (storage_config_.name_space.empty()) storage_config_.name_space = h.storage_namespace;
    storage_config_.page_format = kv_page_format(shape, external.has_value());
    auto backend = make_storage_backend(storage_config_);
    if (!backend) return std::unexpected(backend.error());
    storage_ = std::move(*backend);
    storage_worker_ = std::make_unique<StorageWorker>(storage_.get(), host_pool_.get());
  }
  STRATA_LOG_INFO("hierarchical cache: host pool {} pages ({:.2f} GB, {}), write policy {}{}",
                  shape.num_pages, static_cast<double>(host_pool_->total_bytes()) / 1e9,
                  host_layout_name(h.layout), write_policy_name(h.write_policy),
                  storage_ ? ", storage " + h.storage_backend : std::string());
  return {};
}

bool Scheduler::io_busy() const {
  return !pending_transfers_.empty() || !pending_storage_.empty() || !parked_.empty();
}

TransferTicket Scheduler::submit_transfers(uint64_t load_for_seq, bool overlapped) {
  if (!transfers_) return 0;
  TransferTicket load = 0;
  for (TransferRequest& req : tree_->take_transfers()) {
    const bool is_load = req.direction == TransferDirection::kHostToDevice && load_for_seq != 0;
    TransferJob job;
    job.direction = req.direction;
    job.device_pages = req.device_pages;
    job.host_pages = req.host_pages;
    job.layer_by_layer = is_load && overlapped;
    const TransferTicket t = transfers_->submit(std::move(job));
    PendingTransfer pending{std::move(req)};
    if (is_load) {
      (overlapped ? pending.running_seq : pending.waiting_seq) = load_for_seq;
      load = t;
    }
    pending_transfers_.emplace(t, std::move(pending));
  }
  return load;
}

void Scheduler::settle_load(Seq& seq) {
  const TransferTicket t = seq.load_ticket;
  if (t == 0 || seq.load_failed) return;
  // The pass waited for every layer, so the copy has landed unless it failed; a stalled one
  // gives up at its deadline.
  if (pending_transfers_.contains(t)) {
    (void)transfers_->wait_resolved(t);  // the outcome comes through poll_io
    poll_io(/*force=*/true);
  }
  if (seq.load_ticket != 0 && !seq.load_failed) {
    // Still unresolved after its deadline (no outcome yet): what the pass read is not known.
    seq.load_failed = true;
  }
}

void Scheduler::abandon_failed_loads() {
  for (size_t i = 0; i < running_.size();) {
    Seq& seq = *running_[i];
    if (!seq.load_failed) {
      ++i;
      continue;
    }
    // pages[0, tree_pages) are the load's (its node's, given back or held by the copy): only
    // the request's own pages go, uncached, as what it computed over them may be wrong.
    allocator_->free(
        std::span<const PageId>(seq.pages).subspan(static_cast<size_t>(seq.tree_pages)));
    seq.pages.clear();
    seq.tree_pages = 0;
    seq.computed = 0;
    if (seq.receipt.valid()) STRATA_CHECK(tree_->release(seq.receipt).has_value());
    seq.receipt = LockReceipt{};
    seq.load_ticket = 0;
    seq.load_failed = false;
    seq.layer_wait = nullptr;
    seq.move_to(SeqState::kWaiting);
    ++counters_.loads_abandoned;
    waiting_.push_front(std::move(running_[i]));
    running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

void Scheduler::publish_load_gauges() {
  counters_.free_pages = allocator_->num_free();
  // What admission counts on (reclaimable_pages()), not the evictable leaves alone: a
  // finished request's prompt is an inner node (its output or a sibling sharing the prefix
  // hangs below it), freed by eviction leaf first. Counting only leaves showed a worker whose
  // cache filled with long prompts as saturated with a few requests running (issue 33: a
  // router answered 429 to a third of a trace of 10,000-token prompts).
  counters_.evictable_pages = reclaimable_pages() - counters_.free_pages;
  counters_.recomputed_pages_recent = std::llround(tree_->recomputed_pages_recent());
  int64_t prefill = 0;
  for (const auto& seq : waiting_) {
    prefill += static_cast<int64_t>(seq->tokens.size()) - seq->computed;
  }
  for (const auto& seq : running_) {
    if (seq->computed < seq->prompt_len) prefill += seq->prompt_len - seq->computed;
  }
  counters_.queued_prefill_tokens = prefill;
}

void Scheduler::land_loads() {
  if (!transfers_) return;
  submit_transfers();
  for (const auto& [ticket, pending] : pending_transfers_) {
    if (pending.request.direction == TransferDirection::kHostToDevice) {
      (void)transfers_->wait_resolved(ticket);  // a failure is handled by poll_io
    }
  }
  poll_io(/*force=*/true);
  counters_.tool_sessions_expired += static_cast<uint64_t>(sessions_->tick());
  last_session_tick_ms_ = clock_->now_ms();
}

bool Scheduler::only_stalled_copies() const {
  if (pending_transfers_.empty()) return false;
  for (const auto& [ticket, pending] : pending_transfers_) {
    if (!pending.stalled) return false;
  }
  return true;
}

bool Scheduler::loads_stalled() const {
  for (const auto& [ticket, pending] : pending_transfers_) {
    if (pending.stalled && pending.request.direction == TransferDirection::kHostToDevice) {
      return true;
    }
  }
  return false;
}

void Scheduler::unpark(uint64_t seq_id) {
  for (size_t i = 0; i < parked_.size(); ++i) {
    if (parked_[i]->id != seq_id) continue;
    parked_[i]->move_to(SeqState::kWaiting);
    waiting_.push_front(std::move(parked_[i]));
    parked_.erase(parked_.begin() + static_cast<std::ptrdiff_t>(i));
    return;
  }
}

void Scheduler::start_prefetch(Seq& seq, const MatchResult& m) {
  const int32_t ps = options_.page_size;
  const int32_t first = m.num_pages + m.host_num_pages;
  const size_t full = (seq.tokens.size() - 1) / static_cast<size_t>(ps);
  PendingStorage p;
  p.seq_id = seq.id;
  p.tokens.assign(seq.tokens.begin(), seq.tokens.begin() + static_cast<std::ptrdiff_t>(full * ps));
  p.cache_salt = seq.spec.cache_salt;
  p.first_page = first;
  std::vector<BlockHash> all = tree_->block_hashes_of(p.tokens, p.cache_salt);
  StorageTask task;
  task.kind = StorageTask::Kind::kExists;
  task.hashes.assign(all.begin() + first, all.end());
  const uint64_t id = storage_worker_->submit(std::move(task));
  pending_storage_.emplace(id, std::move(p));
  ++counters_.prefetches_started;
}

// A copy that landed: the tree learns it, a backup continues to storage, the request that
// waited for a load runs. One that failed: the tree gives its pages back (the device pages
// of a load; the host pages of a backup) and the request that waited recomputes what it
// could not load. One that stalled: the request that waited stops waiting and recomputes;
// the pages stay with the copy until it resolves.
void Scheduler::on_transfer(const TransferOutcome& outcome) {
  auto it = pending_transfers_.find(outcome.ticket);
  if (it == pending_transfers_.end()) return;
  // The running request that reads this load as it lands (overlapped), if it still does.
  Seq* reader = nullptr;
  if (it->second.running_seq != 0) {
    for (auto& seq : running_) {
      if (seq->id == it->second.running_seq && seq->load_ticket == outcome.ticket) {
        reader = seq.get();
      }
    }
  }
  if (outcome.result == TransferResult::kStalled) {
    ++counters_.copies_stalled;
    it->second.stalled = true;
    STRATA_LOG_WARN("a KV copy of {} pages is stalled ({})", it->second.request.hashes.size(),
                    outcome.error);
    if (it->second.waiting_seq != 0) unpark(std::exchange(it->second.waiting_seq, 0));
    it->second.running_seq = 0;
    if (reader != nullptr) reader->load_failed = true;
    return;
  }
  PendingTransfer done = std::move(it->second);
  pending_transfers_.erase(it);
  const bool ok = outcome.result == TransferResult::kLanded;
  if (!ok) {
    ++counters_.copy_faults;
    STRATA_LOG_WARN("a KV copy of {} pages failed: {}", done.request.hashes.size(), outcome.error);
  }
  tree_->complete_transfer(done.request, ok);
  if (reader != nullptr) {
    if (ok) {
      // Its prefix is the tree's device pages now: counted as loaded from the host.
      reader->load_ticket = 0;
      count_admission(*reader);
    } else {
      reader->load_failed = true;  // the pages went back: it steps back (abandon_failed_loads)
    }
  }
  if (ok && done.request.direction == TransferDirection::kDeviceToHost && storage_worker_) {
    auto items = tree_->begin_storage_write(done.request.hashes);
    if (!items.empty()) {
      StorageTask task;
      task.kind = StorageTask::Kind::kWrite;
      for (const auto& [h, page] : items) {
        task.hashes.push_back(h);
        task.host_pages.push_back(page);
      }
      pending_storage_.emplace(storage_worker_->submit(std::move(task)), PendingStorage{});
    }
  }
  if (done.waiting_seq != 0) unpark(done.waiting_seq);
}

Status Scheduler::use_copy_device(CopyDevice& device, int64_t stall_timeout_ms) {
  if (!transfers_) return bad_argument("no host tier: nothing is copied");
  const auto host_blocks = host_pool_->block_layout();
  if (!host_blocks) return bad_argument("the page_first host layout has no block layout");
  while (!pending_transfers_.empty()) {
    for (const auto& [ticket, pending] : pending_transfers_)
      (void)transfers_->wait_resolved(ticket);
    poll_io(/*force=*/true);
  }
  const std::optional<ExternalKv> external = model_->external_kv();
  transfers_ = std::make_unique<StreamTransferEngine>(
      device, external ? external->blocks : kv_pool_->block_layout(), *host_blocks,
      StreamTransferOptions{.stall_timeout_ms = stall_timeout_ms}, *clock_);
  return {};
}

// Finished copies and storage calls: the tree learns what landed, parked requests go back
// to the queue, backups continue to storage, prefetch hits become host nodes.
void Scheduler::poll_io(bool force) {
  if (!transfers_) return;
  std::vector<TransferOutcome> landed = std::move(held_copies_);
  held_copies_.clear();
  for (TransferOutcome& o : transfers_->take_outcomes()) landed.push_back(std::move(o));
  for (TransferOutcome& o : landed) {
    if (!force && copy_gate_ && !copy_gate_()) {
      held_copies_.push_back(std::move(o));  // (tests) it lands at a later poll
      continue;
    }
    on_transfer(o);
  }
  if (!storage_worker_) return;
  for (StorageTaskResult& r : storage_worker_->take_results()) {
    auto it = pending_storage_.find(r.id);
    STRATA_CHECK(it != pending_storage_.end());
    PendingStorage p = std::move(it->second);
    pending_storage_.erase(it);
    counters_.storage_faults += static_cast<uint64_t>(r.failures);
    if (r.kind == StorageTask::Kind::kWrite) {
      tree_->finish_storage_write(r.hashes, r.ok);
      for (uint8_t ok : r.ok) counters_.storage_pages_written += ok;
      continue;
    }
    if (r.kind == StorageTask::Kind::kExists) {
      const int32_t hits = r.leading_hits;
      std::vector<PageId> pages;
      if (hits > 0) {
        if (host_allocator_->num_free() < hits)
          tree_->evict_host(hits - host_allocator_->num_free());
        if (!host_allocator_->allocate(hits, pages)) pages.clear();
      }
      if (pages.empty()) {
        unpark(p.seq_id);
        continue;
      }
      storage_read_pages_.insert(storage_read_pages_.end(), pages.begin(), pages.end());
      StorageTask task;
      task.kind = StorageTask::Kind::kRead;
      task.hashes.assign(r.hashes.begin(), r.hashes.begin() + hits);
      task.host_pages = pages;
      p.tokens.resize(static_cast<size_t>(p.first_page + hits) * options_.page_size);
      pending_storage_.emplace(storage_worker_->submit(std::move(task)), std::move(p));
      continue;
    }
    // kRead: the leading run of verified pages becomes host nodes; the rest goes back.
    std::erase_if(storage_read_pages_, [&](PageId x) {
      return std::find(r.host_pages.begin(), r.host_pages.end(), x) != r.host_pages.end();
    });
    size_t good = 0;
    while (good < r.ok.size() && r.ok[good] != 0) ++good;
    std::vector<PageId> to_free(r.host_pages.begin() + static_cast<std::ptrdiff_t>(good),
                                r.host_pages.end());
    int32_t adopted = 0;
    if (good > 0) {
      const std::span<const int32_t> tokens(
          p.tokens.data(),
          static_cast<size_t>(p.first_page + static_cast<int32_t>(good)) * options_.page_size);
      InsertResult ins = tree_->insert_host(
          tokens, p.first_page, std::span<const PageId>(r.host_pages.data(), good), p.cache_salt);
      to_free.insert(to_free.end(), ins.rejected_pages.begin(), ins.rejected_pages.end());
      adopted = ins.num_new_pages;
      counters_.prefetch_pages_read += static_cast<uint64_t>(adopted);
    }
    host_allocator_->free(to_free);
    for (auto& seq : parked_) {
      if (seq->id == p.seq_id) {
        seq->storage_tokens += adopted * options_.page_size;
        seq->load_tried = false;  // load what just arrived
      }
    }
    unpark(p.seq_id);
  }
}

EngineCounters Scheduler::counters() const {
  std::lock_guard lock(mutex_);
  return published_counters_;
}

Result<std::shared_ptr<RequestStream>> Scheduler::submit(RequestSpec spec) {
  const ModelConfig& cfg = model_->config();
  if (spec.prompt.empty()) return make_error(ErrorCode::kInvalidArgument, "the prompt is empty");
  for (int32_t t : spec.prompt) {
    if (t < 0 || t >= cfg.vocab_size) {
      return make_error(ErrorCode::kInvalidArgument, "token id " + std::to_string(t) +
                                                         " is outside the vocabulary [0, " +
                                                         std::to_string(cfg.vocab_size) + ")");
    }
  }
  if (spec.max_tokens < 1)
    return make_error(ErrorCode::kInvalidArgument, "max_tokens must be >= 1");
  if (spec.priority < kMinRequestPriority || spec.priority > kMaxRequestPriority) {
    return make_error(ErrorCode::kInvalidArgument,
                      "priority must be in [" + std::to_string(kMinRequestPriority) + ", " +
                          std::to_string(kMaxRequestPriority) + "] (lower is served first)");
  }
  const int64_t context = cfg.max_position_embeddings;
  if (static_cast<int64_t>(spec.prompt.size()) >= context) {
    return make_error(ErrorCode::kInvalidArgument,
                      "the prompt has " + std::to_string(spec.prompt.size()) +
                          " tokens; the model's context is " + std::to_string(context));
  }
  // Generation stops at the context length; never fail a request for asking too much.
  spec.max_tokens = static_cast<int32_t>(
      std::min<int64_t>(spec.max_tokens, context - static_cast<int64_t>(spec.prompt.size())));
  const int64_t pages_needed =
      pages_to_run(static_cast<int64_t>(spec.prompt.size()), options_.page_size);
  if (pages_needed > num_pages_) {
    return make_error(ErrorCode::kResourceExhausted,
                      "the prompt needs " + std::to_string(pages_needed) +
                          " KV pages; the device pool has " + std::to_string(num_pages_));
  }
  // Nor at the pool's size: the KV of prompt + output (all but the last token) must fit
  // the device pool, or the request could never finish. It ends with kLength there.
  const int64_t pool_tokens = static_cast<int64_t>(num_pages_) * options_.page_size;
  // (A retracted request re-admits with one free slot: prompt + max_tokens <= pool.)
  spec.max_tokens = static_cast<int32_t>(
      std::min<int64_t>(spec.max_tokens, pool_tokens - static_cast<int64_t>(spec.prompt.size())));
  if (auto st = validate_sampling_params(spec.sampling); !st) return std::unexpected(st.error());
  for (int32_t t : spec.sampling.stop_token_ids) {
    if (t < 0 || t >= cfg.vocab_size) {
      return make_error(ErrorCode::kInvalidArgument,
                        "stop token id " + std::to_string(t) + " is outside the vocabulary");
    }
  }
  auto seq = std::make_unique<Seq>();
  seq->id = next_id_.fetch_add(1);
  seq->stream = std::make_shared<RequestStream>(seq->id);
  seq->tokens = spec.prompt;
  seq->prompt_len = static_cast<int32_t>(spec.prompt.size());
  seq->sampler.emplace(spec.sampling, seq->id);
  seq->spec = std::move(spec);
  auto stream = seq->stream;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return make_error(ErrorCode::kFailedPrecondition, "the engine is stopping");
    inbox_.push_back(std::move(seq));
  }
  wake_.notify_one();
  return stream;
}

void Scheduler::post(std::function<void(EngineState&)> command) {
  {
    std::lock_guard lock(mutex_);
    commands_.push_back(std::move(command));
  }
  wake_.notify_one();
}

std::future<Result<ToolSessionView>> Scheduler::tool_session(std::string id,
                                                             std::optional<uint64_t> end_epoch,
                                                             std::function<void()> on_ready) {
  auto waiter = std::make_shared<SessionWaiter>();
  waiter->id = std::move(id);
  waiter->start = !end_epoch.has_value();
  waiter->epoch = end_epoch.value_or(0);
  waiter->on_ready = std::move(on_ready);
  auto future = waiter->promise.get_future();
  post([this, waiter](EngineState& s) {
    waiter->deadline_ms = clock_->now_ms() + kRestoreRoomWaitMs;
    session_waiters_.push_back(std::move(*waiter));
    serve_session_waiters(s);
  });
  return future;
}

void Scheduler::serve_session_waiters(EngineState& s) {
  for (size_t i = 0; i < session_waiters_.size();) {
    SessionWaiter& w = session_waiters_[i];
    std::optional<Result<ToolSessionView>> answer = advance(w, s);
    if (!answer) {
      ++i;
      continue;
    }
    w.promise.set_value(std::move(*answer));
    if (w.on_ready) w.on_ready();
    session_waiters_.erase(session_waiters_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

std::optional<Result<ToolSessionView>> Scheduler::advance(SessionWaiter& w, EngineState& s) {
  const int64_t now_ms = clock_->now_ms();
  if (!w.begun) {
    Result<ToolSessionView> r =
        w.start ? sessions_->tool_start(w.id) : sessions_->tool_end(w.id, w.epoch);
    if (!r && r.error().code == ErrorCode::kOutOfPages) {
      // The device is held by running requests: a restoring agent goes first. They step
      // back (their computed pages stay cached, demoted or evicted like any other) and the
      // restore runs now instead of waiting for them to finish (docs/scheduling.md).
      // During a forward pass they cannot: the restore waits for the step's end.
      auto meta = sessions_->kv_meta(w.id);
      if (!meta) return Result<ToolSessionView>(std::unexpected(meta.error()));
      if (s.make_device_room(pages_for(meta->tokens, options_.page_size) + 1) > 0) {
        r = sessions_->tool_end(w.id, w.epoch);
      }
      // Still none: only other resuming sessions (or copies in flight) hold the pool, and
      // their pages come back; the session stays OFFLOADED meanwhile.
      if (!r && r.error().code == ErrorCode::kOutOfPages && now_ms < w.deadline_ms) {
        return std::nullopt;
      }
    }
    if (!r) return r;
    w.begun = true;
    w.moved_tokens = r->moved_tokens;
    w.deadline_ms = now_ms + kSessionMoveWaitMs;
    // A restore's copies take far less than a step: land them now, so that the answer (and
    // the agent's next request) need not wait for the scheduler's next iteration.
    if (!w.start && r->state == ToolSessionState::kRestoring) land_loads();
  }
  auto view = sessions_->kv_meta(w.id);
  if (!view) return view;
  const bool moving =
      view->state == ToolSessionState::kOffloading || view->state == ToolSessionState::kRestoring;
  // A restore whose copy stalled is answered at once, RESTORING: the agent's next request
  // computes what has not landed (the stalled pages stay with the copy until it resolves).
  const bool stalled = view->state == ToolSessionState::kRestoring && loads_stalled();
  if (moving && !stalled && now_ms < w.deadline_ms) return std::nullopt;
  view->moved_tokens = w.moved_tokens;
  return view;
}

EngineState Scheduler::make_state() {
  EngineState s{*tree_, *allocator_, *kv_pool_, options_, counters_, 0, {}};
  s.host_pages = host_allocator_.get();
  s.sessions = sessions_.get();
  s.storage = storage_.get();
  for (const auto* list : {&running_, &remote_, &pd_sending_}) {
    for (const auto& seq : *list) {
      s.request_private_pages += static_cast<int64_t>(seq->pages.size()) - seq->tree_pages;
    }
  }
  // Pages of failed rooms in quarantine are held too (docs/pd-disaggregation.md); with a
  // stage they are the stage's.
  for (const auto& [room, pages] : quarantine_) {
    if (!pd_stage_) s.request_private_pages += static_cast<int64_t>(pages.size());
  }
  s.request_private_pages += static_cast<int64_t>(deferred_free_.size());
  s.audit_pages = [this] { return audit_pages(); };
  s.make_device_room = [this](int64_t pages) { return make_room_for_restore(pages); };
  s.land_loads = [this] { land_loads(); };
  s.set_copy_gate = [this](std::function<bool()> gate) { copy_gate_ = std::move(gate); };
  s.use_copy_device = [this](CopyDevice& device, int64_t stall_timeout_ms) {
    return use_copy_device(device, stall_timeout_ms);
  };
  return s;
}

Status Scheduler::audit_states() const {
  auto check = [](const auto& list, std::initializer_list<SeqState> states,
                  const char* where) -> Status {
    for (const auto& seq : list) {
      if (std::find(states.begin(), states.end(), seq->state) == states.end()) {
        return make_error(ErrorCode::kInternal, std::string("a request in ") + where +
                                                    " is in state " + seq_state_name(seq->state));
      }
    }
    return {};
  };
  if (auto st = check(waiting_, {SeqState::kWaiting}, "waiting_"); !st) return st;
  if (auto st = check(parked_, {SeqState::kParked}, "parked_"); !st) return st;
  if (auto st = check(remote_, {SeqState::kOrdered, SeqState::kReceiving}, "remote_"); !st)
    return st;
  if (auto st = check(running_, {SeqState::kRunning}, "running_"); !st) return st;
  return check(pd_sending_, {SeqState::kSending}, "pd_sending_");
}

Status Scheduler::audit_pages() const {
  if (auto st = audit_states(); !st) return st;
  std::vector<PageId> owned;
  tree_->collect_device_pages(owned);
  for (const auto* list : {&running_, &remote_, &pd_sending_}) {
    for (const auto& seq : *list) {
      owned.insert(owned.end(), seq->pages.begin() + seq->tree_pages, seq->pages.end());
    }
  }
  if (!pd_stage_) {
    for (const auto& [room, pages] : quarantine_)
      owned.insert(owned.end(), pages.begin(), pages.end());
  }
  owned.insert(owned.end(), deferred_free_.begin(), deferred_free_.end());
  if (auto st = allocator_->audit(owned); !st) return st;
  if (pd_stage_) {
    // The stage's pages: rooms ordered or being copied in, sends being staged or sent, and
    // quarantined rooms.
    std::vector<PageId> staged;
    for (const auto& seq : remote_) {
      staged.insert(staged.end(), seq->pd_stage_pages.begin(), seq->pd_stage_pages.end());
    }
    for (const StagedSend& send : stage_sends_) {
      staged.insert(staged.end(), send.stage.begin(), send.stage.end());
    }
    for (const auto& [key, pages] : stage_in_send_) {
      staged.insert(staged.end(), pages.begin(), pages.end());
    }
    for (const auto& [room, pages] : quarantine_) {
      staged.insert(staged.end(), pages.begin(), pages.end());
    }
    if (auto st = pd_stage_->pages().audit(staged); !st) {
      return make_error(st.error().code, "the P/D stage: " + st.error().message);
    }
  }
  if (!host_allocator_) return {};
  owned.clear();
  tree_->collect_host_pages(owned);
  owned.insert(owned.end(), storage_read_pages_.begin(), storage_read_pages_.end());
  return host_allocator_->audit(owned);
}

void Scheduler::run() {
  bool progressed = true;
  for (;;) {
    std::deque<std::unique_ptr<Seq>> arrived;
    std::deque<std::function<void(EngineState&)>> commands;
    bool stop = false;
    {
      std::unique_lock lock(mutex_);
      const bool busy = (!running_.empty() || !waiting_.empty()) && progressed;
      if (!busy) {
        // Idle (or waiting on copies): sleep until work arrives, waking now and then for
        // soft-pin expiry, or soon when copies are in flight.
        // (Copies through the P/D stage are polled as the host tier's are.)
        const bool staging = pd_stage_ && (pd_stage_->in_flight() > 0 || !stage_sends_.empty());
        const auto nap = io_busy() || staging || !running_.empty() || !waiting_.empty() ||
                                 !session_waiters_.empty()
                             ? std::chrono::milliseconds(1)
                         : pd_busy() ? std::chrono::milliseconds(5)
                                     : std::chrono::milliseconds(200);
        wake_.wait_for(lock, nap, [&] {
          return stopping_ || !inbox_.empty() || !commands_.empty() || pd_signal_;
        });
      }
      pd_signal_ = false;
      arrived.swap(inbox_);
      commands.swap(commands_);
      stop = stopping_;
    }
    for (auto& seq : arrived) {
      seq->arrival_ms = clock_->now_ms();
      if (!seq->spec.session_id.empty()) {
        if (sessions_->on_request_arrived(seq->spec.session_id)) seq->cls = SchedClass::kResume;
      }
      if (seq->cls == SchedClass::kNormal &&
          tree_->operator_pinned_prefix(seq->tokens, seq->spec.cache_salt)) {
        seq->cls = SchedClass::kVip;
      }
      waiting_.push_back(std::move(seq));
    }
    poll_io();
    pd_poll();
    // Tool sessions advance as their copies land, before the commands run: a restore that
    // landed during the last step is RUNNABLE to the kv_meta that asks now, not a step later.
    if (const int64_t now_ms = clock_->now_ms(); now_ms - last_session_tick_ms_ >= 5) {
      counters_.tool_sessions_expired += static_cast<uint64_t>(sessions_->tick());
      counters_.session_records_dropped = sessions_->dropped_total();
      last_session_tick_ms_ = now_ms;
    }
    // A batch prepared beside the last one may still run: its requests cannot step back.
    run_commands(commands, /*may_retract=*/cur_ == nullptr);
    if (!session_waiters_.empty()) {
      EngineState state = make_state();
      if (cur_ != nullptr) state.make_device_room = [](int64_t) { return 0; };
      serve_session_waiters(state);
    }
    if (stop) break;
    // Requests parked for a prefetch stop waiting at their deadline.
    for (size_t i = 0; i < parked_.size();) {
      Seq& p = *parked_[i];
      if (p.park_deadline_ms > 0 && clock_->now_ms() >= p.park_deadline_ms) {
        ++counters_.prefetch_timeouts;
        p.park_deadline_ms = 0;
        p.move_to(SeqState::kWaiting);
        waiting_.push_front(std::move(parked_[i]));
        parked_.erase(parked_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    const int64_t now_ms = clock_->now_ms();
    if (now_ms - last_expiry_check_ms_ >= 100) {
      tree_->expire_soft_pins();
      last_expiry_check_ms_ = now_ms;
    }
    progressed = step();
    submit_transfers();
    flush_events();
    counters_.running = static_cast<int64_t>(running_.size());
    counters_.waiting = static_cast<int64_t>(waiting_.size());
    publish_load_gauges();
    counters_.tool_sessions_by_state = sessions_->count_by_state();
    {
      std::lock_guard lock(mutex_);
      published_counters_ = counters_;
    }
  }
  // Shutdown: a batch still in flight runs and is read; everything still here ends
  // cancelled, pages go back. Copies in flight finish first (the transfer threads still
  // write pages the tree owns).
  drain_batches();
  while (!pending_transfers_.empty() || !pending_storage_.empty()) {
    poll_io(/*force=*/true);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (auto& seq : parked_) {
    seq->move_to(SeqState::kWaiting);
    waiting_.push_back(std::move(seq));
  }
  parked_.clear();
  for (auto& seq : remote_) {
    std::vector<PageId> pages = detach_room_pages(*seq);
    allocator_->free(pages);
    finish(*seq, FinishReason::kCancelled);
  }
  remote_.clear();
  for (auto& seq : pd_sending_) end_order_request(*seq);
  pd_sending_.clear();
  for (auto& seq : running_) finish(*seq, FinishReason::kCancelled);
  running_.clear();
  for (SessionWaiter& w : session_waiters_) {
    w.promise.set_value(make_error(ErrorCode::kFailedPrecondition, "the engine is stopping"));
    if (w.on_ready) w.on_ready();
  }
  session_waiters_.clear();
  for (auto& seq : waiting_) finish(*seq, FinishReason::kCancelled);
  waiting_.clear();
  flush_events();
}

void Scheduler::run_commands(std::deque<std::function<void(EngineState&)>>& commands,
                             bool may_retract) {
  if (commands.empty()) return;
  EngineState state = make_state();
  if (!may_retract) {
    // During a forward pass the batch's requests cannot step back: no room now (a restore
    // that needs it waits for the step's end: serve_session_waiters).
    state.make_device_room = [](int64_t) { return 0; };
  }
  for (auto& cmd : commands) cmd(state);
  commands.clear();
  submit_transfers();
}

void Scheduler::run_forward_thread() {
  for (;;) {
    Batch* b = nullptr;
    {
      std::unique_lock lock(mutex_);
      forward_wake_.wait(lock, [&] { return forward_stopping_ || !forward_queue_.empty(); });
      if (forward_queue_.empty()) return;
      b = forward_queue_.front();
    }
    run_batch(*b);
    // A batch queued behind this one takes its tokens now, before the scheduler may read
    // this one's results (it reads them once `done`).
    Batch* next = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (forward_queue_.size() > 1) {
        next = forward_queue_[1];
      } else {
        b->done = true;
        forward_queue_.pop_front();
      }
    }
    if (next != nullptr) {
      resolve_futures(*next, *b);
      std::lock_guard lock(mutex_);
      b->done = true;
      forward_queue_.pop_front();
    }
    wake_.notify_one();
  }
}

void Scheduler::run_batch(Batch& b) {
  if (b.poisoned) {
    b.status = make_error(ErrorCode::kInternal, "the forward pass before this one failed");
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  b.status = model_->forward(b.rows, *kv_pool_, b.output);
  b.forward_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void Scheduler::resolve_futures(Batch& next, Batch& prev) {
  if (next.prev != &prev) return;
  const auto vocab = static_cast<size_t>(model_->config().vocab_size);
  for (size_t i = 0; i < next.plan.size(); ++i) {
    const int32_t r = next.plan[i].future;
    if (r < 0) continue;
    int32_t token = 0;
    const auto row = static_cast<size_t>(r);
    if (!prev.status) {
      next.poisoned = true;
    } else if (!prev.output.sampled.empty() && prev.output.sampled[row].token >= 0) {
      token = prev.output.sampled[row].token;
    } else {
      STRATA_CHECK(prev.draws[row].has_value() && prev.output.logits.size() >= (row + 1) * vocab);
      if (!prev.resolved[row]) {
        prev.resolved[row] = strata::sample_row(
            std::span<const float>(prev.output.logits.data() + row * vocab, vocab),
            *prev.draws[row]);
      }
      token = prev.resolved[row]->token;
    }
    next.tokens[next.token_at[i]] = token;
  }
}

bool Scheduler::ahead(const Seq& seq) const {
  return ahead_batch_ != 0 && seq.last_batch == ahead_batch_;
}

Scheduler::Batch& Scheduler::free_batch() {
  for (auto& b : batches_) {
    if (b.get() != cur_) return *b;
  }
  STRATA_CHECK_MSG(false, "no free batch");
  return *batches_[0];
}

void Scheduler::fill_batch(Batch& b, std::vector<Planned> plan) {
  b.id = next_batch_id_++;
  b.plan = std::move(plan);
  b.rows.clear();
  b.tokens.clear();
  b.pages.clear();
  b.token_at.clear();
  b.logits_row.clear();
  b.prev = nullptr;
  b.poisoned = false;
  b.prefill_tokens = 0;
  b.decode_tokens = 0;
  b.forward_ms = 0.0;
  b.status = {};
  std::vector<size_t> pages_at;
  int32_t logits_rows = 0;
  for (const Planned& p : b.plan) {
    Seq& seq = *p.seq;
    seq.last_batch = b.id;
    b.token_at.push_back(b.tokens.size());
    if (p.future >= 0) {
      b.tokens.push_back(0);  // resolve_futures() writes it
    } else {
      b.tokens.insert(b.tokens.end(), seq.tokens.begin() + p.start,
                      seq.tokens.begin() + p.start + p.count);
    }
    pages_at.push_back(b.pages.size());
    b.pages.insert(b.pages.end(), seq.pages.begin(), seq.pages.end());
    ForwardSequence fs;
    fs.start_position = p.start;
    fs.want_logits = p.future >= 0 || p.start + p.count == static_cast<int64_t>(seq.tokens.size());
    // A decode row may be sampled where its logits are (a GPU then sends back a token instead
    // of a vocabulary of floats), by the rules and the number its Sampler gives; a prompt's
    // last row is remembered whole (full hits sample from it).
    if (p.future >= 0) {
      fs.sampling = seq.next_draw;
    } else if (fs.want_logits && seq.generated > 0 && !chooses_tokens_) {
      if (!seq.draw) seq.draw = seq.sampler->next_row();
      fs.sampling = seq.draw;
    }
    if (seq.load_ticket != 0 && !seq.load_failed) {
      seq.layer_wait = transfers_->layer_wait(seq.load_ticket);
      fs.layer_wait = &seq.layer_wait;
    }
    b.logits_row.push_back(fs.want_logits ? logits_rows++ : -1);
    const bool decode =
        p.count == 1 && (p.future >= 0 || p.start + 1 == static_cast<int64_t>(seq.tokens.size()));
    (decode ? b.decode_tokens : b.prefill_tokens) += p.count;
    b.rows.push_back(fs);
  }
  // The spans, once the owned vectors have stopped growing.
  for (size_t i = 0; i < b.rows.size(); ++i) {
    const size_t pages_end = i + 1 < b.rows.size() ? pages_at[i + 1] : b.pages.size();
    b.rows[i].token_ids = std::span<const int32_t>(b.tokens.data() + b.token_at[i],
                                                   static_cast<size_t>(b.plan[i].count));
    b.rows[i].page_table =
        std::span<const PageId>(b.pages.data() + pages_at[i], pages_end - pages_at[i]);
  }
  b.draws.assign(static_cast<size_t>(logits_rows), std::nullopt);
  b.resolved.assign(static_cast<size_t>(logits_rows), std::nullopt);
}

void Scheduler::launch(Batch& b) {
  if (inline_forward_) {
    run_batch(b);
    std::lock_guard lock(mutex_);
    b.done = true;
    return;
  }
  bool resolve_here = false;
  {
    std::lock_guard lock(mutex_);
    b.done = false;
    // The batch before has run and its tokens were not taken then: take them here (its
    // results are read only after this).
    resolve_here = b.prev != nullptr && b.prev->done;
    if (!resolve_here) forward_queue_.push_back(&b);
  }
  if (resolve_here) {
    resolve_futures(b, *b.prev);
    std::lock_guard lock(mutex_);
    forward_queue_.push_back(&b);
  }
  forward_wake_.notify_one();
}

Status Scheduler::wait_serving_commands(Batch& b) {
  for (;;) {
    std::deque<std::function<void(EngineState&)>> commands;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return b.done || !commands_.empty(); });
      if (commands_.empty()) return b.status;
      commands.swap(commands_);
    }
    run_commands(commands, /*may_retract=*/false);
  }
}

Scheduler::Batch* Scheduler::prepare_next(Batch& cur) {
  if (!options_.overlap_schedule || inline_forward_ || chooses_tokens_ || pd_ != nullptr ||
      !waiting_.empty() || !session_waiters_.empty()) {
    return nullptr;
  }
  {
    std::lock_guard lock(mutex_);
    if (stopping_ || !inbox_.empty()) return nullptr;
  }
  // Every running request is in `cur` (nothing was left out of it, nothing joined since).
  if (running_.size() != cur.plan.size()) return nullptr;
  std::vector<Planned> plan;
  for (size_t i = 0; i < cur.plan.size(); ++i) {
    Seq& seq = *cur.plan[i].seq;
    if (seq.ending) continue;  // ended in the batch before; finishes once `cur` has run
    // A row that gives no token (a prompt's chunk), a copy the pass reads, a cancelled stream
    // or a prefill order: the next step needs this one's results.
    if (cur.logits_row[i] < 0 || seq.load_ticket != 0 || seq.load_failed || seq.remote_room != 0 ||
        seq.stream->cancelled()) {
      return nullptr;
    }
    // Its token in `cur` is its last (max_tokens): it ends there, in no later batch.
    if (seq.generated + 1 >= seq.spec.max_tokens) continue;
    plan.push_back(Planned{&seq, static_cast<int64_t>(seq.tokens.size()), 1, cur.logits_row[i]});
  }
  if (plan.empty()) return nullptr;
  for (const Planned& p : plan) {
    // Eviction only: the requests in flight may not step back.
    if (!ensure_pages(*p.seq, p.start + 1)) return nullptr;
  }
  for (const Planned& p : plan) {
    Seq& seq = *p.seq;
    // The draws in order: `cur`'s token's (a prompt's last row was given none), then the next.
    if (!seq.draw) seq.draw = seq.sampler->next_row();
    cur.draws[static_cast<size_t>(p.future)] = seq.draw;
    if (!seq.next_draw) seq.next_draw = seq.sampler->next_row();
  }
  Batch& next = free_batch();
  fill_batch(next, std::move(plan));
  next.prev = &cur;
  ++counters_.overlapped_steps;
  return &next;
}

bool Scheduler::finish_step() {
  Batch& cur = *cur_;
  Batch* next = prepare_next(cur);
  if (next != nullptr) launch(*next);
  const Status st = wait_serving_commands(cur);
  budget_.observe(cur.prefill_tokens, cur.decode_tokens, cur.forward_ms);
  ++counters_.forward_steps;
  // The loads the pass read as they landed: settled now, before anything reads its output.
  for (size_t i = 0; i < cur.plan.size(); ++i) {
    Seq& seq = *cur.plan[i].seq;
    if (cur.rows[i].layer_wait == nullptr) continue;
    transfers_->end_layer_wait(seq.load_ticket);
    seq.layer_wait = nullptr;
    settle_load(seq);
  }
  // Pages let go of while `cur` ran (read_batch of the batch before) are free now.
  allocator_->free(deferred_free_);
  deferred_free_.clear();
  if (!st) {
    if (next != nullptr) (void)wait_serving_commands(*next);
    fail_batch(cur, st);
    cur_ = nullptr;
    return true;
  }
  ahead_batch_ = next != nullptr ? next->id : 0;
  read_batch(cur);
  ahead_batch_ = 0;
  cur_ = next;
  return true;
}

void Scheduler::fail_batch(Batch& b, const Status& st) {
  // The batch was validated at submit; a failure here is a fault: end those requests.
  STRATA_LOG_ERROR("forward pass failed: {}", st.error().message);
  finish_ended(b);
  for (const Planned& p : b.plan) {
    if (p.future < 0) p.seq->computed = p.start;
  }
  for (auto& seq : running_) finish(*seq, FinishReason::kError, st.error().message);
  running_.clear();
}

void Scheduler::finish_ended(Batch& b) {
  std::vector<Seq*> ended;
  for (const Planned& p : b.plan) {
    // (One that ended in `b` itself and is ahead finishes after the batch it is in.)
    if (!p.seq->ending || ahead(*p.seq)) continue;
    finish(*p.seq, p.seq->ending->reason, {}, p.seq->ending->stop_token);
    ended.push_back(p.seq);
  }
  if (ended.empty()) return;
  std::erase_if(running_, [&](const std::unique_ptr<Seq>& s) {
    return std::find(ended.begin(), ended.end(), s.get()) != ended.end();
  });
}

void Scheduler::drain_batches() {
  // prepare_next() prepares nothing once the engine stops: this reads the last batch.
  while (cur_ != nullptr) finish_step();
}

void Scheduler::flush_events() {
  if (events_.events.empty()) return;
  if (publish_) publish_(std::move(events_.events));
  events_.events.clear();
}

int64_t Scheduler::running_reserve() const {
  const int64_t ps = options_.page_size;
  int64_t reserve = 0;
  for (const auto& seq : running_) {
    const int64_t need = pages_to_run(static_cast<int64_t>(seq->tokens.size()), ps);
    reserve += std::max<int64_t>(0, need - static_cast<int64_t>(seq->pages.size()));
  }
  return reserve;
}

bool Scheduler::ensure_pages(Seq& seq, int64_t positions) {
  const int64_t need =
      pages_for(positions, options_.page_size) - static_cast<int64_t>(seq.pages.size());
  if (need <= 0) return true;
  if (allocator_->num_free() < need)
    tree_->evict(static_cast<int32_t>(need - allocator_->num_free()));
  return allocator_->allocate(static_cast<int32_t>(need), seq.pages).has_value();
}

// Inserts the request's computed full pages into the tree and switches its page table
// to the tree's pages where the tree already had the blocks (freeing its duplicates),
// then moves its lock to the new last node.
void Scheduler::cache_computed_pages(Seq& seq) {
  const int32_t ps = options_.page_size;
  const int32_t full = static_cast<int32_t>(seq.computed / ps);
  if (full <= seq.tree_pages) return;
  const std::span<const int32_t> tokens(seq.tokens.data(), static_cast<size_t>(full) * ps);
  tree_->insert(tokens, std::span<const PageId>(seq.pages.data(), static_cast<size_t>(full)),
                seq.spec.cache_salt);
  MatchResult m = tree_->match_prefix(tokens, seq.spec.cache_salt);
  for (int32_t k = seq.tree_pages; k < m.num_pages; ++k) {
    if (m.device_pages[static_cast<size_t>(k)] != seq.pages[static_cast<size_t>(k)]) {
      // A batch in flight may still read the duplicate: it goes back once that has run.
      if (ahead(seq)) {
        deferred_free_.push_back(seq.pages[static_cast<size_t>(k)]);
      } else {
        allocator_->free(seq.pages[static_cast<size_t>(k)]);
      }
      seq.pages[static_cast<size_t>(k)] = m.device_pages[static_cast<size_t>(k)];
    }
  }
  const LockReceipt old = seq.receipt;
  seq.receipt = tree_->lock(m.last_node);
  if (old.valid()) STRATA_CHECK(tree_->release(old).has_value());
  seq.tree_pages = m.num_pages;
}

void Scheduler::release_seq_pages(Seq& seq) {
  if (seq.holds_pages()) cache_computed_pages(seq);
  allocator_->free(std::span<const PageId>(seq.pages).subspan(static_cast<size_t>(seq.tree_pages)));
  seq.pages.clear();
  seq.tree_pages = 0;
  if (seq.receipt.valid()) STRATA_CHECK(tree_->release(seq.receipt).has_value());
  seq.receipt = LockReceipt{};
  if (seq.load_receipt.valid()) STRATA_CHECK(tree_->release(seq.load_receipt).has_value());
  seq.load_receipt = LockReceipt{};
  // An overlapped load still in flight lands into its node by itself (the node's io_ref
  // keeps it); this request no longer reads it.
  seq.load_ticket = 0;
  seq.load_failed = false;
  seq.layer_wait = nullptr;
  // A room's stage pages (the paths that may still see them written moved them out first).
  pd_free_stage(seq);
}

void Scheduler::end_order_request(Seq& seq) {
  STRATA_CHECK(seq.remote_room != 0);
  release_seq_pages(seq);
  seq.move_to(SeqState::kFinished);
}

// The one way a request ends, from any state (waiting, parked, running, remote): its pages
// and locks go back, its tool session learns what is cached, the counters count it, and
// the stream gets the last item.
void Scheduler::finish(Seq& seq, FinishReason reason, std::string error, int32_t stop_token) {
  if (seq.remote_room != 0) {
    // An order's request ended before its pages went out (cancelled at shutdown, an error):
    // the order fails; the pages already sent stay protected by its own lock.
    auto it = orders_.find(seq.remote_room);
    if (it != orders_.end() && it->second.state == RemoteOrder::State::kComputing) {
      it->second.state = RemoteOrder::State::kAborted;
      it->second.why = error.empty() ? std::string(finish_reason_name(reason)) : error;
    }
  }
  // A request that ends before its overlapped load settled (a full hit sampled from
  // remembered logits, max_tokens 1) was still served its prefix from the host.
  if (!seq.counted && seq.load_ticket != 0 && !seq.load_failed) count_admission(seq);
  const int64_t cached = seq.holds_pages() ? seq.computed : 0;
  release_seq_pages(seq);
  seq.move_to(SeqState::kFinished);
  if (!seq.spec.session_id.empty()) {
    sessions_->on_request_finished(
        seq.spec.session_id,
        std::span<const int32_t>(seq.tokens.data(), static_cast<size_t>(cached)),
        seq.spec.cache_salt);
  }
  seq.usage.prompt_tokens = seq.prompt_len;
  seq.usage.completion_tokens = seq.generated;
  if (reason == FinishReason::kCancelled) {
    ++counters_.requests_cancelled;
  } else {
    ++counters_.requests_finished;
  }
  seq.stream->push(StreamItem{{}, reason, seq.usage, std::move(error), stop_token});
}

// Out of pages even after eviction: give the newest running request's pages back (its
// computed pages stay cached in the tree) and queue it again at the front.
void Scheduler::retract(Seq& seq) {
  release_seq_pages(seq);
  seq.move_to(SeqState::kWaiting);
  seq.computed = 0;
  ++counters_.requests_retracted;
}

Scheduler::Admission Scheduler::try_admit(Seq& seq) {
  const int32_t ps = options_.page_size;
  // Match all but the last token: at least one token must run to produce logits.
  const std::span<const int32_t> probe(seq.tokens.data(), seq.tokens.size() - 1);
  MatchResult m = tree_->match_prefix(probe, seq.spec.cache_salt);
  if (m.host_num_pages > 0 && !seq.load_tried && !seq.counted) {
    // The continuation is on the host: load it back (all or nothing) before prefill.
    seq.load_tried = true;
    // Overlapped when the whole request fits now: it runs at once, each layer of its first
    // pass waiting for that layer's pages. Otherwise (or by the option) it is parked until
    // the load has landed, and admitted then like any device hit.
    // (Not for a prefill order: its cached pages are sent at admission.)
    const bool overlap =
        options_.hicache.load_overlap == LoadOverlap::kLayer && seq.remote_room == 0 &&
        device_room(m.last_node) >=
            pages_to_run(static_cast<int64_t>(seq.tokens.size()), ps) - m.num_pages;
    const LockReceipt hold = tree_->lock(m.host_last_node);
    if (tree_->load_back(m)) {
      if (seq.load_receipt.valid()) STRATA_CHECK(tree_->release(seq.load_receipt).has_value());
      seq.load_receipt = LockReceipt{};
      seq.host_tokens = m.host_num_pages * ps;
      if (!overlap) {
        seq.load_receipt = hold;
        submit_transfers(seq.id);
        return Admission::kParked;
      }
      // The lock on the host path's last node protects the device part before it too.
      seq.receipt = hold;
      seq.pages = std::move(m.device_pages);
      for (const RadixNode* n = m.host_last_node; n != m.last_node; n = n->parent) {
        seq.pages.insert(seq.pages.begin() + m.num_pages, n->device_pages.begin(),
                         n->device_pages.end());
      }
      seq.tree_pages = m.num_pages + m.host_num_pages;
      STRATA_CHECK(static_cast<int32_t>(seq.pages.size()) == seq.tree_pages);
      seq.computed = static_cast<int64_t>(seq.tree_pages) * ps;
      seq.load_ticket = submit_transfers(seq.id, /*overlapped=*/true);
      STRATA_CHECK(seq.load_ticket != 0);
      ++counters_.loads_overlapped;
      // Counted when the load lands (on_transfer): a failed one computes the prefix instead.
      return Admission::kAdmitted;
    }
    STRATA_CHECK(tree_->release(hold).has_value());
    if (tree_->io_pending() && !only_stalled_copies()) {
      // Backups in flight free device pages when they land (write_back, pinned blocks):
      // wait for them rather than recompute what the host holds (not for stalled ones).
      seq.load_tried = false;
      return Admission::kNoRoom;
    }
    ++counters_.loads_failed;
  }
  if (storage_worker_ && !seq.prefetch_tried && !seq.counted) {
    seq.prefetch_tried = true;
    const int64_t full = static_cast<int64_t>(probe.size()) / ps;
    const int64_t missing = full - m.num_pages - m.host_num_pages;
    if (missing * ps >= storage_config_.prefetch_threshold) {
      start_prefetch(seq, m);
      const PrefetchPolicy policy = options_.hicache.prefetch_policy;
      if (policy != PrefetchPolicy::kBestEffort) {
        if (policy == PrefetchPolicy::kTimeout) {
          const double timeout_s = storage_config_.prefetch_timeout_base +
                                   storage_config_.prefetch_timeout_per_ki_token *
                                       static_cast<double>(missing * ps) / 1024.0;
          seq.park_deadline_ms = clock_->now_ms() + static_cast<int64_t>(timeout_s * 1000.0) + 1;
        }
        return Admission::kParked;
      }
    }
  }
  if (pd_ && !pd_->prefill() && !seq.pd_tried && !seq.counted && !seq.spec.prefill_peer.empty()) {
    seq.pd_tried = true;
    if (auto a = try_remote(seq, m)) return *a;
  }
  const int64_t remaining_pages =
      pages_to_run(static_cast<int64_t>(seq.tokens.size()), ps) - m.num_pages;
  if (device_room(m.last_node) < remaining_pages) return Admission::kNoRoom;
  seq.receipt = tree_->lock(m.last_node);
  if (seq.load_receipt.valid()) {
    STRATA_CHECK(tree_->release(seq.load_receipt).has_value());
    seq.load_receipt = LockReceipt{};
  }
  seq.pages = std::move(m.device_pages);
  seq.tree_pages = m.num_pages;
  seq.computed = static_cast<int64_t>(m.num_pages) * ps;
  count_admission(seq);
  return Admission::kAdmitted;
}

void Scheduler::count_admission(Seq& seq) {
  if (!seq.counted) {
    seq.counted = true;
    // First admission: what the cache saved this prompt, per tier (a re-admission after
    // a retraction keeps the first figure, as the client saw it).
    const int32_t cached = static_cast<int32_t>(seq.computed);
    const int32_t from_storage = std::min(seq.storage_tokens, cached);
    const int32_t from_host = std::max(0, std::min(seq.host_tokens, cached) - from_storage);
    seq.usage.cached_tokens = cached;
    seq.usage.cached_storage = from_storage;
    seq.usage.cached_host = from_host;
    seq.usage.cached_device = cached - from_host - from_storage;
    counters_.cached_prompt_tokens += static_cast<uint64_t>(cached);
    counters_.cached_host_tokens += static_cast<uint64_t>(from_host);
    counters_.cached_storage_tokens += static_cast<uint64_t>(from_storage);
    counters_.prompt_tokens += static_cast<uint64_t>(seq.prompt_len);
  }
}

QueueKey Scheduler::queue_key(const Seq& seq) const {
  return QueueKey{seq.cls, seq.spec.priority, seq.arrival_ms, seq.id};
}

void Scheduler::order_queues() {
  const int64_t now = clock_->now_ms();
  const int64_t aging = options_.priority_aging_ms;
  auto before = [&](const std::unique_ptr<Seq>& a, const std::unique_ptr<Seq>& b) {
    return goes_before(queue_key(*a), queue_key(*b), now, aging);
  };
  std::sort(waiting_.begin(), waiting_.end(), before);
  std::sort(running_.begin(), running_.end(), before);
}

int64_t Scheduler::reclaimable_pages() const {
  return allocator_->num_free() + tree_->stats().cached_pages - tree_->unevictable_pages();
}

int64_t Scheduler::device_room(const RadixNode* path) const {
  // Pages the path holds become protected by the new lock.
  int64_t newly_protected = 0;
  for (const RadixNode* n = path; n != nullptr && n != tree_->root(); n = n->parent) {
    if (!tree_->device_protected(n)) newly_protected += n->num_pages();
  }
  // The running requests keep what they still need to finish their prompts (and one decode
  // slot): a request admitted into that room would lock its prefix and starve them.
  return reclaimable_pages() - newly_protected - running_reserve();
}

std::ptrdiff_t Scheduler::worst_running(const std::function<bool(const Seq&)>& eligible) const {
  const int64_t now = clock_->now_ms();
  std::ptrdiff_t worst = -1;
  for (size_t i = 0; i < running_.size(); ++i) {
    if (!eligible(*running_[i])) continue;
    if (worst < 0 || goes_before(queue_key(*running_[static_cast<size_t>(worst)]),
                                 queue_key(*running_[i]), now, options_.priority_aging_ms)) {
      worst = static_cast<std::ptrdiff_t>(i);
    }
  }
  return worst;
}

void Scheduler::step_back(std::ptrdiff_t index) {
  retract(*running_[static_cast<size_t>(index)]);
  waiting_.push_back(std::move(running_[static_cast<size_t>(index)]));
  running_.erase(running_.begin() + index);
  ++counters_.requests_preempted;
}

int32_t Scheduler::make_room_for_restore(int64_t pages) {
  int32_t retracted = 0;
  while (reclaimable_pages() < pages) {
    const std::ptrdiff_t w =
        worst_running([](const Seq& s) { return s.cls != SchedClass::kResume; });
    if (w < 0) break;
    step_back(w);
    ++retracted;
  }
  if (retracted > 0) ++counters_.restores_made_room;
  return retracted;
}

bool Scheduler::pages_will_return() const {
  // Stalled copies give their pages back only when they resolve, which may be never: a
  // request does not wait for them (it may fail for want of room instead of hanging).
  const bool copies =
      (!pending_transfers_.empty() || tree_->io_pending()) && !only_stalled_copies();
  return !running_.empty() || copies || !pending_storage_.empty() || !parked_.empty() ||
         !remote_.empty() || !pd_sending_.empty() || !quarantine_.empty();
}

bool Scheduler::release_queued_holds() {
  bool released = false;
  for (auto& seq : waiting_) {
    if (!seq->load_receipt.valid()) continue;
    STRATA_CHECK(tree_->release(seq->load_receipt).has_value());
    seq->load_receipt = LockReceipt{};
    seq->load_tried = false;  // it loads again (or matches on the device) when its turn comes
    released = true;
  }
  if (released) ++counters_.queued_holds_released;
  return released;
}

bool Scheduler::unpin_for(const Seq& seq) {
  const int64_t need = pages_to_run(static_cast<int64_t>(seq.tokens.size()), options_.page_size);
  const std::vector<BlockHash> released =
      tree_->release_pins_for(std::max<int64_t>(need - reclaimable_pages(), 1));
  if (released.empty()) return false;
  counters_.auto_unpinned_blocks += released.size();
  if (tree_->hierarchical()) counters_.auto_unpinned_host_blocks += released.size();
  STRATA_LOG_WARN(
      "pinned pages left no room for a {}-token request: unpinned {} blocks (soft pins first, "
      "least recently used first){}",
      seq.tokens.size(), released.size(),
      tree_->hierarchical() ? ": the host tier cannot hold them" : "");
  return true;
}

bool Scheduler::preempt_for(const Seq& head) {
  const std::ptrdiff_t w = worst_running([&](const Seq& s) { return s.cls > head.cls; });
  if (w < 0) return false;
  step_back(w);
  return true;
}

// Samples the next token from one output row. A model that chooses its tokens
// (model/forward_model.h) hands back one token per row; its row is then that token as one
// float (exact below 2^24, checked in SimulatedModel), which is also what a remembered prompt
// row holds, so that full hits work without vocabulary-wide rows.
SampledToken Scheduler::sample_row(Seq& seq, std::span<const float> row) {
  const RowSampling draw = take_draw(seq);
  if (!chooses_tokens_) return seq.sampler->sample(row, draw);
  STRATA_CHECK(row.size() == 1);
  return sample_chosen(seq.sampler->params(), static_cast<int32_t>(row[0]));
}

// The draw of seq's next token: the one its batch was given (Seq::draw), else a new one.
RowSampling Scheduler::take_draw(Seq& seq) {
  if (!seq.draw) return seq.sampler->next_row();
  const RowSampling draw = *seq.draw;
  seq.draw.reset();
  return draw;
}

// Hands a sampled token to the stream; finishes the request at a stop token or max_tokens.
// Returns true when it finished (the caller drops it from running_).
bool Scheduler::emit_sampled(Seq& seq, GeneratedToken tok) {
  if (tok.is_stop) {
    finish(seq, FinishReason::kStop, {}, tok.token);
    return true;
  }
  seq.tokens.push_back(tok.token);
  ++seq.generated;
  ++counters_.generated_tokens;
  seq.stream->push(StreamItem{{std::move(tok)}, std::nullopt, {}, {}});
  if (seq.generated >= seq.spec.max_tokens) {
    finish(seq, FinishReason::kLength);
    return true;
  }
  return false;
}

// Full prefix hits (docs/full-hit.md): a request just admitted whose cached prefix covers
// every full page of its prompt but the last token's, and whose prompt's last-position
// logits are remembered, samples its first token now, without a forward pass. The tail
// the tree does not hold (under one page, ending with the last prompt token) is computed
// with the request's next token, by the same prefill path as any pending tokens; a request
// with max_tokens 1 never runs it. Returns true when a token was sampled.
bool Scheduler::sample_full_hits() {
  const int64_t ps = options_.page_size;
  bool sampled = false;
  for (size_t i = 0; i < running_.size();) {
    Seq& seq = *running_[i];
    const int64_t n = static_cast<int64_t>(seq.tokens.size());
    std::span<const float> logits;
    // (An order's prompt needs every position's KV for the decode worker: no shortcut.)
    if (seq.remote_room == 0 && seq.generated == 0 && n == seq.prompt_len && seq.computed > 0 &&
        seq.computed == (n - 1) / ps * ps) {
      logits = prompt_logits_.find(seq.tokens, seq.spec.cache_salt);
    }
    if (logits.empty()) {
      ++i;
      continue;
    }
    sampled = true;
    ++counters_.prompt_logits_hits;
    if (emit_sampled(seq, sample_row(seq, logits))) {
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  return sampled;
}

bool Scheduler::waits_for_shared_prefill(Seq& seq) {
  const int64_t min_tokens = options_.shared_prefill_wait_tokens;
  if (min_tokens <= 0 || seq.counted) return false;
  const int64_t ps = options_.page_size;
  // What a match can use: the full pages of all but the last token.
  const int64_t matchable = (static_cast<int64_t>(seq.tokens.size()) - 1) / ps * ps;
  for (const auto& r : running_) {
    // Only prompt pages still to compute are worth waiting for (a running request's own
    // pages are inserted as they fill; its generated tokens are not another's prompt).
    if (r->computed >= r->prompt_len || r->spec.cache_salt != seq.spec.cache_salt) continue;
    const int64_t limit = std::min<int64_t>(matchable, r->prompt_len);
    if (limit - r->computed / ps * ps < min_tokens) continue;
    const auto end = seq.tokens.begin() + static_cast<std::ptrdiff_t>(limit);
    const int64_t common =
        std::mismatch(seq.tokens.begin(), end, r->tokens.begin()).first - seq.tokens.begin();
    // Pages [r computed, common) would come from r's prefill; the ones before are in the tree.
    if (common / ps * ps - r->computed / ps * ps >= min_tokens) {
      if (!seq.waited_shared) {
        seq.waited_shared = true;
        ++counters_.shared_prefill_waits;
      }
      return true;
    }
  }
  return false;
}

void Scheduler::admit() {
  order_queues();
  // waiting_[0, at) wait this step for a prefill they share (waits_for_shared_prefill); the
  // requests behind them are not held up by it.
  size_t at = 0;
  while (at < waiting_.size()) {
    Seq& seq = *waiting_[at];
    if (seq.stream->cancelled()) {
      finish(seq, FinishReason::kCancelled);
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(at));
      continue;
    }
    if (static_cast<int32_t>(running_.size() + remote_.size()) >= options_.max_running_requests) {
      // The batch is full: a request of a better class takes the worst one's place.
      if (preempt_for(seq)) continue;
      break;
    }
    if (waits_for_shared_prefill(seq)) {
      ++at;
      continue;
    }
    const Admission a = try_admit(seq);
    if (a == Admission::kParked) {
      seq.move_to(SeqState::kParked);
      parked_.push_back(std::move(waiting_[at]));
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(at));
      continue;
    }
    if (a == Admission::kRemote) {
      seq.move_to(SeqState::kOrdered);
      remote_.push_back(std::move(waiting_[at]));
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(at));
      continue;
    }
    if (a == Admission::kNoRoom) {
      // A request of a better class (a resumed session, VIP traffic) does not wait for
      // requests of a worse one to finish: they step back (their pages stay cached).
      if (preempt_for(seq)) continue;
      // FIFO: wait while something that gives pages back by itself is under way (running
      // requests, copies, storage reads, P/D rooms and sends, a restored session's hold).
      // (A session whose restore stalled holds its pages until the copy resolves: not waited
      // for.)
      if (pages_will_return() || (sessions_->holds_device() && !loads_stalled())) break;
      // Nothing will: the prompt fits the pool (checked at submit), so only holds that
      // wait for this request to go first, or pins, can be in the way.
      if (release_queued_holds()) continue;
      if (unpin_for(seq)) continue;
      STRATA_LOG_ERROR(
          "no room for a {}-token request with nothing in the way: free {}, cached {}, "
          "unevictable {}",
          seq.tokens.size(), allocator_->num_free(), tree_->stats().cached_pages,
          tree_->unevictable_pages());
      finish(seq, FinishReason::kError, "the request cannot fit the KV pool");
      waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(at));
      continue;
    }
    seq.move_to(SeqState::kRunning);
    running_.push_back(std::move(waiting_[at]));
    waiting_.erase(waiting_.begin() + static_cast<std::ptrdiff_t>(at));
    // An order's pages that this worker's own cache held go out at once.
    if (running_.back()->remote_room != 0) pd_send_ready(*running_.back(), false);
  }
}

bool Scheduler::step() {
  // A batch prepared beside the last one runs: read it (and prepare the one after).
  if (cur_ != nullptr) return finish_step();
  // Cancelled running requests leave first: their pages go back at once.
  for (size_t i = 0; i < running_.size();) {
    if (running_[i]->stream->cancelled()) {
      finish(*running_[i], FinishReason::kCancelled);
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  abandon_failed_loads();  // a copy reported failed between steps
  admit();
  const bool sampled_hits = sample_full_hits();
  if (running_.empty()) return sampled_hits;
  order_queues();  // requests admitted just now may rank better than older ones

  // Plan the step (engine/step_plan.h), then commit it: retract, take the pages. The plan
  // sees the pool through upper bounds (eviction may have to wait for backups; a retracted
  // request's prefix may stay locked by others): when the pool gives less than planned, the
  // step plans again from what the pool holds now. The budget keeps the decoding requests'
  // inter-token latency steady (step_budget.h); it is fixed for the step.
  int64_t decoding = 0;
  for (const auto& seq : running_) decoding += seq->decoding() ? 1 : 0;
  const int64_t prefill_budget = budget_.prefill_tokens(decoding);
  counters_.prefill_budget_tokens = prefill_budget;
  std::vector<Planned> plan;
  std::vector<PlanRequest> viewed;
  // running_[0, decided) are decided: committed, or skipped for this step.
  size_t decided = 0;
  // The request the commit retracts others for (it no longer waits for backups).
  const Seq* retracting = nullptr;
  // Pages eviction counted on but could not free now (backups to wait for, pins without
  // host room), measured at the last allocation that fell short.
  int64_t shortfall = 0;
  auto retract_worst = [&](int32_t n) {
    for (int32_t k = 0; k < n; ++k) {
      retract(*running_.back());
      waiting_.push_front(std::move(running_.back()));
      running_.pop_back();
    }
  };
  // An allocation fell short: what the pool really holds from now on.
  auto fell_short = [&] { shortfall = reclaimable_pages() - allocator_->num_free(); };
  const int32_t max_rounds = 3 * static_cast<int32_t>(running_.size()) + 3;
  for (int32_t round = 0;; ++round) {
    STRATA_CHECK_MSG(round <= max_rounds, "the step's plan does not converge");
    viewed.clear();
    for (const auto& seq : running_) {
      viewed.push_back(PlanRequest{static_cast<int64_t>(seq->tokens.size()), seq->computed,
                                   static_cast<int64_t>(seq->pages.size()),
                                   seq.get() == retracting});
    }
    const StepPlan step_plan = plan_step(
        StepView{viewed, options_.page_size, prefill_budget,
                 std::max<int64_t>(0, reclaimable_pages() - shortfall), tree_->io_pending()});
    // Before retracting for a request, eviction is tried, as for one that fits: it may free
    // more than the plan counted on (the request fits: plan again), or start backups (it
    // waits for them: plan again, and the plan skips it).
    enum class Tried : uint8_t { kFits, kWaits, kRetract };
    auto evict_first = [&](Seq& seq, int64_t positions) {
      if (retracting == &seq) return Tried::kRetract;
      if (ensure_pages(seq, positions)) return Tried::kFits;
      fell_short();
      if (tree_->io_pending()) return Tried::kWaits;
      retracting = &seq;
      return Tried::kRetract;
    };
    bool again = false;
    for (const PlannedRun& run : step_plan.runs) {
      if (run.index < decided) continue;
      Seq& seq = *running_[run.index];
      const int64_t positions = run.start + run.count;
      decided = run.index;
      if (run.retract_first > 0) {
        const Tried tried = evict_first(seq, positions);
        if (tried != Tried::kRetract) {
          if (tried == Tried::kFits) {
            plan.push_back(Planned{&seq, run.start, run.count, -1});
            decided = run.index + 1;
          }
          again = true;
          break;
        }
        retract_worst(run.retract_first);
      }
      if (!ensure_pages(seq, positions)) {
        fell_short();
        again = true;
        break;
      }
      plan.push_back(Planned{&seq, run.start, run.count, -1});
      decided = run.index + 1;
    }
    if (again) continue;
    if (!step_plan.unfit || step_plan.unfit->index < decided) break;
    const PlannedRun& unfit = *step_plan.unfit;
    Seq& seq = *running_[unfit.index];
    decided = unfit.index;
    const Tried tried = evict_first(seq, unfit.start + unfit.count);
    if (tried == Tried::kRetract) {
      // Not even eviction helps: the worse requests are retracted, then this one (their
      // computed pages stay cached, their locks go), and the step ends.
      retract_worst(unfit.retract_first + 1);
      break;
    }
    if (tried == Tried::kFits) {
      plan.push_back(Planned{&seq, unfit.start, unfit.count, -1});
      decided = unfit.index + 1;
    }
  }
  if (plan.empty()) return false;
  Batch& b = free_batch();
  fill_batch(b, std::move(plan));
  launch(b);
  cur_ = &b;
  return finish_step();
}

// The results of `b` (it has run): tokens sampled and emitted, pages cached, requests
// finished. Requests with a row in the batch launched after it (ahead) do not finish here:
// they end there (Seq::ending), and pages they let go of wait for it (deferred_free_).
void Scheduler::read_batch(Batch& b) {
  const std::vector<Planned>& plan = b.plan;
  const std::vector<ForwardSequence>& batch = b.rows;
  ForwardOutput& out = b.output;
  const auto logits_rows = static_cast<size_t>(std::count_if(
      batch.begin(), batch.end(), [](const ForwardSequence& f) { return f.want_logits; }));
  const size_t row_width = chooses_tokens_ ? 1 : static_cast<size_t>(model_->config().vocab_size);
  std::vector<float> chosen_row(1);
  if (chooses_tokens_) STRATA_CHECK(out.tokens.size() >= logits_rows);
  if (!out.sampled.empty()) STRATA_CHECK(out.sampled.size() == logits_rows);
  // The token of one output row has been read: the next draw (prepare_next) is the row's now.
  auto draw_used = [](Seq& seq) {
    seq.draw.reset();
    if (seq.next_draw) seq.draw = std::exchange(seq.next_draw, std::nullopt);
  };
  // Hands the token to the stream; true when the request finished. A request ahead that
  // draws a stop token ends in the batch after (it never reaches max_tokens here: it would
  // not be ahead).
  auto emit = [&](Seq& seq, GeneratedToken tok) {
    if (!ahead(seq)) return emit_sampled(seq, std::move(tok));
    if (tok.is_stop) {
      seq.ending = Seq::Ending{FinishReason::kStop, tok.token};
      return false;
    }
    STRATA_CHECK(!emit_sampled(seq, std::move(tok)));
    return false;
  };
  size_t row = 0;
  std::vector<Seq*> done;
  std::vector<Seq*> sent;  // orders whose prompt is computed: their last pages go out
  for (size_t i = 0; i < plan.size(); ++i) {
    Seq& seq = *plan[i].seq;
    if (seq.load_failed || seq.ending) {
      // Computed over pages that did not land, or after the request ended (it finishes
      // below): its row and pages are void.
      if (batch[i].want_logits) ++row;
      continue;
    }
    seq.computed = plan[i].start + plan[i].count;
    if (!batch[i].want_logits) {
      cache_computed_pages(seq);
      if (seq.remote_room != 0) pd_send_ready(seq, false);
      continue;
    }
    if (!out.sampled.empty() && out.sampled[row].token >= 0) {
      // The model drew this decode row's token itself (ForwardOutput::sampled), with the
      // number the row was given.
      STRATA_CHECK(batch[i].sampling && seq.generated > 0 && seq.remote_room == 0);
      SampledToken drawn = std::move(out.sampled[row++]);
      STRATA_CHECK(drawn.token < model_->config().vocab_size);
      draw_used(seq);
      cache_computed_pages(seq);
      if (emit(seq, seq.sampler->accept(std::move(drawn)))) done.push_back(&seq);
      continue;
    }
    std::span<const float> logits;
    if (chooses_tokens_) {
      chosen_row[0] = static_cast<float>(out.tokens[row]);
      logits = chosen_row;
    } else {
      logits = std::span<const float>(out.logits.data() + row * row_width, row_width);
    }
    std::optional<SampledToken> resolved = std::move(b.resolved[row]);
    ++row;
    // The prompt's last position: remembered for the next full hit of the same prompt.
    if (seq.generated == 0 && seq.prompt_len > options_.page_size) {
      prompt_logits_.put(seq.tokens, seq.spec.cache_salt, logits);
    }
    cache_computed_pages(seq);
    if (seq.remote_room != 0) {
      // The order's first token: the decode worker gets it with PrefillDone, once the last
      // pages (the partial one included) have landed.
      auto it = orders_.find(seq.remote_room);
      if (it != orders_.end()) it->second.first_token = sample_row(seq, logits).token;
      pd_send_ready(seq, true);
      sent.push_back(&seq);
      continue;
    }
    // Drawn on the forward thread already (the batch after needed it), with this row's draw.
    SampledToken tok =
        resolved ? seq.sampler->accept(std::move(*resolved)) : sample_row(seq, logits);
    draw_used(seq);
    if (emit(seq, std::move(tok))) done.push_back(&seq);
  }
  // Before the requests that finished here leave running_ (and are freed): `b`'s plan
  // names them.
  finish_ended(b);
  for (Seq* s : sent) {
    s->move_to(SeqState::kSending);
    auto it = std::find_if(running_.begin(), running_.end(),
                           [&](const std::unique_ptr<Seq>& r) { return r.get() == s; });
    pd_sending_.push_back(std::move(*it));
    running_.erase(it);
  }
  if (!done.empty()) {
    std::erase_if(running_, [&](const std::unique_ptr<Seq>& s) {
      return std::find(done.begin(), done.end(), s.get()) != done.end();
    });
  }
  abandon_failed_loads();
}

}  // namespace strata
