#include "router/event_subscriber.h"

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "common/clock.h"

namespace strata::router {
namespace {

constexpr uint64_t kEndMarker = ~uint64_t{0};  // -1 as 8 bytes: the replay's end

std::string be64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (56 - 8 * i)) & 0xff);
  return s;
}

uint64_t read_be64(const zmq::message_t& m) {
  const auto* p = static_cast<const unsigned char*>(m.data());
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

int64_t now_ms() {
  return SteadyClock::instance().now_ms();
}

}  // namespace

Status validate(const EventSubscriberOptions& options) {
  const auto bad = [](std::string what) {
    return make_error(ErrorCode::kInvalidArgument, "KV event subscriber: " + std::move(what));
  };
  if (options.endpoint.empty()) return bad("endpoint is empty");
  if (options.replay_timeout_ms < 1 || options.replay_timeout_ms > 600000) {
    return bad("replay_timeout_ms must be 1 to 600000");
  }
  if (options.poll_interval_ms < 1 || options.poll_interval_ms > 100) {
    return bad("poll_interval_ms must be 1 to 100");
  }
  if (options.max_buffered_batches < 1) return bad("max_buffered_batches must be at least 1");
  if (options.published_grace_ms < 0 || options.published_grace_ms > 600000) {
    return bad("published_grace_ms must be 0 to 600000");
  }
  return {};
}

struct EventSubscriber::Impl {
  WorkerId worker = 0;
  PrefixIndex* index = nullptr;
  EventSubscriberOptions options;
  StaleCallback on_stale;

  zmq::context_t context{1};
  zmq::socket_t sub{context, zmq::socket_type::sub};
  std::optional<zmq::socket_t> dealer;  // created on the first replay, reset after a failure
  std::atomic<bool> stopping{false};
  std::thread thread;

  // Thread-owned sequence state.
  int64_t last_seq = -1;  // last applied; -1: none yet
  // Set by a snapshot (resync): last_seq is the snapshot's, and a live batch at or below it
  // is one the snapshot already holds (still in flight), not a restart, until a live batch
  // after it arrives.
  bool synced = false;
  bool from_snapshot = false;
  int64_t gap_since_ms = 0;  // when the worker's count first ran ahead of last_seq; 0: not
  int64_t given_up_at = -1;  // a worker's count whose replay failed

  // From other threads: a snapshot's next sequence number (-1: none pending), and the
  // worker's own count of batches published (-1: unknown).
  std::atomic<int64_t> resync_next{-1}, published_hint{-1};
  std::atomic<bool> forget_pending{false};  // the owner saw the worker restart

  // Counters (stats() reads them from any thread).
  std::atomic<uint64_t> batches{0}, events{0}, gaps{0}, missing{0}, replays_ok{0},
      replays_failed{0}, decode_errors{0}, restarts{0}, skipped_events{0};
  std::atomic<int64_t> last_seq_seen{-1}, last_batch_ms{0};
  mutable std::mutex error_mutex;
  std::string last_error;  // GUARDED_BY(error_mutex)

  void set_error(std::string e) {
    std::lock_guard lock(error_mutex);
    last_error = std::move(e);
  }

  void run() {
    while (!stopping.load(std::memory_order_relaxed)) {
      try {
        check_resync();
        check_published();
        zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
        zmq::poll(&item, 1, std::chrono::milliseconds(options.poll_interval_ms));
        if ((item.revents & ZMQ_POLLIN) == 0) continue;
        std::vector<zmq::message_t> parts;
        if (!zmq::recv_multipart(sub, std::back_inserter(parts), zmq::recv_flags::dontwait)) {
          continue;
        }
        auto seq = parse_live(parts);
        if (seq) on_live(*seq, parts[2].to_string());
      } catch (const zmq::error_t& e) {
        set_error(std::string("ZeroMQ: ") + e.what());
      }
    }
    dealer.reset();
    sub.close();
  }

