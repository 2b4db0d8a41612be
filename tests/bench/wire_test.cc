// The benchmark's readers of what servers send: usage objects, error bodies and KV event
// batches (msgpack), and a subscriber fed by a real ZeroMQ publisher. (The server-sent-events
// splitter is tested in tests/http/sse_test.cc.)
#include <gtest/gtest.h>

#include <msgpuck.h>
#include <zmq.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "bench/http_client.h"
#include "bench/kv_events.h"
#include "bench/server_process.h"

namespace strata::bench {
namespace {

TEST(UsageTest, ReadsCachedTokensPerTier) {
  const auto u = parse_usage(nlohmann::json::parse(R"({
      "prompt_tokens": 4810, "completion_tokens": 8,
      "prompt_tokens_details": {"cached_tokens": 4784},
      "cached_tokens_details": {"device": 4000, "host": 784, "storage": 0}})"));
  EXPECT_TRUE(u.present);
  EXPECT_EQ(u.prompt_tokens, 4810);
  EXPECT_EQ(u.completion_tokens, 8);
  EXPECT_EQ(u.cached_tokens, 4784);
  EXPECT_EQ(u.cached.device, 4000);
  EXPECT_EQ(u.cached.host, 784);
  const auto none = parse_usage(nlohmann::json::parse(R"({"prompt_tokens": 3})"));
  EXPECT_EQ(none.cached_tokens, 0);
  EXPECT_FALSE(parse_usage(nlohmann::json()).present);
}

TEST(ErrorMessageTest, PrefersTheServersMessage) {
  EXPECT_EQ(error_message(R"({"error":{"message":"no route for POST /x","code":"not_found"}})"),
            "no route for POST /x");
  EXPECT_EQ(error_message("plain text"), "plain text");
}

// Appends msgpack with msgpuck, in the shortest forms, as vLLM's packer writes them.
class MsgpackWriter {
 public:
  MsgpackWriter& array(uint32_t size) {
    mp_encode_array(grow(mp_sizeof_array(size)), size);
    return *this;
  }
  MsgpackWriter& str(std::string_view s) {
    const auto len = static_cast<uint32_t>(s.size());
    mp_encode_str(grow(mp_sizeof_str(len)), s.data(), len);
    return *this;
  }
  MsgpackWriter& integer(int64_t v) {  // mp_encode_int takes negative values only
    if (v >= 0) {
      mp_encode_uint(grow(mp_sizeof_uint(static_cast<uint64_t>(v))), static_cast<uint64_t>(v));
    } else {
      mp_encode_int(grow(mp_sizeof_int(v)), v);
    }
    return *this;
  }
  MsgpackWriter& integers(const std::vector<int64_t>& vs) {
    array(static_cast<uint32_t>(vs.size()));
    for (int64_t v : vs) integer(v);
    return *this;
  }
  MsgpackWriter& float64(double v) {
    mp_encode_double(grow(mp_sizeof_double(v)), v);
    return *this;
  }
  MsgpackWriter& nil() {
    mp_encode_nil(grow(mp_sizeof_nil()));
    return *this;
  }
  MsgpackWriter& raw(std::string_view bytes) {
    out_.append(bytes);
    return *this;
  }
  const std::string& bytes() const { return out_; }

