#include "server/kv_event_publisher.h"

#include <gtest/gtest.h>

#include <msgpack.hpp>
#include <zmq.hpp>

#include <chrono>
#include <thread>

namespace strata {
namespace {

uint64_t be64(const zmq::message_t& m) {
  const auto* p = static_cast<const unsigned char*>(m.data());
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

std::vector<KvEvent> sample_events() {
  BlockStored st;
  st.block_hashes = {1, 0xFFFFFFFFFFFFFFFFULL};
  st.parent_block_hash = 7;
  st.token_ids = {10, 11, 12, 13};
  st.block_size = 2;
  st.medium = Medium::kDevice;
  return {st, BlockRemoved{{1}, Medium::kHost}, AllBlocksCleared{}};
}

TEST(KvEventEncoding, MatchesVllmArrayLayout) {
  const std::string payload = encode_kv_event_batch(12.5, sample_events(), 3);
  msgpack::object_handle oh = msgpack::unpack(payload.data(), payload.size());
  const msgpack::object& batch = oh.get();
  ASSERT_EQ(batch.type, msgpack::type::ARRAY);
  ASSERT_EQ(batch.via.array.size, 3u);
  EXPECT_DOUBLE_EQ(batch.via.array.ptr[0].as<double>(), 12.5);
  EXPECT_EQ(batch.via.array.ptr[2].as<int>(), 3);
  const msgpack::object& events = batch.via.array.ptr[1];
  ASSERT_EQ(events.via.array.size, 3u);

  const msgpack::object& stored = events.via.array.ptr[0];
  ASSERT_EQ(stored.via.array.size, 7u);
  EXPECT_EQ(stored.via.array.ptr[0].as<std::string>(), "BlockStored");
  EXPECT_EQ(stored.via.array.ptr[1].as<std::vector<int64_t>>(), (std::vector<int64_t>{1, -1}));
  EXPECT_EQ(stored.via.array.ptr[2].as<int64_t>(), 7);
  EXPECT_EQ(stored.via.array.ptr[3].as<std::vector<int>>(), (std::vector<int>{10, 11, 12, 13}));
  EXPECT_EQ(stored.via.array.ptr[4].as<int>(), 2);
  EXPECT_TRUE(stored.via.array.ptr[5].is_nil());
  EXPECT_EQ(stored.via.array.ptr[6].as<std::string>(), "GPU");

  const msgpack::object& removed = events.via.array.ptr[1];
  ASSERT_EQ(removed.via.array.size, 3u);
  EXPECT_EQ(removed.via.array.ptr[0].as<std::string>(), "BlockRemoved");
  EXPECT_EQ(removed.via.array.ptr[2].as<std::string>(), "CPU_PINNED");

  const msgpack::object& cleared = events.via.array.ptr[2];
  ASSERT_EQ(cleared.via.array.size, 1u);
  EXPECT_EQ(cleared.via.array.ptr[0].as<std::string>(), "AllBlocksCleared");
}

TEST(KvEventPublisher, PublishesInOrderAndReplays) {
  auto pub = KvEventPublisher::start({.endpoint = "tcp://127.0.0.1:*",
                                      .replay_endpoint = "tcp://127.0.0.1:*",
                                      .topic = "kv",
                                      .replay_buffer_batches = 3});
  ASSERT_TRUE(pub.has_value()) << pub.error().message;
  zmq::context_t ctx;
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "");
  sub.set(zmq::sockopt::rcvtimeo, 5000);
  sub.connect((*pub)->endpoint());
  // PUB drops messages until the subscription reaches it: probe until one arrives.
  uint64_t first_seen = UINT64_MAX;
  for (int attempt = 0; attempt < 200 && first_seen == UINT64_MAX; ++attempt) {
    (*pub)->publish({AllBlocksCleared{}});
    zmq::message_t m;
    sub.set(zmq::sockopt::rcvtimeo, 20);
    if (sub.recv(m)) {
      zmq::message_t seq, payload;
      ASSERT_TRUE(sub.recv(seq));
      ASSERT_TRUE(sub.recv(payload));
      first_seen = be64(seq);
    }
  }
  ASSERT_NE(first_seen, UINT64_MAX) << "subscriber never connected";
  sub.set(zmq::sockopt::rcvtimeo, 5000);
  // Drain probes still in flight, then publish five batches and see them in order.
  while (true) {
    zmq::message_t m;
    sub.set(zmq::sockopt::rcvtimeo, 100);
    if (!sub.recv(m)) break;
    zmq::message_t seq, payload;
    (void)sub.recv(seq);
    (void)sub.recv(payload);
  }
  sub.set(zmq::sockopt::rcvtimeo, 5000);
  const uint64_t base = (*pub)->published_batches();
  for (int i = 0; i < 5; ++i) (*pub)->publish(sample_events());
  (*pub)->publish({});  // empty: ignored, no sequence number
  for (uint64_t i = 0; i < 5; ++i) {
    zmq::message_t topic, seq, payload;
    ASSERT_TRUE(sub.recv(topic));
    EXPECT_EQ(topic.to_string(), "kv");
    ASSERT_TRUE(sub.recv(seq));
    EXPECT_EQ(be64(seq), base + i);
    ASSERT_TRUE(sub.recv(payload));
    EXPECT_EQ(msgpack::unpack(static_cast<const char*>(payload.data()), payload.size())
                  .get()
                  .via.array.size,
              3u);
  }

  // Replay from base+1: the ring keeps the last 3 batches (base+2 .. base+4).
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::rcvtimeo, 5000);
  dealer.connect((*pub)->replay_endpoint());
  std::string start(8, '\0');
  for (int i = 0; i < 8; ++i)
    start[static_cast<size_t>(i)] = static_cast<char>(((base + 1) >> (56 - 8 * i)) & 0xff);
  dealer.send(zmq::message_t(), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(start), zmq::send_flags::none);
  std::vector<uint64_t> replayed;
  for (;;) {
    zmq::message_t empty, seq, payload;
    ASSERT_TRUE(dealer.recv(empty));
    ASSERT_TRUE(dealer.recv(seq));
    ASSERT_TRUE(dealer.recv(payload));
    if (be64(seq) == ~0ULL) {
      EXPECT_EQ(payload.size(), 0u);
      break;
    }
    replayed.push_back(be64(seq));
  }
  EXPECT_EQ(replayed, (std::vector<uint64_t>{base + 2, base + 3, base + 4}));
}

TEST(KvEventPublisher, BadEndpointIsAClearError) {
  auto pub = KvEventPublisher::start({.endpoint = "not-an-endpoint"});
  ASSERT_FALSE(pub.has_value());
  EXPECT_NE(pub.error().message.find("not-an-endpoint"), std::string::npos);
  auto bad = KvEventPublisher::start({.endpoint = "tcp://127.0.0.1:*", .replay_buffer_batches = 0});
  ASSERT_FALSE(bad.has_value());
}

}  // namespace
}  // namespace strata
