#include "server/cache_events_stream.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>
#include <utility>

#include <nlohmann/json.hpp>

namespace strata {
namespace {

// The JSON is written by hand: it runs on the scheduler thread for every batch while a
// subscriber listens, and is only integers, nulls and fixed names.
class JsonOut {
 public:
  void raw(std::string_view s) { out_.append(s); }
  void integer(int64_t v) {
    char buf[24];
    const auto r = std::to_chars(buf, buf + sizeof buf, v);
    out_.append(buf, r.ptr);
  }
  void hashes(const std::vector<BlockHash>& hs) {
    out_.push_back('[');
    for (size_t i = 0; i < hs.size(); ++i) {
      if (i > 0) out_.push_back(',');
      integer(block_hash_to_wire(hs[i]));
    }
    out_.push_back(']');
  }
  void medium(Medium m) {
    out_.append("\"medium\":\"");
    out_.append(medium_wire_name(m));
    out_.push_back('"');
  }
  std::string take() && { return std::move(out_); }

 private:
  std::string out_;
};

}  // namespace

Status validate(const CacheEventsOptions& o) {
  if (o.max_subscribers < 1 || o.max_queued_bytes < 1 || o.max_queued_batches < 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      "cache events: max_subscribers, max_queued_bytes and max_queued_batches "
                      "must be >= 1");
  }
  return {};
}

