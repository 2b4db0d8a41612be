#include "engine/engine.h"

#include <algorithm>
#include <string>

#include "common/check.h"
#include "common/log.h"

namespace strata {

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

// A request inside the scheduler. Page ownership: pages[0, tree_pages) belong to the
// tree and are protected by `receipt`; pages[tree_pages, end) belong to this request.
struct Engine::Seq {
  uint64_t id = 0;
  RequestSpec spec;
  std::shared_ptr<RequestStream> stream;
  std::vector<int32_t> tokens;  // prompt + generated
  int32_t prompt_len = 0;       // the original prompt (usage)
  int64_t computed = 0;         // tokens whose KV is in pages
  std::vector<PageId> pages;
  int32_t tree_pages = 0;
  LockReceipt receipt;
  bool admitted = false;
  bool counted = false;  // prompt and cache hits counted (first admission)
  int32_t generated = 0;
  RequestUsage usage;
  std::optional<Sampler> sampler;
};

Status validate(const EngineOptions& o) {
  auto bad = [](std::string m) { return make_error(ErrorCode::kInvalidArgument, std::move(m)); };
  if (o.page_size < 1 || o.page_size > 256) return bad("--page-size must be in [1, 256]");
  if (o.kv_cache_tokens < o.page_size * 4) {
    return bad("--kv-cache-tokens must hold at least 4 pages (" + std::to_string(o.page_size * 4) +
               " tokens)");
  }
  if (o.max_running_requests < 1) return bad("--max-running-requests must be >= 1");
  if (o.chunked_prefill_size < o.page_size) {
    return bad("--chunked-prefill-size must be at least the page size");
  }
  if (!(o.max_pinned_ratio >= 0.0 && o.max_pinned_ratio <= 1.0)) {
    return bad("--max-pinned-ratio must be in [0, 1]");
  }
  return {};
}

Result<std::unique_ptr<Engine>> Engine::create(Model* model, EngineOptions options,
                                               std::function<void(std::vector<KvEvent>)> publish,
                                               const Clock* clock) {
  STRATA_CHECK(model != nullptr);
  if (auto st = validate(options); !st) return std::unexpected(st.error());
  std::unique_ptr<Engine> engine(new Engine(model, options, std::move(publish), clock));
  auto pool = model->make_kv_pool(engine->num_pages_, options.page_size, options.kv_dtype);
  if (!pool) return std::unexpected(pool.error());
  engine->kv_pool_ = std::move(*pool);
  engine->thread_ = std::thread([raw = engine.get()] { raw->run(); });
  return engine;
}

Engine::Engine(Model* model, EngineOptions options,
               std::function<void(std::vector<KvEvent>)> publish, const Clock* clock)
    : model_(model),
      options_(options),
      publish_(std::move(publish)),
      clock_(clock != nullptr ? clock : &SteadyClock::instance()) {
  num_pages_ = options_.kv_cache_tokens / options_.page_size;
  allocator_ = std::make_unique<PageAllocator>(num_pages_);
  tree_ = std::make_unique<RadixTree>(RadixTreeOptions{options_.page_size}, allocator_.get(),
                                      &events_, clock_);
}

Engine::~Engine() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

EngineCounters Engine::counters() const {
  std::lock_guard lock(mutex_);
  return published_counters_;
}

Result<std::shared_ptr<RequestStream>> Engine::submit(RequestSpec spec) {
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
      (static_cast<int64_t>(spec.prompt.size()) + 1 + options_.page_size - 1) / options_.page_size;
  if (pages_needed > num_pages_) {
    return make_error(ErrorCode::kResourceExhausted,
                      "the prompt needs " + std::to_string(pages_needed) +
                          " KV pages; the device pool has " + std::to_string(num_pages_));
  }
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

void Engine::post(std::function<void(EngineState&)> command) {
  {
    std::lock_guard lock(mutex_);
    commands_.push_back(std::move(command));
  }
  wake_.notify_one();
}

EngineState Engine::make_state() {
  EngineState s{*tree_, *allocator_, *kv_pool_, options_, counters_, 0, {}};
  for (const auto& seq : running_) {
    s.request_private_pages += static_cast<int64_t>(seq->pages.size()) - seq->tree_pages;
  }
  s.audit_pages = [this] { return audit_pages(); };
  return s;
}

Status Engine::audit_pages() const {
  std::vector<PageId> owned;
  tree_->collect_device_pages(owned);
  for (const auto& seq : running_) {
    owned.insert(owned.end(), seq->pages.begin() + seq->tree_pages, seq->pages.end());
  }
  return allocator_->audit(owned);
}

void Engine::run() {
  for (;;) {
    std::deque<std::unique_ptr<Seq>> arrived;
    std::deque<std::function<void(EngineState&)>> commands;
    bool stop = false;
    {
      std::unique_lock lock(mutex_);
      const bool busy = !running_.empty() || !waiting_.empty();
      if (!busy) {
        // Idle: sleep until work arrives, waking now and then for soft-pin expiry.
        wake_.wait_for(lock, std::chrono::milliseconds(200),
                       [&] { return stopping_ || !inbox_.empty() || !commands_.empty(); });
      }
      arrived.swap(inbox_);
      commands.swap(commands_);
      stop = stopping_;
    }
    for (auto& seq : arrived) waiting_.push_back(std::move(seq));
    if (!commands.empty()) {
      EngineState state = make_state();
      for (auto& cmd : commands) cmd(state);
    }
    if (stop) break;
    const int64_t now_ms = clock_->now_ms();
    if (now_ms - last_expiry_check_ms_ >= 100) {
      tree_->expire_soft_pins();
      last_expiry_check_ms_ = now_ms;
    }
    step();
    flush_events();
    counters_.running = static_cast<int64_t>(running_.size());
    counters_.waiting = static_cast<int64_t>(waiting_.size());
    {
      std::lock_guard lock(mutex_);
      published_counters_ = counters_;
    }
  }
  // Shutdown: everything still here ends cancelled, pages go back.
  for (auto& seq : running_) finish(*seq, FinishReason::kCancelled);
  running_.clear();
  for (auto& seq : waiting_) {
    seq->stream->push(StreamItem{{}, FinishReason::kCancelled, seq->usage, {}});
  }
  waiting_.clear();
  flush_events();
}

void Engine::flush_events() {
  if (events_.events.empty()) return;
  if (publish_) publish_(std::move(events_.events));
  events_.events.clear();
}

bool Engine::ensure_pages(Seq& seq, int64_t positions) {
  const int64_t need = (positions + options_.page_size - 1) / options_.page_size -
                       static_cast<int64_t>(seq.pages.size());
  if (need <= 0) return true;
  if (allocator_->num_free() < need)
    tree_->evict(static_cast<int32_t>(need - allocator_->num_free()));
  return allocator_->allocate(static_cast<int32_t>(need), seq.pages).has_value();
}

// Inserts the request's computed full pages into the tree and switches its page table
// to the tree's pages where the tree already had the blocks (freeing its duplicates),
// then moves its lock to the new last node.
void Engine::cache_computed_pages(Seq& seq) {
  const int32_t ps = options_.page_size;
  const int32_t full = static_cast<int32_t>(seq.computed / ps);
  if (full <= seq.tree_pages) return;
  const std::span<const int32_t> tokens(seq.tokens.data(), static_cast<size_t>(full) * ps);
  tree_->insert(tokens, std::span<const PageId>(seq.pages.data(), static_cast<size_t>(full)),
                seq.spec.cache_salt);
  MatchResult m = tree_->match_prefix(tokens, seq.spec.cache_salt);
  for (int32_t k = seq.tree_pages; k < m.num_pages; ++k) {
    if (m.device_pages[static_cast<size_t>(k)] != seq.pages[static_cast<size_t>(k)]) {
      allocator_->free(seq.pages[static_cast<size_t>(k)]);
      seq.pages[static_cast<size_t>(k)] = m.device_pages[static_cast<size_t>(k)];
    }
  }
  const LockReceipt old = seq.receipt;
  seq.receipt = tree_->lock(m.last_node);
  if (old.valid()) STRATA_CHECK(tree_->release(old).has_value());
  seq.tree_pages = m.num_pages;
}

void Engine::release_seq_pages(Seq& seq) {
  if (seq.admitted) cache_computed_pages(seq);
  allocator_->free(std::span<const PageId>(seq.pages).subspan(static_cast<size_t>(seq.tree_pages)));
  seq.pages.clear();
  seq.tree_pages = 0;
  if (seq.receipt.valid()) STRATA_CHECK(tree_->release(seq.receipt).has_value());
  seq.receipt = LockReceipt{};
  seq.admitted = false;
}

void Engine::finish(Seq& seq, FinishReason reason, std::string error, int32_t stop_token) {
  release_seq_pages(seq);
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
void Engine::retract(Seq& seq) {
  release_seq_pages(seq);
  seq.computed = 0;
  ++counters_.requests_retracted;
}

bool Engine::try_admit(Seq& seq) {
  const int32_t ps = options_.page_size;
  // Match all but the last token: at least one token must run to produce logits.
  const std::span<const int32_t> probe(seq.tokens.data(), seq.tokens.size() - 1);
  MatchResult m = tree_->match_prefix(probe, seq.spec.cache_salt);
  const int64_t remaining_pages =
      (static_cast<int64_t>(seq.tokens.size()) + ps) / ps - m.num_pages;  // +1 decode slot
  const TreeStats stats = tree_->stats();
  // Pages the matched path holds become protected by our lock.
  int64_t newly_protected = 0;
  for (const RadixNode* n = m.last_node; n != nullptr && n != tree_->root(); n = n->parent) {
    if (!n->is_protected()) newly_protected += n->num_pages();
  }
  const int64_t available =
      allocator_->num_free() + stats.cached_pages - stats.protected_pages - newly_protected;
  if (available < remaining_pages) return false;
  seq.receipt = tree_->lock(m.last_node);
  seq.pages = std::move(m.device_pages);
  seq.tree_pages = m.num_pages;
  seq.computed = static_cast<int64_t>(m.num_pages) * ps;
  seq.admitted = true;
  if (!seq.counted) {
    seq.counted = true;
    // First admission: what the cache saved this prompt (a re-admission after a
    // retraction keeps the first figure, as the client saw it).
    seq.usage.cached_tokens = static_cast<int32_t>(seq.computed);
    seq.usage.cached_device = seq.usage.cached_tokens;
    counters_.cached_prompt_tokens += static_cast<uint64_t>(seq.computed);
    counters_.prompt_tokens += static_cast<uint64_t>(seq.prompt_len);
  }
  return true;
}

void Engine::admit() {
  while (!waiting_.empty() &&
         static_cast<int32_t>(running_.size()) < options_.max_running_requests) {
    Seq& seq = *waiting_.front();
    if (seq.stream->cancelled()) {
      seq.usage.prompt_tokens = seq.prompt_len;
      ++counters_.requests_cancelled;
      seq.stream->push(StreamItem{{}, FinishReason::kCancelled, seq.usage, {}});
      waiting_.pop_front();
      continue;
    }
    if (!try_admit(seq)) {
      if (running_.empty()) {
        // Nothing runs and the head cannot start: only pins can be in the way (the
        // prompt fits the pool, checked at submit). Unpin as few as needed.
        const int32_t ps = options_.page_size;
        const int64_t need = (static_cast<int64_t>(seq.tokens.size()) + ps) / ps;
        const TreeStats st = tree_->stats();
        const int64_t shortfall =
            need - (allocator_->num_free() + st.cached_pages - st.protected_pages);
        auto released = tree_->release_pins_for(std::max<int64_t>(shortfall, 1));
        if (!released.empty()) {
          counters_.auto_unpinned_blocks += released.size();
          STRATA_LOG_WARN(
              "pinned pages left no room for a {}-token request: unpinned {} blocks "
              "(soft pins first, least recently used first)",
              seq.tokens.size(), released.size());
          continue;  // try again with the room made
        }
        finish(seq, FinishReason::kError, "the request cannot fit the KV pool");
        waiting_.pop_front();
      }
      break;  // FIFO: wait for running requests to free pages
    }
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

bool Engine::step() {
  // Cancelled running requests leave first: their pages go back at once.
  for (size_t i = 0; i < running_.size();) {
    if (running_[i]->stream->cancelled()) {
      finish(*running_[i], FinishReason::kCancelled);
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  admit();
  if (running_.empty()) return false;

  // Plan the batch: every decoding request contributes one token; prefilling requests
  // share the chunk budget in arrival order.
  struct Planned {
    Seq* seq;
    int64_t start;
    int64_t count;
  };
  std::vector<Planned> plan;
  int64_t prefill_budget = options_.chunked_prefill_size;
  for (size_t i = 0; i < running_.size(); ++i) {
    Seq& seq = *running_[i];
    const int64_t pending = static_cast<int64_t>(seq.tokens.size()) - seq.computed;
    STRATA_CHECK(pending >= 1);
    int64_t count = pending;
    if (pending > 1) {
      if (prefill_budget <= 0) continue;
      count = std::min(pending, prefill_budget);
      prefill_budget -= count;
    }
    if (!ensure_pages(seq, seq.computed + count)) {
      // Not even eviction helps: retract the newest request (possibly this one).
      Seq& victim = *running_.back();
      retract(victim);
      waiting_.push_front(std::move(running_.back()));
      running_.pop_back();
      if (&victim == &seq) break;
      if (!ensure_pages(seq, seq.computed + count)) break;
    }
    plan.push_back(Planned{&seq, seq.computed, count});
  }
  if (plan.empty()) return false;

  std::vector<ForwardSequence> batch;
  batch.reserve(plan.size());
  for (const Planned& p : plan) {
    ForwardSequence fs;
    fs.token_ids =
        std::span<const int32_t>(p.seq->tokens.data() + p.start, static_cast<size_t>(p.count));
    fs.start_position = p.start;
    fs.page_table = p.seq->pages;
    fs.want_logits = p.start + p.count == static_cast<int64_t>(p.seq->tokens.size());
    batch.push_back(fs);
  }
  Status st = model_->forward(batch, *kv_pool_, logits_);
  ++counters_.forward_steps;
  if (!st) {
    // The batch was validated at submit; a failure here is a fault: end those requests.
    STRATA_LOG_ERROR("forward pass failed: {}", st.error().message);
    for (const Planned& p : plan) p.seq->computed = p.start;
    for (auto& seq : running_) finish(*seq, FinishReason::kError, st.error().message);
    running_.clear();
    return true;
  }

  const int32_t vocab = model_->config().vocab_size;
  size_t row = 0;
  std::vector<Seq*> done;
  for (size_t i = 0; i < plan.size(); ++i) {
    Seq& seq = *plan[i].seq;
    seq.computed = plan[i].start + plan[i].count;
    if (!batch[i].want_logits) {
      cache_computed_pages(seq);
      continue;
    }
    const float* logits = logits_.data() + row * static_cast<size_t>(vocab);
    ++row;
    GeneratedToken tok =
        seq.sampler->sample(std::span<const float>(logits, static_cast<size_t>(vocab)));
    cache_computed_pages(seq);
    if (tok.is_stop) {
      done.push_back(&seq);
      finish(seq, FinishReason::kStop, {}, tok.token);
      continue;
    }
    seq.tokens.push_back(tok.token);
    ++seq.generated;
    ++counters_.generated_tokens;
    seq.stream->push(StreamItem{{std::move(tok)}, std::nullopt, {}, {}});
    if (seq.generated >= seq.spec.max_tokens) {
      done.push_back(&seq);
      finish(seq, FinishReason::kLength);
    }
  }
  if (!done.empty()) {
    std::erase_if(running_, [&](const std::unique_ptr<Seq>& s) {
      return std::find(done.begin(), done.end(), s.get()) != done.end();
    });
  }
  return true;
}

}  // namespace strata
