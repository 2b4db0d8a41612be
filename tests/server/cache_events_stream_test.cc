// The fan-out behind GET /cache/events: the JSON of a batch, sequence numbers, per
// subscriber queues and their bounds (overflow drops the subscriber, counted), the cap on
// subscribers, removal when a subscription ends, and close() at shutdown.
#include "server/cache_events_stream.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace strata {
namespace {

using json = nlohmann::json;

std::vector<KvEvent> sample_events() {
  BlockStored st;
  st.block_hashes = {1, 0xFFFFFFFFFFFFFFFFULL};
  st.parent_block_hash = 0x8000000000000000ULL;
  st.token_ids = {10, 11, 12, 13};
  st.block_size = 2;
  st.medium = Medium::kDevice;
  BlockStored first;  // a sequence's first block: no parent
  first.block_hashes = {5};
  first.token_ids = {1, 2};
  first.block_size = 2;
  first.lora_id = 3;
  first.medium = Medium::kStorage;
  return {st, first, BlockRemoved{{1}, Medium::kHost}, AllBlocksCleared{}};
}

std::vector<KvEvent> one_removal(BlockHash h) {
  return {BlockRemoved{{h}, Medium::kDevice}};
}

// The data of each SSE event in `frames`.
std::vector<json> events_of(const std::string& frames) {
  std::vector<json> out;
  size_t at = 0;
  while (at < frames.size()) {
    EXPECT_EQ(frames.compare(at, 6, "data: "), 0) << frames.substr(at, 40);
    const size_t end = frames.find("\n\n", at);
    EXPECT_NE(end, std::string::npos);
    out.push_back(json::parse(frames.substr(at + 6, end - at - 6)));
    at = end + 2;
  }
  return out;
}

TEST(CacheEventsJson, MatchesTheWireNamesAndSignedHashes) {
  const json j = json::parse(encode_cache_events_json(7, 1700000000.25, sample_events()));
  EXPECT_EQ(j["seq"], 7);
  EXPECT_DOUBLE_EQ(j["ts"].get<double>(), 1700000000.25);
  ASSERT_EQ(j["events"].size(), 4U);
  const json& st = j["events"][0];
  EXPECT_EQ(st["type"], "BlockStored");
  EXPECT_EQ(st["block_hashes"], json::array({1, -1}));  // int64 as on the wire
  EXPECT_EQ(st["parent_block_hash"].get<int64_t>(), INT64_MIN);
  EXPECT_EQ(st["token_ids"], json::array({10, 11, 12, 13}));
  EXPECT_EQ(st["block_size"], 2);
  EXPECT_TRUE(st["lora_id"].is_null());
  EXPECT_EQ(st["medium"], "GPU");
  const json& first = j["events"][1];
  EXPECT_TRUE(first["parent_block_hash"].is_null());
  EXPECT_EQ(first["lora_id"], 3);
  EXPECT_EQ(first["medium"], "DISK");
  EXPECT_EQ(j["events"][2],
            json({{"type", "BlockRemoved"}, {"block_hashes", {1}}, {"medium", "CPU_PINNED"}}));
  EXPECT_EQ(j["events"][3], json({{"type", "AllBlocksCleared"}}));
  EXPECT_EQ(json::parse(encode_cache_events_json(0, 0, {}))["events"], json::array());
}

TEST(CacheEventsStream, NumbersBatchesWhetherOrNotAnyoneListens) {
  CacheEventsStream s;
  s.publish(one_removal(1));
  s.publish({});  // ignored, as by the ZeroMQ publisher
  s.publish(one_removal(2));
  EXPECT_EQ(s.next_seq(), 2U);
  int woken = 0;
  auto sub = s.subscribe([&] { ++woken; });
  ASSERT_TRUE(sub);
  EXPECT_EQ((*sub)->start_seq(), 2U);
  EXPECT_TRUE((*sub)->take(1 << 20).frames.empty());
  s.publish(one_removal(3));
  s.publish(one_removal(4));
  EXPECT_EQ(woken, 2);
  const auto t = (*sub)->take(1 << 20);
  EXPECT_FALSE(t.overflow);
  EXPECT_FALSE(t.closed);
  const std::vector<json> got = events_of(t.frames);
  ASSERT_EQ(got.size(), 2U);
  EXPECT_EQ(got[0]["seq"], 2);
  EXPECT_EQ(got[0]["events"][0]["block_hashes"][0], 3);
  EXPECT_EQ(got[1]["seq"], 3);
  EXPECT_TRUE((*sub)->take(1 << 20).frames.empty());
}

TEST(CacheEventsStream, TakeHandsOutWholeEventsUpToABound) {
  CacheEventsStream s;
  auto sub = s.subscribe(nullptr);
  ASSERT_TRUE(sub);
  for (BlockHash h = 1; h <= 5; ++h) s.publish(one_removal(h));
  EXPECT_EQ(events_of((*sub)->take(1).frames).size(), 1U);  // one at least, however small the bound
  EXPECT_EQ(events_of((*sub)->take(1 << 20).frames).size(), 4U);
}

TEST(CacheEventsStream, EverySubscriberGetsEveryBatch) {
  CacheEventsStream s;
  auto a = s.subscribe(nullptr);
  auto b = s.subscribe(nullptr);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(s.subscribers(), 2);
  s.publish(sample_events());
  const std::string fa = (*a)->take(1 << 20).frames;
  EXPECT_EQ(fa, (*b)->take(1 << 20).frames);
  EXPECT_EQ(events_of(fa).size(), 1U);
}

TEST(CacheEventsStream, ASubscriberThatFallsBehindIsDroppedNotWaitedFor) {
  CacheEventsStream s(CacheEventsOptions{
      .max_subscribers = 4, .max_queued_bytes = 1 << 20, .max_queued_batches = 3});
  int woken = 0;
  auto slow = s.subscribe([&] { ++woken; });
  auto fast = s.subscribe(nullptr);
  ASSERT_TRUE(slow && fast);
  s.publish(one_removal(1));
  EXPECT_EQ(events_of((*slow)->take(1 << 20).frames).size(), 1U);  // seq 0 read
  for (BlockHash h = 2; h <= 5; ++h) {
    s.publish(one_removal(h));  // seq 1..4: the 4th unread one is over the bound
    (*fast)->take(1 << 20);
  }
  EXPECT_EQ(s.dropped_subscribers(), 1U);
  EXPECT_EQ(s.subscribers(), 1);
  EXPECT_EQ(woken, 5);
  auto t = (*slow)->take(1 << 20);
  EXPECT_TRUE(t.overflow);
  EXPECT_EQ(t.lost_seq, 1U);  // the oldest batch it had not read
  EXPECT_TRUE(t.frames.empty());
  s.publish(one_removal(6));
  EXPECT_TRUE((*slow)->take(1 << 20).overflow);  // nothing more comes
  EXPECT_EQ(events_of((*fast)->take(1 << 20).frames).size(), 1U);
}

TEST(CacheEventsStream, TheByteBoundDropsToo) {
  BlockStored big;
  big.block_hashes.assign(1000, 42);
  big.token_ids.assign(16000, 7);
  big.block_size = 16;
  const std::vector<KvEvent> batch{big};
  const size_t size = encode_cache_events_json(0, 0, batch).size();
  CacheEventsStream s(CacheEventsOptions{.max_subscribers = 1,
                                         .max_queued_bytes = static_cast<int64_t>(size * 5 / 2),
                                         .max_queued_batches = 1000});
  auto sub = s.subscribe(nullptr);
  ASSERT_TRUE(sub);
  s.publish(batch);
  s.publish(batch);
  EXPECT_EQ(s.dropped_subscribers(), 0U);
  s.publish(batch);
  EXPECT_EQ(s.dropped_subscribers(), 1U);
  auto t = (*sub)->take(1 << 30);
  EXPECT_TRUE(t.overflow);
  EXPECT_EQ(t.lost_seq, 0U);
}

TEST(CacheEventsStream, CapsSubscribersAndFreesASlotWhenOneEnds) {
  CacheEventsStream s(CacheEventsOptions{.max_subscribers = 2});
  auto a = s.subscribe(nullptr);
  auto b = s.subscribe(nullptr);
  ASSERT_TRUE(a && b);
  auto c = s.subscribe(nullptr);
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, ErrorCode::kResourceExhausted);
  EXPECT_NE(c.error().message.find("2 clients"), std::string::npos);
  a->reset();  // the client went away
  EXPECT_EQ(s.subscribers(), 1);
  EXPECT_TRUE(s.subscribe(nullptr));
  b->reset();
  EXPECT_EQ(s.subscribers(), 0);
}

