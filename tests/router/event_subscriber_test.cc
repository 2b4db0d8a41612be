// The event subscriber against a fake worker with real ZeroMQ sockets on loopback: a PUB
// for the live stream and a ROUTER that answers replay requests from its ring, as
// src/server/kv_event_publisher.cc does.
#include "router/event_subscriber.h"

#include <gtest/gtest.h>
#include <msgpuck.h>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cache/block_hash.h"

namespace strata::router {
namespace {

constexpr int kEventBlockSize = 4;

std::string be64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (56 - 8 * i)) & 0xff);
  return s;
}

// A Strata-layout batch storing blocks [first, end) of `tokens` on the device (Strata's
// hashes: the router's), or clearing everything.
std::string store_payload(const std::vector<int32_t>& tokens, int first, int end) {
  const auto hashes = hash_blocks(tokens, kEventBlockSize);
  std::string out(1024 + tokens.size() * 10, '\0');
  char* p = out.data();
  p = mp_encode_array(p, 3);
  p = mp_encode_double(p, 1.0);
  p = mp_encode_array(p, 1);
  p = mp_encode_array(p, 7);
  p = mp_encode_str(p, "BlockStored", 11);
  p = mp_encode_array(p, static_cast<uint32_t>(end - first));
  for (int i = first; i < end; ++i) p = mp_encode_uint(p, hashes[i]);
  p = first == 0 ? mp_encode_nil(p) : mp_encode_uint(p, hashes[first - 1]);
  p = mp_encode_array(p, static_cast<uint32_t>((end - first) * kEventBlockSize));
  for (int i = first * kEventBlockSize; i < end * kEventBlockSize; ++i)
    p = mp_encode_uint(p, static_cast<uint64_t>(tokens[i]));
  p = mp_encode_uint(p, kEventBlockSize);
  p = mp_encode_nil(p);
  p = mp_encode_str(p, "GPU", 3);
  p = mp_encode_uint(p, 0);
  out.resize(static_cast<size_t>(p - out.data()));
  return out;
}

std::string empty_payload() {
  std::string out(32, '\0');
  char* p = mp_encode_array(out.data(), 3);
  p = mp_encode_double(p, 1.0);
  p = mp_encode_array(p, 0);
  p = mp_encode_uint(p, 0);
  out.resize(static_cast<size_t>(p - out.data()));
  return out;
}

bool wait_for(const std::function<bool()>& pred, double timeout_s = 10) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return pred();
}

// The worker side: PUB (used from the test's thread) and a replay ROUTER served by its own
// thread from a ring of published batches.
class FakeEventPublisher {
 public:
  FakeEventPublisher() {
    pub_.set(zmq::sockopt::linger, 0);
    pub_.bind("tcp://127.0.0.1:0");
    replay_.set(zmq::sockopt::linger, 0);
    replay_.bind("tcp://127.0.0.1:0");
    thread_ = std::thread([this] { serve(); });
  }
  ~FakeEventPublisher() {
    stop_ = true;
    thread_.join();
  }
  std::string pub_endpoint() const { return pub_.get(zmq::sockopt::last_endpoint); }
  std::string replay_endpoint() const { return replay_.get(zmq::sockopt::last_endpoint); }

  // Puts the batch in the ring and, unless `deliver` is false (a batch the subscriber
  // misses), publishes it.
  void publish(uint64_t seq, const std::string& payload, bool deliver = true) {
    {
      std::lock_guard lock(mutex_);
      ring_[seq] = payload;
    }
    if (!deliver) return;
    pub_.send(zmq::buffer(std::string("kv")), zmq::send_flags::sndmore);
    pub_.send(zmq::buffer(be64(seq)), zmq::send_flags::sndmore);
    pub_.send(zmq::buffer(payload), zmq::send_flags::none);
  }
  // The ring no longer holds batches before `seq`.
  void forget_before(uint64_t seq) {
    std::lock_guard lock(mutex_);
    ring_.erase(ring_.begin(), ring_.lower_bound(seq));
  }
  void reset_ring() {
    std::lock_guard lock(mutex_);
    ring_.clear();
  }
  void set_mute(bool mute) { mute_ = mute; }
  int replay_requests() const { return requests_.load(); }