  // The sequence number of a live message, or nullopt (counted) if it is malformed.
  std::optional<uint64_t> parse_live(const std::vector<zmq::message_t>& parts) {
    if (parts.size() != 3 || parts[1].size() != 8) {
      ++decode_errors;
      set_error("a KV event message is not [topic, seq, payload] (" + std::to_string(parts.size()) +
                " frames)");
      return std::nullopt;
    }
    return read_be64(parts[1]);
  }

  // A snapshot was installed in the index: it holds every batch before `next`. Batches the
  // thread applied after it (the install wiped them) and any it has not received yet are
  // replayed from `next`.
  void check_resync() {
    if (forget_pending.exchange(false)) {
      last_seq = -1;  // another process: its sequence starts again
      last_seq_seen.store(-1);
      synced = from_snapshot = false;
      given_up_at = -1;
      gap_since_ms = 0;
    }
    const int64_t next = resync_next.exchange(-1);
    if (next < 0) return;
    const int64_t known = last_seq;  // the worker's count is check_published's to act on
    last_seq = next - 1;
    last_seq_seen.store(last_seq);
    synced = true;
    from_snapshot = true;
    gap_since_ms = 0;
    if (known > last_seq) repair(last_seq + 1, known + 1, {});
  }

  // The worker says it published batches this thread never received (lost before the
  // subscription took effect, or past the high-water mark, with no later batch to show the
  // gap): after a grace for batches still in flight, replay them.
  void check_published() {
    const int64_t published = published_hint.load();
    if ((last_seq < 0 && !synced) || published <= last_seq + 1 || published == given_up_at) {
      gap_since_ms = 0;
      return;
    }
    const int64_t now = now_ms();
    if (gap_since_ms == 0) {
      gap_since_ms = now;
      return;
    }
    if (now - gap_since_ms < options.published_grace_ms) return;
    gap_since_ms = 0;
    ++gaps;
    missing += static_cast<uint64_t>(published - last_seq - 1);
    // A count the replay cannot reach (the worker's ring lost the range) is not tried again
    // until it changes: the index is stale meanwhile and the owner rebuilds it.
    if (!repair(last_seq + 1, published, {})) given_up_at = published;
  }

  void on_live(uint64_t seq, std::string payload) {
    const auto s = static_cast<int64_t>(seq);
    if (from_snapshot) {
      if (s <= last_seq) return;  // the snapshot holds it
      from_snapshot = false;
    }
    if (last_seq < 0 && !synced) {
      if (s > 0 && options.replay_on_join && !options.replay_endpoint.empty()) {
        repair(0, s, held_one(s, std::move(payload)));
      } else {
        apply(s, payload);
      }
      return;
    }
    if (s == last_seq + 1) {
      apply(s, payload);
    } else if (s <= last_seq) {
      ++restarts;
      const std::string why = "worker restarted: sequence went from " + std::to_string(last_seq) +
                              " to " + std::to_string(s);
      index->reset_worker(worker);  // another process: its pins and predictions go too
      last_seq = -1;
      synced = false;
      go_stale(why, /*always=*/true);
      if (s > 0 && !options.replay_endpoint.empty()) {
        repair(0, s, held_one(s, std::move(payload)));
      } else {
        apply(s, payload);
      }
    } else {
      ++gaps;
      missing += static_cast<uint64_t>(s - last_seq - 1);
      repair(last_seq + 1, s, held_one(s, std::move(payload)));
    }
  }

  static std::map<int64_t, std::string> held_one(int64_t seq, std::string payload) {
    std::map<int64_t, std::string> held;
    held.emplace(seq, std::move(payload));
    return held;
  }