TEST(CacheEventsStream, CloseEndsEveryStreamAfterWhatIsQueued) {
  CacheEventsStream s;
  int woken = 0;
  auto sub = s.subscribe([&] { ++woken; });
  ASSERT_TRUE(sub);
  s.publish(one_removal(1));
  s.close();
  s.close();  // idempotent
  EXPECT_EQ(woken, 2);
  auto t = (*sub)->take(1 << 20);
  EXPECT_EQ(events_of(t.frames).size(), 1U);
  EXPECT_TRUE(t.closed);
  EXPECT_TRUE((*sub)->take(1 << 20).closed);
  auto late = s.subscribe(nullptr);
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().code, ErrorCode::kFailedPrecondition);
}

TEST(CacheEventsStream, ASubscriptionMayOutliveTheStream) {
  auto s = std::make_unique<CacheEventsStream>();
  auto sub = s->subscribe(nullptr);
  ASSERT_TRUE(sub);
  s.reset();  // closes
  EXPECT_TRUE((*sub)->take(1 << 20).closed);
}

// Publisher and subscribers on their own threads (for TSan): every subscriber sees a
// gap-free run of sequence numbers from its start.
TEST(CacheEventsStream, ConcurrentPublishTakeAndSubscribe) {
  CacheEventsStream s(CacheEventsOptions{
      .max_subscribers = 8, .max_queued_bytes = 1 << 24, .max_queued_batches = 100'000});
  std::atomic<bool> done{false};
  std::atomic<int> failures{0};
  std::atomic<int> seen{0};
  std::thread publisher([&] {
    // Half the batches once every reader listens, so that each sees a run of them.
    for (BlockHash h = 0; h < 1500; ++h) s.publish(one_removal(h));
    while (s.subscribers() < 4 && failures.load() == 0) std::this_thread::yield();
    for (BlockHash h = 1500; h < 3000; ++h) s.publish(one_removal(h));
    done = true;
  });
  std::vector<std::thread> readers;
  for (int r = 0; r < 4; ++r) {
    readers.emplace_back([&] {
      auto sub = s.subscribe(nullptr);
      if (!sub) {
        ++failures;
        return;
      }
      uint64_t expect = (*sub)->start_seq();
      for (;;) {
        const bool finished = done.load();
        for (const json& e : events_of((*sub)->take(1 << 16).frames)) {
          if (e["seq"].get<uint64_t>() != expect) ++failures;
          ++expect;
          ++seen;
        }
        if (finished && expect == s.next_seq()) break;
        std::this_thread::yield();
      }
    });
  }
  publisher.join();
  for (auto& t : readers) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GE(seen.load(), 4 * 1500);
  EXPECT_EQ(s.next_seq(), 3000U);
  EXPECT_EQ(s.subscribers(), 0);
}

}  // namespace
}  // namespace strata