 private:
  void serve() {
    while (!stop_) {
      zmq::pollitem_t item{replay_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(5));
      if ((item.revents & ZMQ_POLLIN) == 0) continue;
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(replay_, std::back_inserter(frames))) continue;
      ++requests_;
      if (mute_ || frames.size() != 3 || frames[2].size() != 8) continue;
      const auto* b = static_cast<const unsigned char*>(frames[2].data());
      uint64_t start = 0;
      for (int i = 0; i < 8; ++i) start = (start << 8) | b[i];
      const std::string id = frames[0].to_string();
      std::map<uint64_t, std::string> ring;
      {
        std::lock_guard lock(mutex_);
        ring = ring_;
      }
      const auto send = [&](const std::string& seq, const std::string& payload) {
        replay_.send(zmq::buffer(id), zmq::send_flags::sndmore);
        replay_.send(zmq::message_t(), zmq::send_flags::sndmore);
        replay_.send(zmq::buffer(seq), zmq::send_flags::sndmore);
        replay_.send(zmq::buffer(payload), zmq::send_flags::none);
      };
      for (auto it = ring.lower_bound(start); it != ring.end(); ++it)
        send(be64(it->first), it->second);
      send(be64(~uint64_t{0}), "");
    }
  }

  zmq::context_t ctx_{1};
  zmq::socket_t pub_{ctx_, zmq::socket_type::pub};
  zmq::socket_t replay_{ctx_, zmq::socket_type::router};
  std::mutex mutex_;
  std::map<uint64_t, std::string> ring_;  // GUARDED_BY(mutex_)
  std::atomic<bool> stop_{false};
  std::atomic<bool> mute_{false};
  std::atomic<int> requests_{0};
  std::thread thread_;
};

class EventSubscriberTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(index_.add_worker(kWorker, kEventBlockSize)); }

  void start(int replay_timeout_ms = 1000) {
    EventSubscriberOptions o;
    o.endpoint = worker_.pub_endpoint();
    o.replay_endpoint = worker_.replay_endpoint();
    o.replay_timeout_ms = replay_timeout_ms;
    auto s =
        EventSubscriber::start(kWorker, &index_, o, [this](WorkerId w, const std::string& reason) {
          EXPECT_EQ(w, kWorker);
          std::lock_guard lock(mutex_);
          stale_reasons_.push_back(reason);
        });
    ASSERT_TRUE(s) << s.error().message;
    sub_ = std::move(*s);
    // The slow joiner: publish empty batches until one arrives; the first one sets the
    // sequence.
    ASSERT_TRUE(wait_for([&] {
      worker_.publish(seq_++, empty_payload());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return sub_->stats().batches > 0;
    }));
    ASSERT_TRUE(wait_for([&] { return sub_->stats().last_seq == static_cast<int64_t>(seq_) - 1; }));
  }

  uint32_t matched(const std::vector<int32_t>& tokens) {
    const auto ms = index_.match(PrefixIndex::hash_tokens(tokens, kEventBlockSize));
    return ms.empty() ? 0 : ms[0].matched_blocks;
  }

  std::vector<std::string> stale_reasons() {
    std::lock_guard lock(mutex_);
    return stale_reasons_;
  }

  static constexpr WorkerId kWorker = 7;
  PrefixIndex index_;
  FakeEventPublisher worker_;
  std::unique_ptr<EventSubscriber> sub_;
  uint64_t seq_ = 0;
  std::mutex mutex_;
  std::vector<std::string> stale_reasons_;  // GUARDED_BY(mutex_)
  std::vector<int32_t> tokens_ = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
};

TEST_F(EventSubscriberTest, AppliesInOrderBatches) {
  start();
  worker_.publish(seq_++, store_payload(tokens_, 0, 2));
  worker_.publish(seq_++, store_payload(tokens_, 2, 4));
  ASSERT_TRUE(wait_for([&] { return matched(tokens_) == 4; }));
  const auto st = sub_->stats();
  EXPECT_EQ(st.gaps, 0u);
  EXPECT_EQ(st.decode_errors, 0u);
  EXPECT_EQ(st.last_seq, static_cast<int64_t>(seq_) - 1);
  EXPECT_GT(st.last_batch_ms, 0);
  EXPECT_EQ(st.events, 2u);
  EXPECT_TRUE(stale_reasons().empty());
  EXPECT_FALSE(index_.is_stale(kWorker));
}

