// The scheduler's part of prefill/decode disaggregation (docs/pd-disaggregation.md,
// "Engine integration"): everything runs on the scheduler thread, between steps.
//
// Decode side. A request that names a live prefill worker (RequestSpec::prefill_peer) is
// matched against the tree as usual; instead of prefilling, it reserves device pages for
// the uncached pages of its prompt, locks its cached prefix, and sends a PrefillOrder.
// It waits in remote_ until the room is Done, then receives the pages (a no-op beyond
// ordering for UCX, a read for the storage path), inserts the prompt's full pages into the
// tree (BlockStored events) and decodes from the first token the prefill worker sampled.
// Any failure (rejection, a deadline, the peer's death, a bad message, a failed receive)
// sends the request back to the queue to prefill locally; the room's pages go back at once
// when the peer said it stopped writing, else after the quarantine.
//
// Prefill side. An order becomes a request of this worker (max_tokens 1, its own radix
// cache matched as usual). After each step its newly computed full pages are sent
// (protected by a lock of their own while the transport reads them, so a retraction cannot
// free them); the last step sends the rest, the partial last page included, and the
// request waits in pd_sending_ with its pages until every send completed; then PrefillDone
// (or PrefillFailed) goes out and the lease ends.
#include <algorithm>
#include <chrono>

#include "common/check.h"
#include "common/log.h"
#include "engine/page_math.h"
#include "engine/scheduler.h"
#include "engine/scheduler_seq.h"