  // Fills [from, target) from the replay socket, then applies the held live batches (the
  // one that showed the gap, and every batch that arrived on SUB meanwhile), in order,
  // each once. `held` may be empty (a gap the worker's count showed, a snapshot's resync).
  // True when the range was filled.
  bool repair(int64_t from, int64_t target, std::map<int64_t, std::string> held) {
    std::string failure;
    const std::string range = std::to_string(from) + ".." + std::to_string(target - 1);
    // A replay may end before batches that SUB dropped meanwhile (its high-water mark):
    // then ask again from there, a few times.
    for (int round = 0; round < 3; ++round) {
      if (!replay(from, range, &held, &failure)) break;
      drain(&held);
      if (held.empty() && last_seq + 1 >= target) {
        ++replays_ok;
        return true;
      }
      from = last_seq + 1;
      failure = "the replay ended at " + std::to_string(last_seq) + ", before " +
                std::to_string(held.empty() ? target : held.begin()->first);
    }
    if (stopping.load()) return false;
    ++replays_failed;
    dealer.reset();  // a late answer must not be read as the next replay's
    set_error(failure);
    go_stale(failure, /*always=*/false);
    // The index is stale now; keep it as close as it gets: apply what was held.
    for (auto& [s, p] : held) {
      if (s > last_seq) apply(s, p);
    }
    return false;
  }

  // Applies held batches that continue the sequence; drops those already applied.
  void drain(std::map<int64_t, std::string>* held) {
    while (!held->empty()) {
      auto it = held->begin();
      if (it->first <= last_seq) {
        held->erase(it);
      } else if (it->first == last_seq + 1) {
        apply(it->first, it->second);
        held->erase(it);
      } else {
        return;
      }
    }
  }

  // One replay request from `from`: applies the replayed batches in order until the end
  // marker, holding back live ones. False (with *failure) on a timeout, a missing range,
  // a full hold-back buffer, or stop().
  bool replay(int64_t from, const std::string& range, std::map<int64_t, std::string>* held,
              std::string* failure) {
    if (options.replay_endpoint.empty()) {
      *failure = "gap " + range + " and no replay endpoint";
      return false;
    }
    try {
      if (!dealer) {
        dealer.emplace(context, zmq::socket_type::dealer);
        dealer->set(zmq::sockopt::linger, 0);
        dealer->connect(options.replay_endpoint);
      }
      if (!dealer->send(zmq::message_t(), zmq::send_flags::sndmore | zmq::send_flags::dontwait) ||
          !dealer->send(zmq::buffer(be64(static_cast<uint64_t>(from))),
                        zmq::send_flags::dontwait)) {
        *failure = "replay request " + range + " could not be sent";
        return false;
      }
      const int64_t deadline = now_ms() + options.replay_timeout_ms;
      for (;;) {
        if (stopping.load(std::memory_order_relaxed)) {
          *failure = "stopped";
          return false;
        }
        const int64_t left = deadline - now_ms();
        if (left <= 0) {
          *failure = "replay of " + range + " timed out";
          return false;
        }
        zmq::pollitem_t items[2] = {{dealer->handle(), 0, ZMQ_POLLIN, 0},
                                    {sub.handle(), 0, ZMQ_POLLIN, 0}};
        zmq::poll(items, 2,
                  std::chrono::milliseconds(std::min<int64_t>(left, options.poll_interval_ms)));
        if ((items[1].revents & ZMQ_POLLIN) != 0) {
          std::vector<zmq::message_t> parts;
          if (zmq::recv_multipart(sub, std::back_inserter(parts), zmq::recv_flags::dontwait)) {
            if (auto s = parse_live(parts)) {
              held->emplace(static_cast<int64_t>(*s), parts[2].to_string());
              if (held->size() > options.max_buffered_batches) {
                *failure = "more than " + std::to_string(options.max_buffered_batches) +
                           " batches arrived during the replay of " + range;
                return false;
              }
            }
          }
        }
        if ((items[0].revents & ZMQ_POLLIN) == 0) continue;
        std::vector<zmq::message_t> parts;
        if (!zmq::recv_multipart(*dealer, std::back_inserter(parts), zmq::recv_flags::dontwait)) {
          continue;
        }
        if (parts.size() != 3 || parts[1].size() != 8) {
          *failure = "malformed replay answer (" + std::to_string(parts.size()) + " frames)";
          return false;
        }
        const uint64_t s = read_be64(parts[1]);
        if (s == kEndMarker) return true;
        const auto seq = static_cast<int64_t>(s);
        if (seq <= last_seq) continue;  // already applied
        if (seq != last_seq + 1) {
          *failure = "the replay ring no longer holds " + std::to_string(last_seq + 1) + ".." +
                     std::to_string(seq - 1);
          return false;
        }
        apply(seq, parts[2].to_string());
      }
    } catch (const zmq::error_t& e) {
      *failure = std::string("replay of ") + range + ": ZeroMQ: " + e.what();
      return false;
    }
  }

