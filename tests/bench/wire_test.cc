// The benchmark's readers of what servers send: server-sent events, usage objects and
// KV event batches (msgpack), and a subscriber fed by a real ZeroMQ publisher.
#include <gtest/gtest.h>

#include <msgpack.hpp>
#include <zmq.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "bench/http_client.h"
#include "bench/kv_events.h"
#include "bench/server_process.h"

namespace strata::bench {
namespace {

std::vector<std::string> parse_all(const std::string& stream, size_t chunk) {
  SseParser p;
  std::vector<std::string> out;
  for (size_t i = 0; i < stream.size(); i += chunk) {
    p.feed(std::string_view(stream).substr(i, chunk),
           [&](std::string_view d) { out.emplace_back(d); });
  }
  return out;
}

TEST(SseParserTest, SameEventsWhateverTheChunking) {
  const std::string stream =
      ": a comment\n"
      "data: {\"a\":1}\n\n"
      "event: message\r\ndata: {\"b\":2}\r\n\r\n"
      "data: line one\ndata: line two\n\n"
      "data:[DONE]\n\n";
  const std::vector<std::string> want = {"{\"a\":1}", "{\"b\":2}", "line one\nline two", "[DONE]"};
  for (size_t chunk : {1, 2, 3, 7, 1000}) EXPECT_EQ(parse_all(stream, chunk), want) << chunk;
}

TEST(SseParserTest, AnUnfinishedEventIsNotDelivered) {
  EXPECT_TRUE(parse_all("data: {\"a\":1}\n", 4).empty());
}

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

// A batch in the wire format, packed as docs/kv-events.md describes it.
std::string batch(const std::vector<std::pair<std::string, std::vector<int64_t>>>& events) {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_array(3);
  pk.pack_double(1.5);
  pk.pack_array(static_cast<uint32_t>(events.size()));
  for (const auto& [tag, hashes] : events) {
    if (tag == "AllBlocksCleared") {
      pk.pack_array(1);
      pk.pack(tag);
    } else if (tag == "BlockStored") {
      pk.pack_array(7);
      pk.pack(tag);
      pk.pack(hashes);
      pk.pack_nil();
      pk.pack(std::vector<int32_t>(16 * hashes.size(), 7));
      pk.pack(16);
      pk.pack_nil();
      pk.pack(std::string("GPU"));
    } else {
      pk.pack_array(3);
      pk.pack(tag);
      pk.pack(hashes);
      pk.pack(std::string("CPU_PINNED"));
    }
  }
  pk.pack(0);
  return std::string(buf.data(), buf.size());
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

TEST(KvEventDecodeTest, RejectsMalformedPayloads) {
  EXPECT_FALSE(decode_kv_event_batch("not msgpack at all \xc1"));
  EXPECT_FALSE(decode_kv_event_batch(batch({{"BlockExploded", {1}}})));
  msgpack::sbuffer buf;
  msgpack::pack(buf, std::vector<int>{1, 2});
  auto r = decode_kv_event_batch(std::string(buf.data(), buf.size()));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kCorrupt);
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