 private:
  char* grow(uint32_t size_bytes) {
    const size_t at = out_.size();
    out_.resize(at + size_bytes);
    return out_.data() + at;
  }
  std::string out_;
};

// A batch in the wire format, packed as docs/kv-events.md describes it.
std::string batch(const std::vector<std::pair<std::string, std::vector<int64_t>>>& events) {
  MsgpackWriter w;
  w.array(3).float64(1.5).array(static_cast<uint32_t>(events.size()));
  for (const auto& [tag, hashes] : events) {
    if (tag == "AllBlocksCleared") {
      w.array(1).str(tag);
    } else if (tag == "BlockStored") {
      w.array(7).str(tag).integers(hashes).nil();
      w.integers(std::vector<int64_t>(16 * hashes.size(), 7)).integer(16).nil().str("GPU");
    } else {
      w.array(3).str(tag).integers(hashes).str("CPU_PINNED");
    }
  }
  w.integer(0);
  return w.bytes();
}

TEST(KvEventDecodeTest, DecodesEveryEventKind) {
  auto b = decode_kv_event_batch(batch({{"BlockStored", {-5281474976710656, 8817263562}},
                                        {"BlockRemoved", {42}},
                                        {"AllBlocksCleared", {}}}));
  ASSERT_TRUE(b) << b.error().message;
  EXPECT_DOUBLE_EQ(b->timestamp_s, 1.5);
  ASSERT_EQ(b->events.size(), 3u);
  EXPECT_EQ(b->events[0].kind, KvEventRecord::Kind::kStored);
  EXPECT_EQ(b->events[0].block_hashes, (std::vector<int64_t>{-5281474976710656, 8817263562}));
  EXPECT_EQ(b->events[0].medium, "GPU");
  EXPECT_EQ(b->events[1].kind, KvEventRecord::Kind::kRemoved);
  EXPECT_EQ(b->events[1].medium, "CPU_PINNED");
  EXPECT_EQ(b->events[2].kind, KvEventRecord::Kind::kAllCleared);
}

TEST(KvEventDecodeTest, ReadsEveryIntegerWidthAndExtraFields) {
  const std::vector<int64_t> hashes = {0,     127,        128,       255,      256, 65535,
                                       65536, 4294967296, INT64_MAX, -1,       -32, -33,
                                       -129,  -32769,     INT32_MIN, INT64_MIN};
  MsgpackWriter w;
  w.array(3).float64(2.0).array(1);
  // A field after medium, as a later vLLM may add, is skipped.
  w.array(4).str("BlockRemoved").integers(hashes).str("DISK").str("extra");
  w.integer(-2);
  auto b = decode_kv_event_batch(w.bytes());
  ASSERT_TRUE(b) << b.error().message;
  ASSERT_EQ(b->events.size(), 1u);
  EXPECT_EQ(b->events[0].block_hashes, hashes);
  EXPECT_EQ(b->events[0].medium, "DISK");
  EXPECT_EQ(b->data_parallel_rank, -2);

  // A uint64 above INT64_MAX is the wire form's wrap of a negative hash.
  MsgpackWriter big;
  big.array(3).float64(2.0).array(1).array(3).str("BlockRemoved").array(1);
  big.raw(std::string("\xcf\xff\xff\xff\xff\xff\xff\xff\xfe", 9)).str("GPU").nil();
  auto wrapped = decode_kv_event_batch(big.bytes());
  ASSERT_TRUE(wrapped) << wrapped.error().message;
  EXPECT_EQ(wrapped->events[0].block_hashes, (std::vector<int64_t>{-2}));
  EXPECT_EQ(wrapped->data_parallel_rank, 0);  // nil: vLLM without data parallelism
}

TEST(KvEventDecodeTest, RejectsMalformedPayloads) {
  EXPECT_FALSE(decode_kv_event_batch("not msgpack at all \xc1"));
  EXPECT_FALSE(decode_kv_event_batch(batch({{"BlockExploded", {1}}})));
  MsgpackWriter w;
  w.array(2).integer(1).integer(2);
  auto r = decode_kv_event_batch(w.bytes());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kCorrupt);
}

// Every way a payload can lie about its length is an error value, never a read past the
// buffer (run under ASan to see the difference).
TEST(KvEventDecodeTest, NeverReadsPastTheBuffer) {
  const std::string good = batch({{"BlockStored", {3, -1}}, {"BlockRemoved", {3}}});
  ASSERT_TRUE(decode_kv_event_batch(good));
  for (size_t n = 0; n < good.size(); ++n) {
    // A copy of exactly n bytes, so that ASan sees any read beyond it.
    const std::string prefix = good.substr(0, n);
    auto r = decode_kv_event_batch(prefix);
    ASSERT_FALSE(r) << n;
    EXPECT_EQ(r.error().code, ErrorCode::kCorrupt);
  }
  EXPECT_FALSE(decode_kv_event_batch(good + '\x00'));  // bytes after the payload
  // Forged counts: 2^32 - 1 items (msgpuck's own mp_check wraps its int counter on this
  // one and accepts it), 2^31 items, a map of 2^32 - 1 pairs, a 4 GiB string.
  for (const std::string_view forged :
       {std::string_view("\xdd\xff\xff\xff\xff", 5), std::string_view("\xdd\x80\x00\x00\x00", 5),
        std::string_view("\xdf\xff\xff\xff\xff", 5),
        std::string_view("\x93\xcb\0\0\0\0\0\0\0\0\x91\xdb\xff\xff\xff\xff", 16)}) {
    const std::string copy(forged);
    EXPECT_FALSE(decode_kv_event_batch(copy)) << copy.size();
  }
  // The reserved byte 0xc1 inside an otherwise complete payload.
  MsgpackWriter w;
  w.array(3).float64(1.0).array(1).array(3).str("BlockRemoved").array(1).raw("\xc1");
  w.str("GPU").integer(0);
  EXPECT_FALSE(decode_kv_event_batch(w.bytes()));
}

TEST(KvEventDecodeTest, NamesTheWrongField) {
  MsgpackWriter ts;
  ts.array(3).integer(1).array(0).integer(0);
  auto r = decode_kv_event_batch(ts.bytes());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "the timestamp is not a float");