  void apply(int64_t seq, const std::string& payload) {
    last_seq = seq;
    last_seq_seen.store(seq);
    last_batch_ms.store(now_ms());
    auto batch = decode_kv_event_batch(payload);
    if (!batch) {
      ++decode_errors;
      const std::string why =
          "undecodable KV event batch " + std::to_string(seq) + ": " + batch.error().message;
      set_error(why);
      go_stale(why, /*always=*/false);
      return;
    }
    index->apply(worker, *batch);
    ++batches;
    events += batch->events.size();
    skipped_events += batch->skipped_events;
  }

  void go_stale(const std::string& reason, bool always) {
    const bool was_stale = index->is_stale(worker);
    index->mark_stale(worker, true);
    if ((always || !was_stale) && on_stale) on_stale(worker, reason);
  }
};

EventSubscriber::EventSubscriber(WorkerId worker, std::unique_ptr<Impl> impl)
    : worker_(worker), impl_(std::move(impl)) {}

EventSubscriber::~EventSubscriber() {
  stop();
}

Result<std::unique_ptr<EventSubscriber>> EventSubscriber::start(WorkerId worker, PrefixIndex* index,
                                                                EventSubscriberOptions options,
                                                                StaleCallback on_stale) {
  if (auto s = validate(options); !s) return std::unexpected(s.error());
  if (index == nullptr) return make_error(ErrorCode::kInvalidArgument, "no index");
  auto impl = std::make_unique<Impl>();
  impl->worker = worker;
  impl->index = index;
  impl->options = std::move(options);
  impl->on_stale = std::move(on_stale);
  try {
    impl->sub.set(zmq::sockopt::linger, 0);
    impl->sub.set(zmq::sockopt::rcvhwm, 100000);
    impl->sub.set(zmq::sockopt::subscribe, impl->options.topic);
    impl->sub.connect(impl->options.endpoint);
  } catch (const zmq::error_t& e) {
    return make_error(ErrorCode::kInvalidArgument, "cannot subscribe to KV events at '" +
                                                       impl->options.endpoint + "': " + e.what());
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<EventSubscriber>(new EventSubscriber(worker, std::move(impl)));
}

void EventSubscriber::stop() {
  impl_->stopping.store(true);
  if (impl_->thread.joinable()) impl_->thread.join();
}

void EventSubscriber::resync(uint64_t next_seq) {
  impl_->resync_next.store(static_cast<int64_t>(next_seq));
}

void EventSubscriber::restarted() {
  impl_->published_hint.store(-1);
  impl_->forget_pending.store(true);
}

void EventSubscriber::note_published(uint64_t published) {
  impl_->published_hint.store(static_cast<int64_t>(published));
}

EventSubscriberStats EventSubscriber::stats() const {
  EventSubscriberStats s;
  s.batches = impl_->batches.load();
  s.events = impl_->events.load();
  s.gaps = impl_->gaps.load();
  s.missing_batches = impl_->missing.load();
  s.replays_ok = impl_->replays_ok.load();
  s.replays_failed = impl_->replays_failed.load();
  s.decode_errors = impl_->decode_errors.load();
  s.restarts = impl_->restarts.load();
  s.skipped_events = impl_->skipped_events.load();
  s.last_seq = impl_->last_seq_seen.load();
  s.last_batch_ms = impl_->last_batch_ms.load();
  std::lock_guard lock(impl_->error_mutex);
  s.last_error = impl_->last_error;
  return s;
}

}  // namespace strata::router
