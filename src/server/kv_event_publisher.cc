#include "server/kv_event_publisher.h"

#include <msgpuck.h>
#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string_view>
#include <utility>

#include "common/log.h"
#include "common/msgpack_writer.h"

namespace strata {
namespace {

void put_be64(std::string& out, uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8)
    out.push_back(static_cast<char>((v >> shift) & 0xff));
}

std::string be64(uint64_t v) {
  std::string s;
  put_be64(s, v);
  return s;
}

uint64_t read_be64(const void* data) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

void write_hashes(MsgpackWriter& w, const std::vector<BlockHash>& hashes) {
  w.array(static_cast<uint32_t>(hashes.size()));
  for (BlockHash h : hashes) w.integer(block_hash_to_wire(h));
}

}  // namespace

std::string encode_kv_event_batch(double timestamp_s, const std::vector<KvEvent>& events,
                                  int32_t data_parallel_rank) {
  MsgpackWriter w;
  w.array(3);
  w.float64(timestamp_s);
  w.array(static_cast<uint32_t>(events.size()));
  for (const KvEvent& ev : events) {
    if (const auto* st = std::get_if<BlockStored>(&ev)) {
      // vLLM's BlockStored, field by field (msgspec array_like with omit_defaults: the
      // trailing fields that hold their defaults are left out, as vLLM leaves them):
      // block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
      // then extra_keys (one entry per block) only when a block has some.
      const bool salted = !st->first_block_salt.empty() && !st->block_hashes.empty();
      w.array(salted ? 9 : 8);
      w.str("BlockStored");
      write_hashes(w, st->block_hashes);
      if (st->parent_block_hash) {
        w.integer(block_hash_to_wire(*st->parent_block_hash));
      } else {
        w.nil();
      }
      w.array(static_cast<uint32_t>(st->token_ids.size()));
      for (TokenId t : st->token_ids) w.integer(t);
      w.integer(st->block_size);
      if (st->lora_id) {
        w.integer(*st->lora_id);
      } else {
        w.nil();
      }
      w.str(medium_wire_name(st->medium));
      w.nil();  // lora_name: Strata serves no adapters
      if (salted) {
        // vLLM's extra_keys of a salted request: (cache_salt,) on its first block, None after.
        w.array(static_cast<uint32_t>(st->block_hashes.size()));
        w.array(1);
        w.str(st->first_block_salt);
        for (size_t i = 1; i < st->block_hashes.size(); ++i) w.nil();
      }
    } else if (const auto* rm = std::get_if<BlockRemoved>(&ev)) {
      w.array(3);
      w.str("BlockRemoved");
      write_hashes(w, rm->block_hashes);
      w.str(medium_wire_name(rm->medium));
    } else {
      w.array(1);
      w.str("AllBlocksCleared");
    }
  }
  w.integer(data_parallel_rank);
  return std::move(w).take();
}

struct KvEventPublisher::Impl {
  KvEventPublisherOptions options;
  zmq::context_t context{1};
  zmq::socket_t pub{context, zmq::socket_type::pub};
  zmq::socket_t replay{context, zmq::socket_type::router};
  bool has_replay = false;
  std::mutex mutex;
  std::condition_variable wake;
  std::deque<std::vector<KvEvent>> queue;             // GUARDED_BY(mutex)
  bool stopping = false;                              // GUARDED_BY(mutex)
  std::deque<std::pair<uint64_t, std::string>> ring;  // publisher thread only
  std::atomic<uint64_t> next_seq{0};
  std::thread thread;

  void run() {
    for (;;) {
      std::deque<std::vector<KvEvent>> batch;
      bool stop = false;
      {
        std::unique_lock lock(mutex);
        // Wake at least every 10 ms to serve replay requests.
        wake.wait_for(lock, std::chrono::milliseconds(10),
                      [&] { return stopping || !queue.empty(); });
        batch.swap(queue);
        stop = stopping;
      }
      for (auto& events : batch) send(events);
      if (has_replay) serve_replay();
      if (stop) return;
    }
  }

