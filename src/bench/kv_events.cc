#include "bench/kv_events.h"

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <iterator>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <variant>

#include "router/kv_event_wire.h"

namespace strata::bench {

namespace {

using SteadyClock = std::chrono::steady_clock;

KvEventRecord to_record(const router::KvWireEvent& ev) {
  KvEventRecord r;
  const auto wire_hashes = [&r](const std::vector<uint64_t>& hashes) {
    r.block_hashes.reserve(hashes.size());
    for (uint64_t h : hashes) r.block_hashes.push_back(static_cast<int64_t>(h));
  };
  if (const auto* st = std::get_if<router::BlockStoredEvent>(&ev)) {
    r.kind = KvEventRecord::Kind::kStored;
    wire_hashes(st->block_hashes);
    r.medium = std::string(router::tier_wire_name(st->tier));
  } else if (const auto* rm = std::get_if<router::BlockRemovedEvent>(&ev)) {
    r.kind = KvEventRecord::Kind::kRemoved;
    wire_hashes(rm->block_hashes);
    r.medium = std::string(router::tier_wire_name(rm->tier));
  } else {
    r.kind = KvEventRecord::Kind::kAllCleared;
  }
  return r;
}

}  // namespace

// The router's decoder, strict: the benchmark checks what Strata itself publishes, so a
// missing medium or an unknown event or medium is an error here (the router skips them).
Result<KvEventBatch> decode_kv_event_batch(std::string_view payload) {
  auto decoded = router::decode_kv_event_batch(payload, router::KvWireOptions{.strict = true});
  if (!decoded) return std::unexpected(decoded.error());
  KvEventBatch batch;
  batch.timestamp_s = decoded->timestamp_s;
  batch.data_parallel_rank = decoded->data_parallel_rank;
  batch.events.reserve(decoded->events.size());
  for (const router::KvWireEvent& ev : decoded->events) batch.events.push_back(to_record(ev));
  return batch;
}

struct KvEventSubscriber::Impl {
  zmq::context_t context{1};
  zmq::socket_t socket{context, zmq::socket_type::sub};
  std::atomic<bool> stopping{false};
  std::thread thread;

  mutable std::mutex mutex;
  mutable std::condition_variable changed;
  uint64_t batches = 0;                                     // GUARDED_BY(mutex)
  uint64_t gaps = 0;                                        // GUARDED_BY(mutex)
  bool have_seq = false;                                    // GUARDED_BY(mutex)
  uint64_t last_seq = 0;                                    // GUARDED_BY(mutex)
  SteadyClock::time_point last_batch = SteadyClock::now();  // GUARDED_BY(mutex)
  std::vector<int64_t> captured_order;                      // GUARDED_BY(mutex)
  std::unordered_set<int64_t> captured;                     // GUARDED_BY(mutex)
  std::string error;                                        // GUARDED_BY(mutex)

  void run() {
    while (!stopping.load()) {
      zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
      try {
        zmq::poll(&item, 1, std::chrono::milliseconds(50));
        if ((item.revents & ZMQ_POLLIN) == 0) continue;
        std::vector<zmq::message_t> parts;
        if (!zmq::recv_multipart(socket, std::back_inserter(parts), zmq::recv_flags::dontwait)) {
          continue;
        }
        handle(parts);
      } catch (const zmq::error_t& e) {
        std::lock_guard lock(mutex);
        error = std::string("ZeroMQ: ") + e.what();
      }
    }
  }

  void handle(const std::vector<zmq::message_t>& parts) {
    std::lock_guard lock(mutex);
    if (parts.size() != 3 || parts[1].size() != 8) {
      error = "a KV event message is not [topic, seq, payload]";
      return;
    }
    uint64_t seq = 0;
    const auto* p = static_cast<const unsigned char*>(parts[1].data());
    for (int i = 0; i < 8; ++i) seq = (seq << 8) | p[i];
    if (have_seq && seq > last_seq + 1) gaps += seq - last_seq - 1;
    have_seq = true;
    last_seq = seq;
    ++batches;
    last_batch = SteadyClock::now();
    auto batch = decode_kv_event_batch(
        std::string_view(static_cast<const char*>(parts[2].data()), parts[2].size()));
    if (!batch) {
      error = batch.error().message;
    } else {
      for (const KvEventRecord& ev : batch->events) apply(ev);
    }
    changed.notify_all();
  }

  void apply(const KvEventRecord& ev) {
    switch (ev.kind) {
      case KvEventRecord::Kind::kStored:
        for (int64_t h : ev.block_hashes) {
          if (captured.insert(h).second) captured_order.push_back(h);
        }
        break;
      case KvEventRecord::Kind::kRemoved:
        // A block removed from one tier may live on in another (demotion): only a removal
        // from every tier would matter, and the benchmark pins right after the warm-up,
        // before anything is evicted, so removals are not tracked per tier here.
        break;
      case KvEventRecord::Kind::kAllCleared:
        captured.clear();
        captured_order.clear();
        break;
    }
  }
};

KvEventSubscriber::KvEventSubscriber(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

KvEventSubscriber::~KvEventSubscriber() {
  impl_->stopping.store(true);
  if (impl_->thread.joinable()) impl_->thread.join();
}

Result<std::unique_ptr<KvEventSubscriber>> KvEventSubscriber::connect(const std::string& endpoint) {
  auto impl = std::make_unique<Impl>();
  try {
    impl->socket.set(zmq::sockopt::subscribe, "");
    impl->socket.set(zmq::sockopt::linger, 0);
    impl->socket.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return make_error(ErrorCode::kInvalidArgument,
                      "cannot subscribe to KV events at '" + endpoint + "': " + e.what());
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<KvEventSubscriber>(new KvEventSubscriber(std::move(impl)));
}

void KvEventSubscriber::start_capture() {
  std::lock_guard lock(impl_->mutex);
  impl_->captured.clear();
  impl_->captured_order.clear();
}

std::vector<int64_t> KvEventSubscriber::captured_blocks() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->captured_order;
}

uint64_t KvEventSubscriber::batches_received() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->batches;
}

uint64_t KvEventSubscriber::sequence_gaps() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->gaps;
}

std::string KvEventSubscriber::last_error() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->error;
}

bool KvEventSubscriber::wait_batches_above(uint64_t count, double timeout_s) const {
  std::unique_lock lock(impl_->mutex);
  return impl_->changed.wait_for(lock, std::chrono::duration<double>(timeout_s),
                                 [&] { return impl_->batches > count; });
}

bool KvEventSubscriber::wait_quiet(double quiet_s, double timeout_s) const {
  const auto deadline = SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(
                                                 std::chrono::duration<double>(timeout_s));
  const auto quiet =
      std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(quiet_s));
  std::unique_lock lock(impl_->mutex);
  for (;;) {
    const auto now = SteadyClock::now();
    if (now - impl_->last_batch >= quiet) return true;
    if (now >= deadline) return false;
    impl_->changed.wait_until(lock, std::min(deadline, impl_->last_batch + quiet));
  }
}

}  // namespace strata::bench