std::string encode_cache_events_json(uint64_t seq, double timestamp_s,
                                     const std::vector<KvEvent>& events) {
  JsonOut j;
  j.raw("{\"seq\":");
  j.integer(static_cast<int64_t>(seq));
  char ts[32];
  std::snprintf(ts, sizeof ts, "%.6f", timestamp_s);
  j.raw(",\"ts\":");
  j.raw(ts);
  j.raw(",\"events\":[");
  for (size_t i = 0; i < events.size(); ++i) {
    if (i > 0) j.raw(",");
    if (const auto* st = std::get_if<BlockStored>(&events[i])) {
      j.raw("{\"type\":\"BlockStored\",\"block_hashes\":");
      j.hashes(st->block_hashes);
      j.raw(",\"parent_block_hash\":");
      if (st->parent_block_hash) {
        j.integer(block_hash_to_wire(*st->parent_block_hash));
      } else {
        j.raw("null");
      }
      j.raw(",\"token_ids\":[");
      for (size_t k = 0; k < st->token_ids.size(); ++k) {
        if (k > 0) j.raw(",");
        j.integer(st->token_ids[k]);
      }
      j.raw("],\"block_size\":");
      j.integer(st->block_size);
      j.raw(",\"lora_id\":");
      if (st->lora_id) {
        j.integer(*st->lora_id);
      } else {
        j.raw("null");
      }
      j.raw(",");
      j.medium(st->medium);
      if (!st->first_block_salt.empty() && !st->block_hashes.empty()) {
        // vLLM's extra_keys, one entry per block: the salt on a sequence's first block.
        j.raw(",\"extra_keys\":[[");
        j.raw(nlohmann::json(st->first_block_salt)
                  .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
        j.raw("]");
        for (size_t k = 1; k < st->block_hashes.size(); ++k) j.raw(",null");
        j.raw("]");
      }
      j.raw("}");
    } else if (const auto* rm = std::get_if<BlockRemoved>(&events[i])) {
      j.raw("{\"type\":\"BlockRemoved\",\"block_hashes\":");
      j.hashes(rm->block_hashes);
      j.raw(",");
      j.medium(rm->medium);
      j.raw("}");
    } else {
      j.raw("{\"type\":\"AllBlocksCleared\"}");
    }
  }
  j.raw("]}");
  return std::move(j).take();
}

// One subscriber's queue. Guarded by Impl::mutex.
struct CacheEventsStream::Subscription::State {
  std::function<void()> wake;
  std::deque<std::pair<uint64_t, std::shared_ptr<const std::string>>> queue;  // seq, frame
  int64_t queued_bytes = 0;
  bool overflow = false;
  uint64_t lost_seq = 0;
};

struct CacheEventsStream::Impl {
  using State = Subscription::State;

  CacheEventsOptions options;
  mutable std::mutex mutex;
  std::vector<std::shared_ptr<State>> subscribers;  // GUARDED_BY(mutex): listening now
  uint64_t next_seq = 0;                            // GUARDED_BY(mutex)
  bool closed = false;                              // GUARDED_BY(mutex)
  std::atomic<uint64_t> dropped{0};

  void remove(const State* s) {  // caller holds mutex
    std::erase_if(subscribers, [s](const std::shared_ptr<State>& p) { return p.get() == s; });
  }
};

CacheEventsStream::CacheEventsStream(CacheEventsOptions options) : impl_(std::make_shared<Impl>()) {
  impl_->options = options;
}

CacheEventsStream::~CacheEventsStream() {
  close();
}

void CacheEventsStream::publish(const std::vector<KvEvent>& events) {
  if (events.empty()) return;
  uint64_t seq = 0;
  {
    std::lock_guard lock(impl_->mutex);
    // After close() the streams only drain what they have, so that they end.
    if (impl_->subscribers.empty() || impl_->closed) {
      ++impl_->next_seq;
      return;
    }
    seq = impl_->next_seq;
  }
  // Encoded outside the lock: publish() has one caller at a time, so `seq` stays this
  // batch's, and a subscriber that joins meanwhile starts at it and gets it below.
  const double ts =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  auto frame = std::make_shared<const std::string>(
      "data: " + encode_cache_events_json(seq, ts, events) + "\n\n");
  const auto size = static_cast<int64_t>(frame->size());
  std::lock_guard lock(impl_->mutex);
  ++impl_->next_seq;
  const CacheEventsOptions& o = impl_->options;
  for (size_t i = 0; i < impl_->subscribers.size();) {
    Subscription::State& s = *impl_->subscribers[i];
    if (s.queued_bytes + size > o.max_queued_bytes ||
        static_cast<int64_t>(s.queue.size()) + 1 > o.max_queued_batches) {
      // Fallen behind: drop it rather than wait for it or buffer on. Its client resyncs
      // from /cache/state.
      s.overflow = true;
      s.lost_seq = s.queue.empty() ? seq : s.queue.front().first;
      s.queue.clear();
      s.queued_bytes = 0;
      impl_->dropped.fetch_add(1, std::memory_order_relaxed);
      if (s.wake) s.wake();
      impl_->subscribers.erase(impl_->subscribers.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    s.queue.emplace_back(seq, frame);
    s.queued_bytes += size;
    if (s.wake) s.wake();
    ++i;
  }
}

Result<std::unique_ptr<CacheEventsStream::Subscription>> CacheEventsStream::subscribe(
    std::function<void()> wake) {
  auto state = std::make_shared<Subscription::State>();
  state->wake = std::move(wake);
  std::lock_guard lock(impl_->mutex);
  if (impl_->closed) {
    return make_error(ErrorCode::kFailedPrecondition, "the server is stopping");
  }
  if (static_cast<int64_t>(impl_->subscribers.size()) >= impl_->options.max_subscribers) {
    return make_error(ErrorCode::kResourceExhausted,
                      std::to_string(impl_->options.max_subscribers) +
                          " clients already follow /cache/events (the most at once): close one, "
                          "or poll /cache/state");
  }
  impl_->subscribers.push_back(state);
  return std::unique_ptr<Subscription>(new Subscription(impl_, std::move(state), impl_->next_seq));
}

void CacheEventsStream::close() {
  std::lock_guard lock(impl_->mutex);
  if (impl_->closed) return;
  impl_->closed = true;
  for (const auto& s : impl_->subscribers) {
    if (s->wake) s->wake();
  }
}

int64_t CacheEventsStream::subscribers() const {
  std::lock_guard lock(impl_->mutex);
  return static_cast<int64_t>(impl_->subscribers.size());
}

uint64_t CacheEventsStream::dropped_subscribers() const {
  return impl_->dropped.load(std::memory_order_relaxed);
}

uint64_t CacheEventsStream::next_seq() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->next_seq;
}

CacheEventsStream::Subscription::~Subscription() {
  std::lock_guard lock(hub_->mutex);
  hub_->remove(state_.get());
  state_->wake = nullptr;
}

CacheEventsStream::Subscription::Taken CacheEventsStream::Subscription::take(size_t max_bytes) {
  Taken t;
  std::lock_guard lock(hub_->mutex);
  State& s = *state_;
  if (s.overflow) {
    t.overflow = true;
    t.lost_seq = s.lost_seq;
    return t;
  }
  while (!s.queue.empty() && t.frames.size() < max_bytes) {
    const std::string& frame = *s.queue.front().second;
    t.frames += frame;
    s.queued_bytes -= static_cast<int64_t>(frame.size());
    s.queue.pop_front();
  }
  t.closed = hub_->closed && s.queue.empty();
  return t;
}

}  // namespace strata