TEST_F(EventSubscriberTest, RepairsAGapByReplay) {
  start();
  worker_.publish(seq_++, store_payload(tokens_, 0, 1), /*deliver=*/false);
  worker_.publish(seq_++, store_payload(tokens_, 1, 2), /*deliver=*/false);
  worker_.publish(seq_++, store_payload(tokens_, 2, 4));  // the gap shows here
  ASSERT_TRUE(wait_for([&] { return sub_->stats().replays_ok == 1; }));
  worker_.publish(seq_++, empty_payload());
  ASSERT_TRUE(wait_for([&] { return sub_->stats().last_seq == static_cast<int64_t>(seq_) - 1; }));
  EXPECT_EQ(matched(tokens_), 4u);  // the chain needed the replayed blocks
  const auto st = sub_->stats();
  EXPECT_EQ(st.gaps, 1u);
  EXPECT_EQ(st.missing_batches, 2u);
  EXPECT_EQ(st.replays_failed, 0u);
  EXPECT_EQ(index_.stats().workers[0].orphan_blocks, 0u);  // nothing applied twice or early
  EXPECT_EQ(index_.stats().workers[0].duplicate_copies, 0u);
  EXPECT_TRUE(stale_reasons().empty());
  EXPECT_FALSE(index_.is_stale(kWorker));
}

TEST_F(EventSubscriberTest, ARingThatLostTheRangeMarksTheWorkerStale) {
  start();
  worker_.publish(seq_++, store_payload(tokens_, 0, 2), /*deliver=*/false);
  worker_.forget_before(seq_);  // the ring dropped it
  worker_.publish(seq_++, store_payload(tokens_, 2, 4));
  ASSERT_TRUE(wait_for([&] { return sub_->stats().replays_failed == 1; }));
  ASSERT_TRUE(wait_for([&] { return !stale_reasons().empty(); }));
  EXPECT_TRUE(index_.is_stale(kWorker));
  EXPECT_NE(stale_reasons()[0].find("no longer holds"), std::string::npos) << stale_reasons()[0];
  // The stream goes on; the owner rebuilds and clears the mark.
  worker_.publish(seq_++, empty_payload());
  ASSERT_TRUE(wait_for([&] { return sub_->stats().last_seq == static_cast<int64_t>(seq_) - 1; }));
  EXPECT_EQ(index_.stats().workers[0].orphan_blocks, 2u);
  EXPECT_EQ(stale_reasons().size(), 1u);
}

TEST_F(EventSubscriberTest, AReplayThatTimesOutMarksTheWorkerStale) {
  start(/*replay_timeout_ms=*/200);
  worker_.set_mute(true);
  worker_.publish(seq_++, store_payload(tokens_, 0, 2), /*deliver=*/false);
  worker_.publish(seq_++, store_payload(tokens_, 2, 4));
  ASSERT_TRUE(wait_for([&] { return sub_->stats().replays_failed == 1; }));
  // The failure is counted before the worker is marked stale: wait for the mark too (a CI
  // run saw the count without it).
  ASSERT_TRUE(wait_for([&] { return !stale_reasons().empty(); }));
  EXPECT_TRUE(index_.is_stale(kWorker));
  ASSERT_EQ(stale_reasons().size(), 1u);
  EXPECT_NE(stale_reasons()[0].find("timed out"), std::string::npos) << stale_reasons()[0];
  EXPECT_EQ(worker_.replay_requests(), 1);
  // Repaired by the owner, then a later gap is repaired by replay again.
  index_.rebuild_worker(kWorker, {});
  index_.mark_stale(kWorker, false);
  worker_.set_mute(false);
  worker_.publish(seq_++, store_payload(tokens_, 0, 1), /*deliver=*/false);
  worker_.publish(seq_++, store_payload(tokens_, 1, 4));
  ASSERT_TRUE(wait_for([&] { return sub_->stats().replays_ok == 1; }));
  EXPECT_EQ(matched(tokens_), 4u);
  EXPECT_FALSE(index_.is_stale(kWorker));
}