namespace strata {
namespace {

PdFallback fallback_of(pd::RoomFailReason r) {
  switch (r) {
    case pd::RoomFailReason::kAcceptTimeout:
    case pd::RoomFailReason::kStalled:
    case pd::RoomFailReason::kDeadline:
      return PdFallback::kTimeout;
    case pd::RoomFailReason::kPeerDead:
      return PdFallback::kPeerDead;
    case pd::RoomFailReason::kRejected:
      return PdFallback::kRejected;
    case pd::RoomFailReason::kPrefillFailed:
      return PdFallback::kPrefillFailed;
    case pd::RoomFailReason::kProtocolError:
      return PdFallback::kProtocolError;
  }
  return PdFallback::kProtocolError;
}

// Pages of the prompt: ceil(n / page_size).
int32_t prompt_pages(int64_t n, int32_t ps) {
  return static_cast<int32_t>(pages_for(n, ps));
}

// A keep-alive PagesWritten goes to the decode worker at least this often while an order
// waits or computes, far inside its stall deadline.
constexpr int64_t kKeepAliveMs = 1'000;

}  // namespace

Status Scheduler::init_pd() {
  KvPool* pool = kv_pool_.get();
  if (const std::optional<ExternalKv> external = model_->external_kv()) {
    // The transports send host memory: the pages cross through a stage (engine/pd_stage.h).
    const int64_t pages =
        std::clamp<int64_t>(pages_for(options_.pd.stage_tokens, options_.page_size), 1, num_pages_);
    auto stage = PdStage::create(*model_, *external, static_cast<int32_t>(pages),
                                 options_.hicache.io_backend,
                                 std::max<int64_t>(options_.pd.stall_ms, 1), *clock_);
    if (!stage) return std::unexpected(stage.error());
    pd_stage_ = std::move(*stage);
    pool = &pd_stage_->pool();
    STRATA_LOG_INFO("disaggregation: the KV crosses a stage of {} pages ({:.2f} GB of host memory)",
                    pages, static_cast<double>(pool->total_bytes()) / 1e9);
  }
  auto link = PdLink::create(options_.pd, *pool, *clock_, [this] {
    {
      std::lock_guard lock(mutex_);
      pd_signal_ = true;
    }
    wake_.notify_one();
  });
  if (!link) return std::unexpected(link.error());
  pd_ = std::move(*link);
  return {};
}

PdInfo Scheduler::pd_info() const {
  if (!pd_) {
    PdInfo i;
    i.role = options_.pd.role;
    return i;
  }
  return pd_->info();
}

bool Scheduler::pd_busy() const {
  return pd_ && (!remote_.empty() || !orders_.empty() || !quarantine_.empty() ||
                 !stage_sends_.empty() || (pd_stage_ && pd_stage_->in_flight() > 0));
}

// ---- Decode side ----

std::optional<Scheduler::Admission> Scheduler::try_remote(Seq& seq, const MatchResult& m) {
  const std::string& peer = seq.spec.prefill_peer;
  const SamplingParams& sp = seq.spec.sampling;
  // Log-probabilities of the first token, and salted (tenant-isolated) prompts, stay local:
  // the order carries neither.
  if (sp.logprobs || sp.top_logprobs > 0 || !seq.spec.cache_salt.empty()) return std::nullopt;
  if (!pd_->channel().peer_alive(peer)) {
    ++counters_.pd_fallbacks[static_cast<size_t>(PdFallback::kPeerUnavailable)];
    return std::nullopt;
  }
  const int32_t ps = options_.page_size;
  const int64_t n = static_cast<int64_t>(seq.tokens.size());
  const int32_t room_pages = prompt_pages(n, ps) - m.num_pages;
  // Room as for a local admission: the pages the prompt needs, beside what running
  // requests still need.
  if (device_room(m.last_node) < room_pages + 1) {
    seq.pd_tried = false;  // try again once there is room
    return Admission::kNoRoom;
  }
  const LockReceipt receipt = tree_->lock(m.last_node);
  std::vector<PageId> dst;
  if (allocator_->num_free() < room_pages) tree_->evict(room_pages - allocator_->num_free());
  if (!allocator_->allocate(room_pages, dst)) {
    STRATA_CHECK(tree_->release(receipt).has_value());
    seq.pd_tried = false;
    return Admission::kNoRoom;
  }
  // With a stage, the prefill worker writes stage pages; they are copied to `dst` after.
  std::vector<PageId> stage;
  if (pd_stage_) {
    PageAllocator& sp_pages = pd_stage_->pages();
    if (room_pages > sp_pages.num_pages() || !sp_pages.allocate(room_pages, stage)) {
      allocator_->free(dst);
      STRATA_CHECK(tree_->release(receipt).has_value());
      if (room_pages <= sp_pages.num_pages()) {
        seq.pd_tried = false;  // the stage is busy: try again once rooms complete
        return Admission::kNoRoom;
      }
      ++counters_.pd_fallbacks[static_cast<size_t>(PdFallback::kStageTooSmall)];
      return std::nullopt;
    }
  }
  pd::PrefillOrder order;
  order.room = pd_->rooms().new_room_id();
  order.decode_worker_id = pd_->options().worker_id;
  order.tokens = seq.tokens;
  order.cached_tokens = m.num_pages * ps;
  order.page_size = ps;
  for (PageId p : pd_stage_ ? stage : dst) {
    order.dst_pages.push_back(static_cast<uint32_t>(page_index(p)));
  }
  order.transport = pd_->transport_info();
  order.sampling["temperature"] = static_cast<double>(sp.temperature);
  order.sampling["top_p"] = static_cast<double>(sp.top_p);
  order.sampling["top_k"] = int64_t{sp.top_k};
  order.sampling["seed"] = sp.seed.value_or(seq.id);
  order.deadline_ms = options_.pd.order_deadline_ms;
  const int64_t now = clock_->now_ms();
  const uint64_t room = pd::room_value(order.room);
  pd_->fence_pages();
  Status st = pd_->rooms().open(order, peer, now);
  if (st) st = pd_->channel().send(peer, order);
  if (!st) {
    if (pd_->rooms().find(order.room)) (void)pd_->rooms().cancel(order.room, now);
    (void)pd_->rooms().erase(order.room);
    allocator_->free(dst);
    if (pd_stage_) pd_stage_->pages().free(stage);
    STRATA_CHECK(tree_->release(receipt).has_value());
    ++counters_.pd_fallbacks[static_cast<size_t>(PdFallback::kSendFailed)];
    STRATA_LOG_WARN("disaggregation: cannot order the prefill from {}: {}; prefilling locally",
                    peer, st.error().message);
    return std::nullopt;
  }
  STRATA_CHECK(pd_->rooms().ordered(order.room, now).has_value());
  if (seq.load_receipt.valid()) {
    STRATA_CHECK(tree_->release(seq.load_receipt).has_value());
    seq.load_receipt = LockReceipt{};
  }
  seq.receipt = receipt;
  seq.pages = std::move(m.device_pages);
  seq.pages.insert(seq.pages.end(), dst.begin(), dst.end());
  seq.tree_pages = m.num_pages;
  seq.computed = static_cast<int64_t>(m.num_pages) * ps;
  seq.pd_room = room;
  seq.pd_ordered_ms = now;
  seq.pd_stage_pages = std::move(stage);
  count_admission(seq);
  ++counters_.pd_rooms_ordered;
  STRATA_LOG_DEBUG("disaggregation: room {:016x}: {} of {} prompt tokens ordered from {}", room,
                   n - order.cached_tokens, n, peer);
  return Admission::kRemote;
}

std::vector<PageId> Scheduler::detach_room_pages(Seq& seq) {
  std::vector<PageId> pages(seq.pages.begin() + seq.tree_pages, seq.pages.end());
  seq.pages.resize(static_cast<size_t>(seq.tree_pages));
  return pages;
}

std::unique_ptr<Scheduler::Seq> Scheduler::take_remote(uint64_t room) {
  for (size_t i = 0; i < remote_.size(); ++i) {
    if (remote_[i]->pd_room != room) continue;
    std::unique_ptr<Seq> seq = std::move(remote_[i]);
    remote_.erase(remote_.begin() + static_cast<std::ptrdiff_t>(i));
    return seq;
  }
  return nullptr;
}

// The request prefills locally after all: its cached prefix lock goes, it queues again at
// the front (its place in line is kept by its arrival time and class).
void Scheduler::pd_fallback(std::unique_ptr<Seq> seq, PdFallback reason) {
  ++counters_.pd_fallbacks[static_cast<size_t>(reason)];
  release_seq_pages(*seq);
  seq->move_to(SeqState::kWaiting);
  seq->computed = 0;
  seq->pd_room = 0;
  waiting_.push_front(std::move(seq));
}

void Scheduler::pd_room_event(const pd::RoomEvent& ev) {
  const uint64_t room = pd::room_value(ev.room);
  switch (ev.kind) {
    case pd::RoomEvent::Kind::kAccepted:
    case pd::RoomEvent::Kind::kProgress:
      return;
    case pd::RoomEvent::Kind::kDone: {
      Seq* seq = nullptr;
      for (auto& s : remote_) {
        if (s->pd_room == room) seq = s.get();
      }
      if (seq == nullptr) {
        (void)pd_->rooms().erase(ev.room);
        return;
      }
      seq->pd_first_token = ev.done.first_token;
      seq->usage.kv_transfer_tokens = static_cast<int32_t>(ev.done.tokens_transferred);
      seq->usage.kv_transfer_bytes = static_cast<int64_t>(ev.done.bytes);
      PageBatch batch;
      batch.room_id = room;
      if (pd_stage_) {
        batch.dst_pages = seq->pd_stage_pages;
      } else {
        batch.dst_pages.assign(seq->pages.begin() + seq->tree_pages, seq->pages.end());
      }
      batch.src_pages = batch.dst_pages;  // unused on this side
      const int32_t count = static_cast<int32_t>(batch.dst_pages.size());
      Status st = pd_->transport().receive(batch, std::max<int64_t>(options_.pd.stall_ms, 1),
                                           pd_->completion(room, true, 0, count));
      if (!st) {
        (void)pd_->rooms().erase(ev.room);
        std::unique_ptr<Seq> failed = take_remote(room);
        pd_free_stage(*failed);
        pd_fallback(std::move(failed), PdFallback::kTransfer);
        return;
      }
      seq->move_to(SeqState::kReceiving);
      return;
    }
    case pd::RoomEvent::Kind::kFailed: {
      if (ev.send_cancel) (void)pd_->channel().send(ev.peer, pd::Cancel{ev.room});
      std::unique_ptr<Seq> seq = take_remote(room);
      std::vector<PageId> pages = seq ? detach_room_pages(*seq) : std::vector<PageId>{};
      std::vector<PageId> stage = seq ? std::move(seq->pd_stage_pages) : std::vector<PageId>{};
      if (seq) seq->pd_stage_pages.clear();  // released with the room
      pd_release_room_pages(room, std::move(pages), std::move(stage), ev.reclaimable);
      if (ev.reclaimable) (void)pd_->rooms().erase(ev.room);
      STRATA_LOG_INFO("disaggregation: room {:016x} with {} failed ({}: {}); prefilling locally",
                      room, ev.peer, pd::room_fail_reason_name(ev.reason), ev.message);
      if (seq) pd_fallback(std::move(seq), fallback_of(ev.reason));
      return;
    }
    case pd::RoomEvent::Kind::kReclaimable: {
      auto it = quarantine_.find(room);
      if (it != quarantine_.end()) {
        pd_free_quarantined(it->second);
        quarantine_.erase(it);
      }
      (void)pd_->rooms().erase(ev.room);
      return;
    }
  }
}

// The room's pages hold the prompt's KV: the prompt's full pages join the tree, the first
// token goes out, and the request decodes from here.
void Scheduler::pd_land(Seq& seq) {
  const int64_t now = clock_->now_ms();
  seq.move_to(SeqState::kRunning);
  seq.computed = seq.prompt_len;
  seq.usage.kv_transferred = true;
  seq.usage.kv_transfer_ms = now - seq.pd_ordered_ms;
  ++counters_.pd_rooms_done;
  const int64_t pages = static_cast<int64_t>(seq.pages.size()) - seq.tree_pages;
  counters_.pd_pages_received += static_cast<uint64_t>(pages);
  counters_.pd_bytes_received += static_cast<uint64_t>(seq.usage.kv_transfer_bytes);
  cache_computed_pages(seq);
  seq.pd_room = 0;
}

// ---- Prefill side ----

void Scheduler::pd_take_order(const std::string& peer, pd::PrefillOrder order,
                              int64_t received_ms) {
  const uint64_t room = pd::room_value(order.room);
  auto reject = [&](const std::string& reason, int64_t retry_after_ms) {
    ++counters_.pd_orders_rejected;
    (void)pd_->channel().send(peer, pd::OrderRejected{order.room, reason, retry_after_ms});
  };
  const ModelConfig& cfg = model_->config();
  const int32_t ps = options_.page_size;
  if (order.page_size != ps) {
    return reject(
        "page size " + std::to_string(order.page_size) + " differs from " + std::to_string(ps), 0);
  }
  const int64_t n = static_cast<int64_t>(order.tokens.size());
  if (n >= cfg.max_position_embeddings) return reject("the prompt exceeds the context", 0);
  for (int32_t t : order.tokens) {
    if (t >= cfg.vocab_size) return reject("a token id is outside the vocabulary", 0);
  }
  if (prompt_pages(n, ps) + 1 > num_pages_) return reject("the prompt cannot fit the KV pool", 0);
  if (counters_.queued_prefill_tokens + n > options_.pd.max_queued_prefill_tokens) {
    return reject("overloaded: " + std::to_string(counters_.queued_prefill_tokens) +
                      " prompt tokens wait here",
                  std::max<int64_t>(options_.pd.heartbeat_ms, 100));
  }
  if (orders_.contains(room)) return reject("the room is taken", 0);
  SamplingParams sp;
  sp.temperature =
      static_cast<float>(pd::sampling_double(order.sampling, "temperature").value_or(1));
  sp.top_p = static_cast<float>(pd::sampling_double(order.sampling, "top_p").value_or(1));
  sp.top_k = static_cast<int32_t>(pd::sampling_i64(order.sampling, "top_k").value_or(0));
  sp.seed = pd::sampling_u64(order.sampling, "seed");
  if (auto st = validate_sampling_params(sp); !st) return reject(st.error().message, 0);
  if (auto st = pd_->leases().acquire(order.room, peer, room, received_ms, order.deadline_ms);
      !st) {
    return reject(st.error().message, st.error().code == ErrorCode::kResourceExhausted
                                          ? std::max<int64_t>(options_.pd.heartbeat_ms, 100)
                                          : 0);
  }
  auto dest = pd_->destination(peer, order.transport);
  if (!dest) {
    (void)pd_->leases().release(order.room);
    return reject("cannot reach the decode worker's pool: " + dest.error().message, 0);
  }
  RemoteOrder ro;
  ro.peer = peer;
  ro.destination = *dest;
  ro.first_page = order.cached_tokens / ps;
  ro.prompt_len = static_cast<int32_t>(n);
  for (uint32_t p : order.dst_pages) ro.dst_pages.push_back(make_page_id(static_cast<int32_t>(p)));
  ro.received_ms = received_ms;
  ro.last_keepalive_ms = clock_->now_ms();
  auto seq = std::make_unique<Seq>();
  seq->id = next_id_.fetch_add(1);
  seq->stream = std::make_shared<RequestStream>(seq->id);
  seq->tokens = std::move(order.tokens);
  seq->prompt_len = static_cast<int32_t>(n);
  seq->spec.prompt = seq->tokens;
  seq->spec.sampling = sp;
  seq->spec.max_tokens = 1;
  seq->sampler.emplace(sp, seq->id);
  seq->arrival_ms = clock_->now_ms();
  seq->remote_room = room;
  orders_.emplace(room, std::move(ro));
  waiting_.push_back(std::move(seq));
  ++counters_.pd_orders_accepted;
  (void)pd_->channel().send(peer, pd::OrderAccepted{order.room});
}

void Scheduler::pd_send_ready(Seq& seq, bool final) {
  auto it = orders_.find(seq.remote_room);
  if (it == orders_.end() || it->second.state == RemoteOrder::State::kAborted) return;
  RemoteOrder& ro = it->second;
  const int32_t ps = options_.page_size;
  const int32_t ready_prompt_pages =
      final ? prompt_pages(seq.prompt_len, ps) : static_cast<int32_t>(seq.computed / ps);
  const int32_t ready =
      std::clamp(ready_prompt_pages - ro.first_page, 0, static_cast<int32_t>(ro.dst_pages.size()));
  if (final) ro.state = RemoteOrder::State::kSending;
  if (ready <= ro.pages_sent) return;
  PageBatch batch;
  batch.room_id = seq.remote_room;
  batch.first_index = ro.pages_sent;
  for (int32_t i = ro.pages_sent; i < ready; ++i) {
    batch.src_pages.push_back(seq.pages[static_cast<size_t>(ro.first_page + i)]);
    batch.dst_pages.push_back(ro.dst_pages[static_cast<size_t>(i)]);
  }
  if (!final) {
    // Full pages only, all in the tree (cache_computed_pages ran): lock them for the send.
    const LockReceipt lock = tree_->lock(tree_->locked_node(seq.receipt));
    if (ro.send_receipt.valid()) STRATA_CHECK(tree_->release(ro.send_receipt).has_value());
    ro.send_receipt = lock;
  }
  if (pd_stage_) {
    ro.pages_sent = ready;
    pd_queue_staged_send(seq.remote_room, std::move(batch));
    return;
  }
  const int64_t deadline = pd_->leases()
                               .deadline_of(pd::RoomId{seq.remote_room})
                               .value_or(clock_->now_ms() + options_.pd.order_deadline_ms);
  const int64_t timeout = std::max<int64_t>(1, deadline - clock_->now_ms());
  const int32_t count = ready - ro.pages_sent;
  Status st = pd_->transport().send(ro.destination, batch, timeout,
                                    pd_->completion(seq.remote_room, false, ro.pages_sent, count));
  if (!st) {
    // pd_poll aborts the order at the next iteration (not here: the caller iterates the
    // queue this request is in).
    ro.send_failed = true;
    ro.why = "sending pages failed: " + st.error().message;
    return;
  }
  ++ro.outstanding;
  ro.pages_sent = ready;
}

// Ends an order early: its request leaves the queues (its sent pages stay locked until the
// transport lets go of them), and pd_settle_orders sends PrefillFailed once nothing reads.
void Scheduler::pd_abort(uint64_t room, bool tell_peer, const std::string& why) {
  auto it = orders_.find(room);
  if (it == orders_.end()) return;
  RemoteOrder& ro = it->second;
  ro.tell_peer = ro.tell_peer && tell_peer;
  if (ro.state == RemoteOrder::State::kAborted) return;
  ro.state = RemoteOrder::State::kAborted;
  ro.why = why;
  auto drop = [&](auto& list) {
    for (auto s = list.begin(); s != list.end(); ++s) {
      if ((*s)->remote_room != room) continue;
      Seq& seq = **s;
      if (seq.load_receipt.valid()) STRATA_CHECK(tree_->release(seq.load_receipt).has_value());
      seq.load_receipt = LockReceipt{};
      end_order_request(seq);
      list.erase(s);
      return true;
    }
    return false;
  };
  if (!drop(waiting_) && !drop(running_)) drop(parked_);
  ++counters_.pd_orders_failed;
  STRATA_LOG_INFO("disaggregation: order {:016x} from {} aborted: {}", room, ro.peer, why);
}

// Orders whose sends all completed: PrefillDone (or PrefillFailed), the pages go back, the
// lease ends.
void Scheduler::pd_settle_orders() {
  for (auto it = orders_.begin(); it != orders_.end();) {
    RemoteOrder& ro = it->second;
    const uint64_t room = it->first;
    const bool finished = ro.state == RemoteOrder::State::kSending && ro.first_token >= 0;
    if (ro.outstanding > 0 || !(finished || ro.state == RemoteOrder::State::kAborted)) {
      ++it;
      continue;
    }
    for (size_t i = 0; i < pd_sending_.size(); ++i) {
      if (pd_sending_[i]->remote_room != room) continue;
      end_order_request(*pd_sending_[i]);
      pd_sending_.erase(pd_sending_.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
    if (ro.send_receipt.valid()) STRATA_CHECK(tree_->release(ro.send_receipt).has_value());
    const pd::RoomId id{room};
    if (finished && !ro.send_failed) {
      pd::PrefillDone done;
      done.room = id;
      done.first_token = ro.first_token;
      done.tokens_transferred =
          static_cast<uint32_t>(ro.prompt_len - ro.first_page * options_.page_size);
      done.bytes = ro.bytes;
      done.transfer_ms =
          static_cast<uint32_t>(std::max<int64_t>(0, clock_->now_ms() - ro.received_ms));
      (void)pd_->channel().send(ro.peer, done);
      ++counters_.pd_orders_done;
    } else if (ro.tell_peer) {
      if (finished) ++counters_.pd_orders_failed;
      (void)pd_->channel().send(ro.peer, pd::PrefillFailed{id, ro.why.empty() ? "failed" : ro.why});
    }
    (void)pd_->leases().release(id);
    it = orders_.erase(it);
  }
  // Requests whose order vanished (it cannot, but nothing may leak): their pages go back.
  for (size_t i = 0; i < pd_sending_.size();) {
    if (orders_.contains(pd_sending_[i]->remote_room)) {
      ++i;
      continue;
    }
    end_order_request(*pd_sending_[i]);
    pd_sending_.erase(pd_sending_.begin() + static_cast<std::ptrdiff_t>(i));
  }
}

// ---- Through a stage (engine/pd_stage.h) ----

KvPool& Scheduler::pd_pool() {
  return pd_stage_ ? pd_stage_->pool() : *kv_pool_;
}

// A send of at most the stage's size at a time: a batch larger than the stage goes in parts.
void Scheduler::pd_queue_staged_send(uint64_t room, PageBatch batch) {
  RemoteOrder& ro = orders_.at(room);
  const auto part = static_cast<size_t>(pd_stage_->pages().num_pages());
  for (size_t at = 0; at < batch.src_pages.size(); at += part) {
    const size_t n = std::min(part, batch.src_pages.size() - at);
    StagedSend send;
    send.room = room;
    send.batch.room_id = batch.room_id;
    send.batch.first_index = batch.first_index + static_cast<int32_t>(at);
    send.batch.src_pages.assign(batch.src_pages.begin() + static_cast<std::ptrdiff_t>(at),
                                batch.src_pages.begin() + static_cast<std::ptrdiff_t>(at + n));
    send.batch.dst_pages.assign(batch.dst_pages.begin() + static_cast<std::ptrdiff_t>(at),
                                batch.dst_pages.begin() + static_cast<std::ptrdiff_t>(at + n));
    ++ro.outstanding;  // until the transport's completion (or the part's failure)
    stage_sends_.push_back(std::move(send));
  }
  pd_pump_stage();
}

// Sends waiting for stage pages get them in order (a later one never overtakes an earlier
// one: the decode worker's pages arrive in order); each one's device -> stage copy starts.
void Scheduler::pd_pump_stage() {
  for (StagedSend& send : stage_sends_) {
    if (send.ticket != 0) continue;
    auto it = orders_.find(send.room);
    if (it == orders_.end() || it->second.state == RemoteOrder::State::kAborted) {
      continue;  // dropped below, without a copy
    }
    const auto n = static_cast<int32_t>(send.batch.src_pages.size());
    if (!pd_stage_->pages().allocate(n, send.stage)) break;
    send.ticket =
        pd_stage_->copy(TransferDirection::kDeviceToHost, send.batch.src_pages, send.stage);
  }
  // Parts of aborted orders that never started their copy end here.
  for (auto s = stage_sends_.begin(); s != stage_sends_.end();) {
    auto it = orders_.find(s->room);
    if (s->ticket == 0 &&
        (it == orders_.end() || it->second.state == RemoteOrder::State::kAborted)) {
      if (it != orders_.end()) --it->second.outstanding;
      s = stage_sends_.erase(s);
    } else {
      ++s;
    }
  }
}

void Scheduler::pd_stage_outcome(const TransferOutcome& o) {
  if (o.result == TransferResult::kStalled) {
    STRATA_LOG_WARN("disaggregation: a copy through the stage is slow ({})", o.error);
    return;  // it still resolves; its pages stay held until then
  }
  // Decode side: a received room's pages reached its device pages (or failed to).
  if (auto load = stage_loads_.find(o.ticket); load != stage_loads_.end()) {
    const uint64_t room = load->second;
    stage_loads_.erase(load);
    std::unique_ptr<Seq> seq = take_remote(room);
    STRATA_CHECK(seq != nullptr);
    if (o.result == TransferResult::kLanded)
      counters_.pd_stage_pages_copied += seq->pd_stage_pages.size();
    pd_free_stage(*seq);
    if (o.result == TransferResult::kFailed) {
      ++counters_.pd_stage_copy_faults;
      STRATA_LOG_WARN(
          "disaggregation: room {:016x}: copying its pages to the device failed: "
          "{}; prefilling locally",
          room, o.error);
      pd_fallback(std::move(seq), PdFallback::kTransfer);
      return;
    }
    pd_deliver(std::move(seq));
    return;
  }
  // Prefill side: a part's pages reached the stage: the transport sends them from there.
  auto send = std::find_if(stage_sends_.begin(), stage_sends_.end(),
                           [&](const StagedSend& s) { return s.ticket == o.ticket; });
  STRATA_CHECK(send != stage_sends_.end());
  StagedSend part = std::move(*send);
  stage_sends_.erase(send);
  auto it = orders_.find(part.room);
  RemoteOrder* ro = it == orders_.end() ? nullptr : &it->second;
  auto fail = [&](const std::string& why) {
    pd_stage_->pages().free(part.stage);
    if (ro == nullptr) return;
    --ro->outstanding;
    if (!ro->send_failed) {
      ro->send_failed = true;
      ro->why = why;
    }
  };
  if (o.result == TransferResult::kFailed) {
    ++counters_.pd_stage_copy_faults;
    return fail("copying pages to the stage failed: " + o.error);
  }
  if (ro == nullptr || ro->state == RemoteOrder::State::kAborted) {
    pd_stage_->pages().free(part.stage);
    if (ro != nullptr) --ro->outstanding;
    return;
  }
  counters_.pd_stage_pages_copied += part.stage.size();
  part.batch.src_pages = part.stage;
  const int64_t deadline = pd_->leases()
                               .deadline_of(pd::RoomId{part.room})
                               .value_or(clock_->now_ms() + options_.pd.order_deadline_ms);
  const int64_t timeout = std::max<int64_t>(1, deadline - clock_->now_ms());
  const int32_t count = static_cast<int32_t>(part.batch.src_pages.size());
  Status st =
      pd_->transport().send(ro->destination, part.batch, timeout,
                            pd_->completion(part.room, false, part.batch.first_index, count));
  if (!st) return fail("sending pages failed: " + st.error().message);
  stage_in_send_[{part.room, part.batch.first_index}] = std::move(part.stage);
}

void Scheduler::pd_free_stage(Seq& seq) {
  if (pd_stage_ && !seq.pd_stage_pages.empty()) pd_stage_->pages().free(seq.pd_stage_pages);
  seq.pd_stage_pages.clear();
}

void Scheduler::pd_deliver(std::unique_ptr<Seq> seq) {
  pd_land(*seq);
  GeneratedToken tok;
  tok.token = seq->pd_first_token;
  const auto& stops = seq->spec.sampling.stop_token_ids;
  tok.is_stop = std::find(stops.begin(), stops.end(), tok.token) != stops.end();
  if (!emit_sampled(*seq, std::move(tok))) running_.push_back(std::move(seq));
}

// A failed or cancelled room: the peer may still write the pages it was given until the
// room is reclaimable. With a stage those are the stage's (the device pages go back now:
// nothing but the stage's copy writes them, and it never started); without, the device's.
void Scheduler::pd_release_room_pages(uint64_t room, std::vector<PageId> device_pages,
                                      std::vector<PageId> stage_pages, bool reclaimable) {
  std::vector<PageId> written = std::move(device_pages);
  if (pd_stage_) {
    allocator_->free(written);
    written = std::move(stage_pages);
  }
  if (reclaimable) {
    pd_free_quarantined(written);
  } else {
    quarantine_[room] = std::move(written);
  }
}

void Scheduler::pd_free_quarantined(std::vector<PageId>& pages) {
  pd_->fence_pages();  // bytes that did land are ordered before the pages' reuse
  if (pd_stage_) {
    pd_stage_->pages().free(pages);
  } else {
    allocator_->free(pages);
  }
  pages.clear();
}

// ---- Both ----

void Scheduler::pd_poll() {
  if (!pd_) return;
  if (pd_stage_) {
    for (const TransferOutcome& o : pd_stage_->take_outcomes()) pd_stage_outcome(o);
    pd_pump_stage();
  }
  const int64_t now = clock_->now_ms();
  pd::ChannelEvents events = pd_->channel().poll();
  if (pd_->prefill()) {
    for (const pd::PeerChange& change : events.peers) {
      if (!change.lost) continue;
      pd_->drop_destination(change.peer);
      for (const pd::EndedLease& ended : pd_->leases().on_peer_dead(change.peer)) {
        pd_abort(pd::room_value(ended.room), false, "the decode worker died or restarted");
      }
    }
    for (pd::Inbound& in : events.messages) {
      if (auto* order = std::get_if<pd::PrefillOrder>(&in.message)) {
        pd_take_order(in.peer, std::move(*order), in.received_ms);
      } else if (auto* cancel = std::get_if<pd::Cancel>(&in.message)) {
        auto ended = pd_->leases().cancel(in.peer, cancel->room);
        if (ended) {
          pd_abort(pd::room_value(cancel->room), true, "cancelled by the decode worker");
        } else if (ended.error().code == ErrorCode::kNotFound) {
          // Ended already: the answer lets the decode worker end its quarantine.
          (void)pd_->channel().send(in.peer, pd::PrefillFailed{cancel->room, "no such order"});
        }
      }
    }
    for (const pd::EndedLease& ended : pd_->leases().tick(now)) {
      // The lease ended at its deadline: the order is abandoned. (The lease is gone; the
      // order still waits for its sends before it answers.)
      pd_abort(pd::room_value(ended.room), true, "the order's deadline passed");
    }
    for (PdCompletion& c : pd_->take_completions()) {
      // The transport is done with the stage pages it read.
      if (auto sent = stage_in_send_.find({c.room, c.first_index}); sent != stage_in_send_.end()) {
        pd_stage_->pages().free(sent->second);
        stage_in_send_.erase(sent);
      }
      auto it = orders_.find(c.room);
      if (it == orders_.end()) continue;
      RemoteOrder& ro = it->second;
      --ro.outstanding;
      if (c.status) {
        const uint64_t bytes = static_cast<uint64_t>(c.n_pages) * pd_pool().page_bytes();
        ro.bytes += bytes;
        counters_.pd_pages_sent += static_cast<uint64_t>(c.n_pages);
        counters_.pd_bytes_sent += bytes;
        ro.last_keepalive_ms = now;
        (void)pd_->channel().send(
            ro.peer, pd::PagesWritten{pd::RoomId{c.room}, static_cast<uint32_t>(c.first_index),
                                      static_cast<uint32_t>(c.n_pages)});
      } else if (!ro.send_failed) {
        ro.send_failed = true;
        ro.why = "sending pages failed: " + c.status.error().message;
      }
    }
    std::vector<uint64_t> failed;
    for (const auto& [room, ro] : orders_) {
      if (ro.send_failed && ro.state == RemoteOrder::State::kComputing) failed.push_back(room);
    }
    for (uint64_t room : failed) pd_abort(room, true, orders_.at(room).why);
    for (auto& [room, ro] : orders_) {
      if (ro.state != RemoteOrder::State::kAborted && now - ro.last_keepalive_ms >= kKeepAliveMs) {
        ro.last_keepalive_ms = now;
        (void)pd_->channel().send(ro.peer, pd::PagesWritten{pd::RoomId{room}, 0, 0});
      }
    }
    pd_settle_orders();
    counters_.pd_rooms_active = static_cast<int64_t>(orders_.size());
  } else {
    for (const pd::PeerChange& change : events.peers) {
      if (!change.lost) continue;
      for (const pd::RoomEvent& ev : pd_->rooms().fail_peer(change.peer, now)) pd_room_event(ev);
    }
    for (const pd::Inbound& in : events.messages) {
      auto ev = pd_->rooms().apply(in.peer, in.message, in.received_ms);
      if (ev && *ev) pd_room_event(**ev);
    }
    for (const pd::RoomEvent& ev : pd_->rooms().tick(now)) pd_room_event(ev);
    for (PdCompletion& c : pd_->take_completions()) {
      (void)pd_->rooms().erase(pd::RoomId{c.room});
      if (pd_stage_ && c.status) {
        // Received into the stage: its pages cross to the room's device pages first.
        Seq* seq = nullptr;
        for (auto& r : remote_) {
          if (r->pd_room == c.room) seq = r.get();
        }
        if (seq == nullptr) continue;
        std::vector<PageId> device(seq->pages.begin() + seq->tree_pages, seq->pages.end());
        stage_loads_[pd_stage_->copy(TransferDirection::kHostToDevice, std::move(device),
                                     seq->pd_stage_pages)] = c.room;
        continue;
      }
      std::unique_ptr<Seq> seq = take_remote(c.room);
      if (!seq) continue;
      if (!c.status) {
        STRATA_LOG_WARN("disaggregation: receiving room {:016x} failed: {}; prefilling locally",
                        c.room, c.status.error().message);
        pd_free_stage(*seq);
        pd_fallback(std::move(seq), PdFallback::kTransfer);
        continue;
      }
      pd_deliver(std::move(seq));
    }
    // A client that went away while its prompt was being computed remotely.
    for (size_t i = 0; i < remote_.size();) {
      Seq& seq = *remote_[i];
      if (!seq.stream->cancelled() || seq.state == SeqState::kReceiving) {
        ++i;
        continue;
      }
      const pd::RoomId id{seq.pd_room};
      auto outcome = pd_->rooms().cancel(id, now);
      std::vector<PageId> pages = detach_room_pages(seq);
      if (outcome && outcome->send_cancel) {
        (void)pd_->channel().send(pd_->rooms().find(id)->peer, pd::Cancel{id});
      }
      const bool reclaimable = !outcome || outcome->reclaimable;
      std::vector<PageId> stage = std::move(seq.pd_stage_pages);
      seq.pd_stage_pages.clear();  // released with the room
      pd_release_room_pages(seq.pd_room, std::move(pages), std::move(stage), reclaimable);
      if (reclaimable) (void)pd_->rooms().erase(id);
      finish(seq, FinishReason::kCancelled);
      remote_.erase(remote_.begin() + static_cast<std::ptrdiff_t>(i));
    }
    int64_t quarantined = 0;
    for (const auto& [room, pages] : quarantine_) quarantined += static_cast<int64_t>(pages.size());
    counters_.pd_quarantined_pages = quarantined;
    counters_.pd_rooms_active = static_cast<int64_t>(pd_->rooms().size());
  }
  counters_.pd_peers_alive = static_cast<int64_t>(pd_->channel().stats().peers_alive);
}

}  // namespace strata
