#include "bench/kv_events.h"

#include <msgpack.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <iterator>
#include <mutex>
#include <thread>
#include <unordered_set>

namespace strata::bench {

namespace {

using SteadyClock = std::chrono::steady_clock;

Result<std::vector<int64_t>> decode_hashes(const msgpack::object& o) {
  if (o.type != msgpack::type::ARRAY) {
    return make_error(ErrorCode::kCorrupt, "block_hashes is not an array");
  }
  std::vector<int64_t> out;
  for (uint32_t i = 0; i < o.via.array.size; ++i) {
    const msgpack::object& h = o.via.array.ptr[i];
    if (h.type == msgpack::type::POSITIVE_INTEGER) {
      out.push_back(static_cast<int64_t>(h.via.u64));
    } else if (h.type == msgpack::type::NEGATIVE_INTEGER) {
      out.push_back(h.via.i64);
    } else {
      return make_error(ErrorCode::kCorrupt, "a block hash is not an integer");
    }
  }
  return out;
}

Result<std::string> decode_string(const msgpack::object& o, const char* what) {
  if (o.type != msgpack::type::STR) {
    return make_error(ErrorCode::kCorrupt, std::string(what) + " is not a string");
  }
  return std::string(o.via.str.ptr, o.via.str.size);
}

Result<KvEventRecord> decode_event(const msgpack::object& ev) {
  if (ev.type != msgpack::type::ARRAY || ev.via.array.size == 0) {
    return make_error(ErrorCode::kCorrupt, "an event is not a tagged array");
  }
  const msgpack::object* f = ev.via.array.ptr;
  const uint32_t n = ev.via.array.size;
  auto tag = decode_string(f[0], "the event tag");
  if (!tag) return std::unexpected(tag.error());
  KvEventRecord r;
  if (*tag == "AllBlocksCleared") {
    r.kind = KvEventRecord::Kind::kAllCleared;
    return r;
  }
  const bool stored = *tag == "BlockStored";
  if (!stored && *tag != "BlockRemoved") {
    return make_error(ErrorCode::kCorrupt, "unknown event '" + *tag + "'");
  }
  // BlockStored: tag, hashes, parent, token_ids, block_size, lora_id, medium.
  // BlockRemoved: tag, hashes, medium.
  const uint32_t medium_at = stored ? 6 : 2;
  if (n <= medium_at) {
    return make_error(ErrorCode::kCorrupt, *tag + " has " + std::to_string(n) + " fields");
  }
  auto hashes = decode_hashes(f[1]);
  if (!hashes) return std::unexpected(hashes.error());
  auto medium = decode_string(f[medium_at], "medium");
  if (!medium) return std::unexpected(medium.error());
  r.kind = stored ? KvEventRecord::Kind::kStored : KvEventRecord::Kind::kRemoved;
  r.block_hashes = std::move(*hashes);
  r.medium = std::move(*medium);
  return r;
}

}  // namespace

Result<KvEventBatch> decode_kv_event_batch(std::string_view payload) {
  try {
    msgpack::object_handle oh = msgpack::unpack(payload.data(), payload.size());
    const msgpack::object& top = oh.get();
    if (top.type != msgpack::type::ARRAY || top.via.array.size != 3) {
      return make_error(ErrorCode::kCorrupt, "the payload is not [timestamp, events, rank]");
    }
    const msgpack::object* f = top.via.array.ptr;
    KvEventBatch batch;
    if (f[0].type == msgpack::type::FLOAT64 || f[0].type == msgpack::type::FLOAT32) {
      batch.timestamp_s = f[0].via.f64;
    } else {
      return make_error(ErrorCode::kCorrupt, "the timestamp is not a float");
    }
    if (f[1].type != msgpack::type::ARRAY) {
      return make_error(ErrorCode::kCorrupt, "the events are not an array");
    }
    for (uint32_t i = 0; i < f[1].via.array.size; ++i) {
      auto ev = decode_event(f[1].via.array.ptr[i]);
      if (!ev) return std::unexpected(ev.error());
      batch.events.push_back(std::move(*ev));
    }
    if (f[2].type == msgpack::type::POSITIVE_INTEGER) {
      batch.data_parallel_rank = static_cast<int64_t>(f[2].via.u64);
    } else if (f[2].type == msgpack::type::NEGATIVE_INTEGER) {
      batch.data_parallel_rank = f[2].via.i64;
    }
    return batch;
  } catch (const std::exception& e) {
    return make_error(ErrorCode::kCorrupt, std::string("undecodable msgpack: ") + e.what());
  }
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