TEST_F(EventSubscriberTest, ARestartClearsTheWorkerAndResyncs) {
  start();
  worker_.publish(seq_++, store_payload(tokens_, 0, 4));
  ASSERT_TRUE(wait_for([&] { return matched(tokens_) == 4; }));
  // The worker restarts: its ring and its sequence begin again.
  worker_.reset_ring();
  const std::vector<int32_t> other = {9, 9, 9, 9, 8, 8, 8, 8};
  seq_ = 0;
  worker_.publish(seq_++, store_payload(other, 0, 1), /*deliver=*/false);
  worker_.publish(seq_++, store_payload(other, 1, 2));  // seq 1: replayed from 0
  // The subscriber counts the restart and the sequence before the replayed batches reach the
  // index (a ThreadSanitizer run saw the counts without the blocks): wait for the blocks too.
  ASSERT_TRUE(wait_for([&] {
    return sub_->stats().restarts == 1 && sub_->stats().last_seq == 1 && matched(other) == 2 &&
           !stale_reasons().empty();
  }));
  EXPECT_EQ(matched(tokens_), 0u);
  EXPECT_EQ(matched(other), 2u);
  ASSERT_EQ(stale_reasons().size(), 1u);
  EXPECT_NE(stale_reasons()[0].find("restarted"), std::string::npos);
  EXPECT_TRUE(index_.is_stale(kWorker));
}

TEST_F(EventSubscriberTest, ASnapshotResyncReplaysWhatItsInstallReplaced) {
  start();
  const uint64_t snapshot_next = seq_;
  worker_.publish(seq_++, store_payload(tokens_, 0, 2));
  worker_.publish(seq_++, store_payload(tokens_, 2, 4));
  ASSERT_TRUE(wait_for([&] { return matched(tokens_) == 4; }));
  // The owner installs a tree read before those batches: they are gone from the index...
  index_.rebuild_worker(kWorker, {});
  ASSERT_EQ(matched(tokens_), 0u);
  // ...until the subscriber replays from the snapshot's sequence number.
  sub_->resync(snapshot_next);
  ASSERT_TRUE(wait_for([&] { return matched(tokens_) == 4 && sub_->stats().replays_ok == 1; }));
  EXPECT_EQ(sub_->stats().last_seq, static_cast<int64_t>(seq_) - 1);
  EXPECT_EQ(sub_->stats().restarts, 0u);
  EXPECT_TRUE(stale_reasons().empty());
  // The stream goes on from there.
  worker_.publish(seq_++, empty_payload());
  ASSERT_TRUE(wait_for([&] { return sub_->stats().last_seq == static_cast<int64_t>(seq_) - 1; }));
  EXPECT_EQ(sub_->stats().gaps, 0u);
}

TEST_F(EventSubscriberTest, ASnapshotAheadOfTheStreamDropsBatchesStillInFlight) {
  start();
  const uint64_t late = seq_++;
  worker_.publish(late, store_payload(tokens_, 0, 2), /*deliver=*/false);
  // The snapshot already holds batch `late`; it arrives afterwards.
  sub_->resync(seq_);
  ASSERT_TRUE(wait_for([&] { return sub_->stats().last_seq == static_cast<int64_t>(late); }));
  worker_.publish(late, store_payload(tokens_, 0, 2));
  worker_.publish(seq_++, store_payload(tokens_, 2, 4));
  ASSERT_TRUE(wait_for([&] { return sub_->stats().last_seq == static_cast<int64_t>(seq_) - 1; }));
  EXPECT_EQ(sub_->stats().restarts, 0u);  // an old batch, not a new process
  EXPECT_EQ(sub_->stats().gaps, 0u);
  EXPECT_TRUE(stale_reasons().empty());
  EXPECT_FALSE(index_.is_stale(kWorker));
}

