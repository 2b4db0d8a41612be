#include "server/kv_event_publisher.h"

#include <gtest/gtest.h>

#include <msgpuck.h>
#include <zmq.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace strata {
namespace {

uint64_t be64(const zmq::message_t& m) {
  const auto* p = static_cast<const unsigned char*>(m.data());
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

std::vector<KvEvent> publisher_sample_events() {
  BlockStored st;
  st.block_hashes = {1, 0xFFFFFFFFFFFFFFFFULL};
  st.parent_block_hash = 7;
  st.token_ids = {10, 11, 12, 13};
  st.block_size = 2;
  st.medium = Medium::kDevice;
  return {st, BlockRemoved{{1}, Medium::kHost}, AllBlocksCleared{}};
}

// Reads back a payload item by item. The constructor checks with mp_check that the
// payload is exactly one complete msgpack object (the test's payloads come from the
// encoder, so mp_check's int counter cannot be forged), after which the unchecked
// mp_decode_* stay inside it. A read of the wrong type fails the test and returns a
// neutral value; later reads then fail too.
class MsgpackReader {
 public:
  explicit MsgpackReader(std::string_view payload)
      : begin_(payload.data()), cur_(begin_), end_(begin_ + payload.size()) {
    const char* check = cur_;
    valid_ = !payload.empty() && mp_check(&check, end_) == 0 && check == end_;
  }

  bool valid() const { return valid_; }
  bool at_end() const { return cur_ == end_; }

  uint32_t array() { return expect(MP_ARRAY, "array") ? mp_decode_array(&cur_) : 0; }
  std::string str() {
    if (!expect(MP_STR, "str")) return {};
    uint32_t len = 0;
    const char* data = mp_decode_str(&cur_, &len);
    return std::string(data, len);
  }
  int64_t integer() {
    if (valid_ && cur_ < end_ && mp_typeof(*cur_) == MP_UINT) {
      return static_cast<int64_t>(mp_decode_uint(&cur_));
    }
    return expect(MP_INT, "int") ? mp_decode_int(&cur_) : 0;
  }
  std::vector<int64_t> integers() {
    std::vector<int64_t> out(array());
    for (int64_t& v : out) v = integer();
    return out;
  }
  double float64() { return expect(MP_DOUBLE, "float64") ? mp_decode_double(&cur_) : 0; }
  bool nil() {
    if (!expect(MP_NIL, "nil")) return false;
    mp_decode_nil(&cur_);
    return true;
  }

 private:
  bool expect(mp_type type, const char* name) {
    if (valid_ && cur_ < end_ && mp_typeof(*cur_) == type) return true;
    if (valid_) ADD_FAILURE() << "expected a msgpack " << name << " at byte " << cur_ - begin_;
    valid_ = false;
    return false;
  }
  const char* begin_;
  const char* cur_;
  const char* end_;
  bool valid_ = false;
};

std::string from_hex(std::string_view hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

TEST(KvEventEncoding, MatchesVllmArrayLayout) {
  const std::string payload = encode_kv_event_batch(12.5, publisher_sample_events(), 3);
  MsgpackReader r(payload);
  ASSERT_TRUE(r.valid());
  ASSERT_EQ(r.array(), 3u);
  EXPECT_DOUBLE_EQ(r.float64(), 12.5);
  ASSERT_EQ(r.array(), 3u);  // events

  ASSERT_EQ(r.array(), 8u);  // no extra_keys: omitted, as msgspec omits a trailing default
  EXPECT_EQ(r.str(), "BlockStored");
  EXPECT_EQ(r.integers(), (std::vector<int64_t>{1, -1}));
  EXPECT_EQ(r.integer(), 7);
  EXPECT_EQ(r.integers(), (std::vector<int64_t>{10, 11, 12, 13}));
  EXPECT_EQ(r.integer(), 2);
  EXPECT_TRUE(r.nil());  // lora_id
  EXPECT_EQ(r.str(), "GPU");
  EXPECT_TRUE(r.nil());  // lora_name

  ASSERT_EQ(r.array(), 3u);
  EXPECT_EQ(r.str(), "BlockRemoved");
  EXPECT_EQ(r.integers(), (std::vector<int64_t>{1}));
  EXPECT_EQ(r.str(), "CPU_PINNED");

  ASSERT_EQ(r.array(), 1u);
  EXPECT_EQ(r.str(), "AllBlocksCleared");

  EXPECT_EQ(r.integer(), 3);  // data_parallel_rank
  EXPECT_TRUE(r.at_end());
}

// The bytes must be those of the reference packers (msgpack-cxx, Python's msgpack, which
// vLLM uses): the expected hex is Python's msgpack.packb of the same batch,
//   [12.5, [["BlockStored", [1, -1], 7, [10, 11, 12, 13], 2, None, "GPU", None],
//           ["BlockRemoved", [1], "CPU_PINNED"], ["AllBlocksCleared"]], 3].
TEST(KvEventEncoding, BytesMatchTheReferencePacker) {
  EXPECT_EQ(encode_kv_event_batch(12.5, publisher_sample_events(), 3),
            from_hex("93cb40290000000000009398ab426c6f636b53746f7265649201ff07940a0b0c0d02c0a3"
                     "475055c093ac426c6f636b52656d6f7665649101aa4350555f50494e4e454491b0416c6c"
                     "426c6f636b73436c656172656403"));
}

// Every integer width on both sides of each boundary, a negative parent, lora id and rank,
// and an array16 header (20 hashes): Python's msgpack.packb of
//   [0.1, [["BlockStored", HASHES, -33, [0, 127, 128, 65536, 2147483647], 16, -5,
//           "DISK", None]], -1].
TEST(KvEventEncoding, IntegerWidthsMatchTheReferencePacker) {
  const std::vector<int64_t> wire = {0,
                                     127,
                                     128,
                                     255,
                                     256,
                                     65535,
                                     65536,
                                     4294967295,
                                     4294967296,
                                     INT64_MAX,
                                     -1,
                                     -32,
                                     -33,
                                     -128,
                                     -129,
                                     -32768,
                                     -32769,
                                     INT32_MIN,
                                     int64_t{INT32_MIN} - 1,
                                     INT64_MIN};
  BlockStored st;
  for (int64_t h : wire) st.block_hashes.push_back(block_hash_from_wire(h));
  st.parent_block_hash = block_hash_from_wire(-33);
  st.token_ids = {0, 127, 128, 65536, INT32_MAX};
  st.block_size = 16;
  st.lora_id = -5;
  st.medium = Medium::kStorage;
  EXPECT_EQ(encode_kv_event_batch(0.1, {st}, -1),
            from_hex("93cb3fb999999999999a9198ab426c6f636b53746f726564dc0014007fcc80ccffcd0100cd"
                     "ffffce00010000ceffffffffcf0000000100000000cf7fffffffffffffffffe0d0dfd080"
                     "d1ff7fd18000d2ffff7fffd280000000d3ffffffff7fffffffd38000000000000000d0df"
                     "95007fcc80ce00010000ce7fffffff10fba44449534bc0ff"));
}

// A salted sequence's first blocks carry vLLM's extra_keys, one entry per block: (salt,)
// on the first, None after (vllm/distributed/kv_events.py, BlockStored.extra_keys).
// Python's msgpack.packb of
//   [1.0, [["BlockStored", [5, 6], None, [1, 2, 3, 4], 2, None, "GPU", None,
//           [["tenant-a"], None]]], 0].
TEST(KvEventEncoding, ASaltedFirstBlockCarriesItsExtraKeys) {
  BlockStored st;
  st.block_hashes = {5, 6};
  st.token_ids = {1, 2, 3, 4};
  st.block_size = 2;
  st.first_block_salt = "tenant-a";
  EXPECT_EQ(encode_kv_event_batch(1.0, {st}, 0),
            from_hex("93cb3ff00000000000009199ab426c6f636b53746f726564920506c0940102030402c0a3"
                     "475055c09291a874656e616e742d61c000"));
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
  for (int i = 0; i < 5; ++i) (*pub)->publish(publisher_sample_events());
  (*pub)->publish({});  // empty: ignored, no sequence number
  for (uint64_t i = 0; i < 5; ++i) {
    zmq::message_t topic, seq, payload;
    ASSERT_TRUE(sub.recv(topic));
    EXPECT_EQ(topic.to_string(), "kv");
    ASSERT_TRUE(sub.recv(seq));
    EXPECT_EQ(be64(seq), base + i);
    ASSERT_TRUE(sub.recv(payload));
    MsgpackReader r(payload.to_string_view());
    ASSERT_TRUE(r.valid());
    EXPECT_EQ(r.array(), 3u);
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