  MsgpackWriter hash;
  hash.array(3).float64(1).array(1).array(3).str("BlockRemoved").array(1).str("x");
  hash.str("GPU").integer(0);
  r = decode_kv_event_batch(hash.bytes());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "a block hash is not an integer");

  MsgpackWriter fields;
  fields.array(3).float64(1).array(1).array(6).str("BlockStored").integers({1});
  fields.nil().integers({}).integer(16).nil().integer(0);
  r = decode_kv_event_batch(fields.bytes());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message, "BlockStored has 6 fields");
}

std::string be64(uint64_t v) {
  std::string s;
  for (int shift = 56; shift >= 0; shift -= 8) s.push_back(static_cast<char>((v >> shift) & 0xff));
  return s;
}

TEST(KvEventSubscriberTest, CapturesStoredBlocksOnceInOrder) {
  auto port = pick_free_port();
  ASSERT_TRUE(port);
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(*port);
  zmq::context_t ctx(1);
  zmq::socket_t pub(ctx, zmq::socket_type::pub);
  pub.bind(endpoint);
  auto sub = KvEventSubscriber::connect(endpoint);
  ASSERT_TRUE(sub) << sub.error().message;
  uint64_t seq = 0;
  auto send = [&](const std::string& payload, uint64_t s) {
    pub.send(zmq::buffer(std::string("kv-events")), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(be64(s)), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(payload), zmq::send_flags::none);
  };
  // The slow joiner: publish until the subscriber sees something.
  for (int i = 0; i < 100 && (*sub)->batches_received() == 0; ++i) {
    send(batch({{"BlockStored", {999}}}), seq++);
    (*sub)->wait_batches_above(0, 0.05);
  }
  ASSERT_GT((*sub)->batches_received(), 0u);
  ASSERT_TRUE((*sub)->wait_quiet(0.1, 5));
  (*sub)->start_capture();
  const uint64_t before = (*sub)->batches_received();
  send(batch({{"BlockStored", {3, 1}}, {"BlockStored", {2}}}), seq++);
  send(batch({{"BlockStored", {1, 4}}}), seq + 3);  // a gap of 3 sequence numbers
  ASSERT_TRUE((*sub)->wait_batches_above(before + 1, 5));
  EXPECT_EQ((*sub)->captured_blocks(), (std::vector<int64_t>{3, 1, 2, 4}));
  EXPECT_EQ((*sub)->sequence_gaps(), 3u);
  EXPECT_EQ((*sub)->last_error(), "");
  send(batch({{"AllBlocksCleared", {}}}), seq + 4);
  ASSERT_TRUE((*sub)->wait_batches_above(before + 2, 5));
  EXPECT_TRUE((*sub)->captured_blocks().empty());
}

}  // namespace
}  // namespace strata::bench