TEST_F(EventSubscriberTest, ARestartTheOwnerSawStartsTheSequenceAgain) {
  start();
  worker_.publish(seq_++, store_payload(tokens_, 0, 4));
  ASSERT_TRUE(wait_for([&] { return matched(tokens_) == 4; }));
  // The owner sees a new instance id: it forgets the worker, then installs the new
  // process's tree, which holds its batch 0.
  worker_.reset_ring();
  seq_ = 0;
  const std::vector<int32_t> other = {9, 9, 9, 9, 8, 8, 8, 8};
  worker_.publish(seq_++, store_payload(other, 0, 1), /*deliver=*/false);
  index_.reset_worker(kWorker);
  sub_->restarted();
  sub_->resync(seq_);
  ASSERT_TRUE(wait_for([&] { return sub_->stats().last_seq == 0; }));
  worker_.publish(seq_++, store_payload(other, 1, 2));
  ASSERT_TRUE(wait_for([&] { return sub_->stats().last_seq == 1; }));
  const auto st = sub_->stats();
  EXPECT_EQ(st.restarts, 0u);  // the owner had said so: no second reset
  EXPECT_EQ(st.replays_failed, 0u);
  EXPECT_EQ(st.gaps, 0u);
  EXPECT_TRUE(stale_reasons().empty());
  EXPECT_EQ(matched(tokens_), 0u);
}

TEST_F(EventSubscriberTest, TheWorkersCountRevealsBatchesNoLaterBatchShows) {
  start();
  // Lost (sent before the subscription took effect, say), and nothing follows it.
  worker_.publish(seq_++, store_payload(tokens_, 0, 4), /*deliver=*/false);
  sub_->note_published(seq_);
  ASSERT_TRUE(wait_for([&] { return matched(tokens_) == 4 && sub_->stats().replays_ok == 1; }));
  const auto st = sub_->stats();
  EXPECT_EQ(st.gaps, 1u);
  EXPECT_EQ(st.missing_batches, 1u);
  EXPECT_EQ(st.last_seq, static_cast<int64_t>(seq_) - 1);
  EXPECT_TRUE(stale_reasons().empty());
  // A count the subscriber has already reached changes nothing.
  sub_->note_published(seq_);
  worker_.publish(seq_++, empty_payload());
  ASSERT_TRUE(wait_for([&] { return sub_->stats().last_seq == static_cast<int64_t>(seq_) - 1; }));
  EXPECT_EQ(sub_->stats().gaps, 1u);
  EXPECT_EQ(worker_.replay_requests(), 1);
}

TEST_F(EventSubscriberTest, ACountTheRingCannotSupplyMarksTheWorkerStale) {
  start();
  sub_->note_published(seq_ + 3);  // batches the worker's ring never held
  ASSERT_TRUE(wait_for([&] { return sub_->stats().replays_failed == 1; }));
  ASSERT_TRUE(wait_for([&] { return !stale_reasons().empty(); }));
  EXPECT_TRUE(index_.is_stale(kWorker));
  EXPECT_NE(stale_reasons()[0].find("the replay ended at"), std::string::npos)
      << stale_reasons()[0];
}

TEST(EventSubscriberStartTest, DoesNotWaitForTheWorkerAndStopsCleanly) {
  PrefixIndex index;
  ASSERT_TRUE(index.add_worker(0, kEventBlockSize));
  EventSubscriberOptions o;
  o.endpoint = "tcp://127.0.0.1:9";  // nothing listens there
  auto s = EventSubscriber::start(0, &index, o, nullptr);
  ASSERT_TRUE(s) << s.error().message;
  (*s)->stop();
  (*s)->stop();  // idempotent
  EXPECT_EQ((*s)->stats().batches, 0u);
  o.poll_interval_ms = 0;
  EXPECT_FALSE(EventSubscriber::start(0, &index, o, nullptr));
  o.poll_interval_ms = 20;
  o.published_grace_ms = -1;
  EXPECT_FALSE(EventSubscriber::start(0, &index, o, nullptr));
  o.published_grace_ms = 500;
  o.endpoint = "not an endpoint";
  EXPECT_FALSE(EventSubscriber::start(0, &index, o, nullptr));
}

}  // namespace
}  // namespace strata::router