  void send(const std::vector<KvEvent>& events) {
    const double ts =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    std::string payload = encode_kv_event_batch(ts, events, options.data_parallel_rank);
    const uint64_t seq = next_seq.load(std::memory_order_relaxed);
    try {
      pub.send(zmq::buffer(options.topic), zmq::send_flags::sndmore);
      pub.send(zmq::buffer(be64(seq)), zmq::send_flags::sndmore);
      pub.send(zmq::buffer(payload), zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      STRATA_LOG_ERROR("kv events: send of batch {} failed: {}", seq, e.what());
    }
    ring.emplace_back(seq, std::move(payload));
    while (ring.size() > options.replay_buffer_batches) ring.pop_front();
    next_seq.store(seq + 1, std::memory_order_relaxed);
  }

  void serve_replay() {
    for (;;) {
      std::vector<zmq::message_t> frames;
      try {
        zmq::message_t msg;
        if (!replay.recv(msg, zmq::recv_flags::dontwait)) return;
        frames.push_back(std::move(msg));
        while (frames.back().more()) {
          zmq::message_t part;
          (void)replay.recv(part, zmq::recv_flags::none);
          frames.push_back(std::move(part));
        }
      } catch (const zmq::error_t& e) {
        STRATA_LOG_WARN("kv events: replay receive failed: {}", e.what());
        return;
      }
      if (frames.size() != 3 || frames[1].size() != 0 || frames[2].size() != 8) {
        STRATA_LOG_WARN("kv events: malformed replay request ({} frames)", frames.size());
        continue;
      }
      const uint64_t start = read_be64(frames[2].data());
      const std::string id = frames[0].to_string();
      try {
        for (const auto& [seq, payload] : ring) {
          if (seq < start) continue;
          replay.send(zmq::buffer(id), zmq::send_flags::sndmore);
          replay.send(zmq::message_t(), zmq::send_flags::sndmore);
          replay.send(zmq::buffer(be64(seq)), zmq::send_flags::sndmore);
          replay.send(zmq::buffer(payload), zmq::send_flags::none);
        }
        replay.send(zmq::buffer(id), zmq::send_flags::sndmore);
        replay.send(zmq::message_t(), zmq::send_flags::sndmore);
        replay.send(zmq::buffer(be64(~0ULL)), zmq::send_flags::sndmore);  // -1: end
        replay.send(zmq::message_t(), zmq::send_flags::none);
      } catch (const zmq::error_t& e) {
        STRATA_LOG_WARN("kv events: replay answer failed: {}", e.what());
      }
    }
  }
};

Result<std::unique_ptr<KvEventPublisher>> KvEventPublisher::start(KvEventPublisherOptions options) {
  if (options.replay_buffer_batches < 1 || options.replay_buffer_batches > 10'000'000) {
    return make_error(ErrorCode::kInvalidArgument, "replay buffer must hold 1 to 10^7 batches");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  try {
    impl->pub.set(zmq::sockopt::linger, 0);
    if (impl->options.connect) {
      impl->pub.connect(impl->options.endpoint);
    } else {
      impl->pub.bind(impl->options.endpoint);
    }
    if (!impl->options.replay_endpoint.empty()) {
      impl->replay.set(zmq::sockopt::linger, 0);
      impl->replay.bind(impl->options.replay_endpoint);
      impl->has_replay = true;
    }
  } catch (const zmq::error_t& e) {
    return make_error(ErrorCode::kInvalidArgument,
                      std::string(impl->options.connect ? "cannot connect to" : "cannot bind") +
                          " KV event endpoint '" + impl->options.endpoint +
                          (impl->options.replay_endpoint.empty()
                               ? ""
                               : "' / replay '" + impl->options.replay_endpoint) +
                          "': " + e.what());
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<KvEventPublisher>(new KvEventPublisher(std::move(impl)));
}

KvEventPublisher::KvEventPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

KvEventPublisher::~KvEventPublisher() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->wake.notify_one();
  impl_->thread.join();
}

void KvEventPublisher::publish(std::vector<KvEvent> events) {
  if (events.empty()) return;
  {
    std::lock_guard lock(impl_->mutex);
    impl_->queue.push_back(std::move(events));
  }
  impl_->wake.notify_one();
}

std::string KvEventPublisher::endpoint() const {
  return impl_->pub.get(zmq::sockopt::last_endpoint);
}

std::string KvEventPublisher::replay_endpoint() const {
  return impl_->has_replay ? impl_->replay.get(zmq::sockopt::last_endpoint) : std::string();
}

uint64_t KvEventPublisher::published_batches() const {
  return impl_->next_seq.load(std::memory_order_relaxed);
}

}  // namespace strata
