#include "bench/kv_events.h"

#include <msgpuck.h>
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

// msgpuck's mp_decode_* and mp_next read without bounds checks. decode_kv_event_batch()
// therefore first walks the whole payload with skip_checked(); everything after that
// reads inside a buffer known to hold well-formed msgpack, checking only types.

std::unexpected<Error> corrupt(std::string message) {
  return make_error(ErrorCode::kCorrupt, std::move(message));
}

// Moves *cur past one msgpack object, never reading at or past `end`; false when the
// bytes there are not one complete object. Like mp_check, but msgpuck 1.0.3's mp_check
// counts the items still to read in an int, so a forged array32/map32 header (e.g.
// dd ff ff ff ff) wraps the count and a truncated buffer passes. Here the count is 64-bit
// and may not exceed the bytes left (every item takes at least one), and the reserved
// byte 0xc1, which mp_check takes for a one-byte item, is refused.
bool skip_checked(const char** cur, const char* end) {
  uint64_t pending = 1;
  while (pending > 0) {
    if (*cur >= end || static_cast<uint64_t>(end - *cur) < pending) return false;
    --pending;
    if (static_cast<uint8_t>(**cur) == 0xc1) return false;
    switch (mp_typeof(**cur)) {
      case MP_ARRAY:
        if (mp_check_array(*cur, end) > 0) return false;
        pending += mp_decode_array(cur);
        break;
      case MP_MAP:
        if (mp_check_map(*cur, end) > 0) return false;
        pending += 2 * uint64_t{mp_decode_map(cur)};
        break;
      default:
        // A scalar: mp_check reads exactly this one item, so its counter cannot wrap.
        if (mp_check(cur, end) != 0) return false;
        break;
    }
  }
  return true;
}

// The readers below require *cur inside a payload that skip_checked() accepted. On
// success they move *cur past the object read; on failure they leave it.

// Any msgpack integer as int64: uints above INT64_MAX wrap, as block hashes do on the wire.
bool read_int(const char** cur, int64_t* out) {
  switch (mp_typeof(**cur)) {
    case MP_UINT:
      *out = static_cast<int64_t>(mp_decode_uint(cur));
      return true;
    case MP_INT:
      *out = mp_decode_int(cur);
      return true;
    default:
      return false;
  }
}

Result<std::string> read_string(const char** cur, const char* what) {
  if (mp_typeof(**cur) != MP_STR) return corrupt(std::string(what) + " is not a string");
  uint32_t len = 0;
  const char* data = mp_decode_str(cur, &len);
  return std::string(data, len);
}

Result<std::vector<int64_t>> read_hashes(const char** cur) {
  if (mp_typeof(**cur) != MP_ARRAY) return corrupt("block_hashes is not an array");
  const char* p = *cur;
  const uint32_t n = mp_decode_array(&p);
  std::vector<int64_t> out(n);  // n <= payload size: skip_checked() bounded it
  for (int64_t& h : out) {
    if (!read_int(&p, &h)) return corrupt("a block hash is not an integer");
  }
  *cur = p;
  return out;
}

Result<KvEventRecord> read_event(const char** cur) {
  if (mp_typeof(**cur) != MP_ARRAY) return corrupt("an event is not a tagged array");
  // Fields after those read here (vLLM may add some) are skipped with the event.
  const char* event_end = *cur;
  mp_next(&event_end);
  const char* p = *cur;
  const uint32_t n = mp_decode_array(&p);
  if (n == 0) return corrupt("an event is not a tagged array");
  auto tag = read_string(&p, "the event tag");
  if (!tag) return std::unexpected(tag.error());
  KvEventRecord r;
  if (*tag == "AllBlocksCleared") {
    r.kind = KvEventRecord::Kind::kAllCleared;
    *cur = event_end;
    return r;
  }
  const bool stored = *tag == "BlockStored";
  if (!stored && *tag != "BlockRemoved") return corrupt("unknown event '" + *tag + "'");
  // BlockStored: tag, hashes, parent, token_ids, block_size, lora_id, medium.
  // BlockRemoved: tag, hashes, medium.
  const uint32_t medium_at = stored ? 6 : 2;
  if (n <= medium_at) return corrupt(*tag + " has " + std::to_string(n) + " fields");
  auto hashes = read_hashes(&p);
  if (!hashes) return std::unexpected(hashes.error());
  for (uint32_t field = 2; field < medium_at; ++field) mp_next(&p);
  auto medium = read_string(&p, "medium");
  if (!medium) return std::unexpected(medium.error());
  r.kind = stored ? KvEventRecord::Kind::kStored : KvEventRecord::Kind::kRemoved;
  r.block_hashes = std::move(*hashes);
  r.medium = std::move(*medium);
  *cur = event_end;
  return r;
}

}  // namespace

Result<KvEventBatch> decode_kv_event_batch(std::string_view payload) {
  const char* cur = payload.data();
  const char* const end = cur + payload.size();
  const char* object_end = cur;
  if (!skip_checked(&object_end, end)) {
    return corrupt("undecodable msgpack: truncated or malformed");
  }
  if (object_end != end) {
    return corrupt("undecodable msgpack: " + std::to_string(end - object_end) +
                   " bytes after the payload");
  }
  if (mp_typeof(*cur) != MP_ARRAY || mp_decode_array(&cur) != 3) {
    return corrupt("the payload is not [timestamp, events, rank]");
  }
  KvEventBatch batch;
  switch (mp_typeof(*cur)) {
    case MP_DOUBLE:
      batch.timestamp_s = mp_decode_double(&cur);
      break;
    case MP_FLOAT:
      batch.timestamp_s = mp_decode_float(&cur);
      break;
    default:
      return corrupt("the timestamp is not a float");
  }
  if (mp_typeof(*cur) != MP_ARRAY) return corrupt("the events are not an array");
  const uint32_t num_events = mp_decode_array(&cur);
  batch.events.reserve(num_events);  // num_events <= payload size: skip_checked() bounded it
  for (uint32_t i = 0; i < num_events; ++i) {
    auto ev = read_event(&cur);
    if (!ev) return std::unexpected(ev.error());
    batch.events.push_back(std::move(*ev));
  }
  // vLLM sends nil when data parallelism is off; anything but an integer reads as rank 0.
  int64_t rank = 0;
  if (read_int(&cur, &rank)) batch.data_parallel_rank = rank;
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
