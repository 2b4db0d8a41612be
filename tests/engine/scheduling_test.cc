// The scheduler's order and room-making with a real (tiny) model: request priorities, a
// resumed tool session and pinned VIP traffic jump the queue, a restore under a full pool
// does not wait for running requests, and output never exceeds what the pool can hold.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "cache/block_hash.h"
#include "engine/engine.h"
#include "engine/engine_test_access.h"
#include "engine_test_util.h"
#include "model/make_model.h"
#include "test_device.h"

namespace strata {
namespace {

class SchedulingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    STRATA_TEST_MODEL(model_, ModelPreset::kTiny, Architecture::kLlama, 17,
                      ModelOptions{.num_threads = 1});
  }

  std::unique_ptr<Engine> start(EngineOptions o) {
    auto e = create_test_engine(model_, o, {});
    EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().message);
    return e ? std::move(*e) : nullptr;
  }
  static EngineOptions serial() {
    EngineOptions o;
    o.page_size = 16;
    o.kv_cache_tokens = 4096;
    o.max_running_requests = 1;  // one at a time: the finish order is the admission order
    return o;
  }
  static RequestSpec spec(std::vector<int32_t> prompt, int32_t max_tokens, int32_t priority = 0,
                          std::string session = {}) {
    RequestSpec s;
    s.prompt = std::move(prompt);
    s.sampling.temperature = 0;
    s.max_tokens = max_tokens;
    s.priority = priority;
    s.session_id = std::move(session);
    return s;
  }

  // Submits a request that holds the only running slot until cancel_blocker().
  void block(Engine& e) {
    auto s = e.submit(spec(test_prompt(32, 999), 100'000));
    ASSERT_TRUE(s.has_value());
    blocker_ = *s;
    while (e.counters().running == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void cancel_blocker() {
    blocker_->cancel();
    drain(*blocker_);
  }
  // Submits and records the order in which requests finish under `name`.
  std::shared_ptr<RequestStream> submit(Engine& e, RequestSpec s, const std::string& name) {
    auto stream = e.submit(std::move(s));
    EXPECT_TRUE(stream.has_value());
    if (!stream) return nullptr;
    auto st = *stream;
    st->set_listener([this, name] {
      // Runs under the stream's lock; the first item (a token or the finish) records it.
      std::lock_guard lock(order_mutex_);
      if (std::find(order_.begin(), order_.end(), name) == order_.end()) order_.push_back(name);
    });
    return st;
  }
  // Waits until `n` requests were recorded; returns their order.
  std::vector<std::string> order(size_t n) {
    for (int i = 0; i < 10'000; ++i) {
      {
        std::lock_guard lock(order_mutex_);
        if (order_.size() >= n) return order_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::lock_guard lock(order_mutex_);
    return order_;
  }

  TestModel model_;  // before the engines that run on it
  std::shared_ptr<RequestStream> blocker_;
  std::mutex order_mutex_;
  std::vector<std::string> order_;  // first item (token or finish) per request
};

TEST_F(SchedulingTest, LowerPriorityValuesAreServedFirst) {
  auto e = start(serial());
  block(*e);
  std::vector<std::shared_ptr<RequestStream>> streams;
  streams.push_back(submit(*e, spec(test_prompt(40, 1), 2, 50), "low"));
  streams.push_back(submit(*e, spec(test_prompt(40, 2), 2, 0), "normal"));
  streams.push_back(submit(*e, spec(test_prompt(40, 3), 2, -50), "high"));
  streams.push_back(submit(*e, spec(test_prompt(40, 4), 2, 0), "normal2"));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // all queued behind the blocker
  cancel_blocker();
  EXPECT_EQ(order(4), (std::vector<std::string>{"high", "normal", "normal2", "low"}));
  for (auto& s : streams) EXPECT_EQ(drain(*s).reason, FinishReason::kLength);
  expect_engine_consistent(*e);
}

TEST_F(SchedulingTest, APriorityOutsideItsRangeIsRefused) {
  auto e = start(serial());
  auto bad = e->submit(spec(test_prompt(10, 1), 2, 101));
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidArgument);
  EXPECT_FALSE(e->submit(spec(test_prompt(10, 1), 2, -101)).has_value());
  EXPECT_TRUE(e->submit(spec(test_prompt(10, 1), 2, -100)).has_value());
}

TEST_F(SchedulingTest, PinnedVipTrafficGoesBeforeEarlierOrdinaryRequests) {
  auto e = start(serial());
  const auto vip_prefix = test_prompt(64, 50);
  run_greedy(*e, vip_prefix, 1);
  PinCommand pin;
  pin.hashes = hash_blocks(vip_prefix, 16, "");
  auto pinned = e->cache().pin(pin).get();
  ASSERT_TRUE(pinned.has_value());
  ASSERT_EQ(pinned->pinned, 4);
  block(*e);
  auto vip_prompt = vip_prefix;
  const auto tail = test_prompt(10, 51);
  vip_prompt.insert(vip_prompt.end(), tail.begin(), tail.end());
  auto a = submit(*e, spec(test_prompt(40, 5), 2, -100), "ordinary");
  auto b = submit(*e, spec(vip_prompt, 2), "vip");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  cancel_blocker();
  EXPECT_EQ(order(2), (std::vector<std::string>{"vip", "ordinary"}));
  drain(*a);
  drain(*b);
  expect_engine_consistent(*e);
}

TEST_F(SchedulingTest, AClientsOwnSoftPinGivesNoClass) {
  auto e = start(serial());
  const auto prefix = test_prompt(64, 60);
  run_greedy(*e, prefix, 1);
  PinCommand pin;
  pin.hashes = hash_blocks(prefix, 16, "");
  pin.ttl_ms = 60'000;
  pin.priority = PinPriority::lowest();
  pin.authority = PinAuthority::kClient;
  ASSERT_TRUE(e->cache().pin(pin).get().has_value());
  block(*e);
  auto first = submit(*e, spec(test_prompt(40, 6), 2), "first");
  auto second = submit(*e, spec(prefix, 2), "client-pinned");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  cancel_blocker();
  EXPECT_EQ(order(2), (std::vector<std::string>{"first", "client-pinned"}));
  drain(*first);
  drain(*second);
}

EngineOptions hierarchical(int32_t device_tokens, int32_t max_running) {
  EngineOptions o;
  o.page_size = 16;
  o.kv_cache_tokens = device_tokens;
  o.max_running_requests = max_running;
  o.chunked_prefill_size = 256;
  o.hicache.enabled = true;
  o.hicache.ratio = 4.0;
  return o;
}

ToolSessionView settled(Engine& e, const std::string& id) {
  for (int i = 0; i < 5000; ++i) {
    auto v = e.cache().kv_meta(id).get();
    EXPECT_TRUE(v.has_value());
    if (!v) return {};
    if (v->state != ToolSessionState::kOffloading && v->state != ToolSessionState::kRestoring) {
      return *v;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ADD_FAILURE() << "session never settled";
  return {};
}

TEST_F(SchedulingTest, TheNextTurnOfARestoredSessionGoesFirst) {
  auto e = start(hierarchical(2048, 1));
  const auto turn = test_prompt(200, 7);
  const Outcome first = run_greedy(*e, turn, 4, "agent");
  ASSERT_TRUE(e->cache().tool_start("agent").get().has_value());
  settled(*e, "agent");
  ASSERT_TRUE(e->cache().tool_end("agent", 1).get().has_value());
  settled(*e, "agent");
  block(*e);
  auto other = submit(*e, spec(test_prompt(40, 8), 2, -100), "other");
  std::vector<int32_t> next = turn;
  next.insert(next.end(), first.tokens.begin(), first.tokens.end());
  auto resumed = submit(*e, spec(next, 2, 100, "agent"), "resumed");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  cancel_blocker();
  EXPECT_EQ(order(2), (std::vector<std::string>{"resumed", "other"}));
  EXPECT_GE(drain(*resumed).usage.cached_device, 192);
  drain(*other);
  expect_engine_consistent(*e);
}

// A restore under a full pool: running requests hold the device, and tool_end makes
// room at once by retracting them (their pages stay cached) instead of failing or
// waiting for them to finish. They resume afterwards with unchanged output.
TEST_F(SchedulingTest, ARestoreUnderAFullPoolDoesNotWaitForRunningRequests) {
  auto e = start(hierarchical(2048, 4));  // 128 device pages
  const auto turn = test_prompt(1000, 9);
  const Outcome first = run_greedy(*e, turn, 8, "a");
  ASSERT_TRUE(e->cache().tool_start("a").get().has_value());
  settled(*e, "a");
  const auto hog_prompt = test_prompt(1500, 10);
  auto cold = start(hierarchical(2048, 4));
  const Outcome alone = run_greedy(*cold, hog_prompt, 500);
  cold.reset();
  auto hog = e->submit(spec(hog_prompt, 500));
  ASSERT_TRUE(hog.has_value());
  // Once the hog decodes it holds 95 or more of the 128 pages: the restore needs 63.
  std::vector<int32_t> hog_tokens;
  while (hog_tokens.empty()) {
    for (StreamItem& item : (*hog)->wait(10)) {
      ASSERT_FALSE(item.finish.has_value()) << item.error;
      for (const auto& t : item.tokens) hog_tokens.push_back(t.token);
    }
  }
  // The retracted hog's pages leave the device once their write-through copies land: a
  // tool_end that comes too soon answers kOutOfPages, and the server retries it (every
  // 5 ms). The hog never finishes first.
  auto ended = e->cache().tool_end("a", 1).get();
  for (int i = 0; i < 400 && !ended && ended.error().code == ErrorCode::kOutOfPages; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ended = e->cache().tool_end("a", 1).get();
  }
  ASSERT_TRUE(ended.has_value()) << ended.error().message;
  EXPECT_EQ(settled(*e, "a").tier, "device");
  // (Counters are published at the end of a scheduler iteration; a command may run in the
  // middle of one, during the forward pass: wait for the publication.)
  for (int i = 0; i < 200 && e->counters().requests_preempted == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(e->counters().restores_made_room, 1u);
  EXPECT_GE(e->counters().requests_preempted, 1u);
  std::vector<int32_t> next = turn;
  next.insert(next.end(), first.tokens.begin(), first.tokens.end());
  EXPECT_GE(run_greedy(*e, next, 2, "a").usage.cached_device, 992);
  const Outcome h = drain(**hog);
  EXPECT_EQ(h.reason, FinishReason::kLength) << h.error;
  hog_tokens.insert(hog_tokens.end(), h.tokens.begin(), h.tokens.end());
  EXPECT_EQ(hog_tokens, alone.tokens) << "a retracted request resumes with the same output";
  expect_engine_consistent(*e);
}

// Found by the request fuzzer: a request without max_tokens on a pool smaller than the
// context failed with "cannot fit the KV pool". Output is now capped by the pool: the
// request ends with kLength once prompt + output fill it.
// Two prompts sharing 960 tokens arrive together: the second waits for the first's prefill
// of them (--shared-prefill-wait-tokens) and matches them, instead of computing them too.
TEST_F(SchedulingTest, APromptSharedWithOneBeingPrefilledWaitsForItsPages) {
  std::vector<int32_t> a = test_prompt(1000, 41);
  std::vector<int32_t> b(a.begin(), a.begin() + 960);
  const std::vector<int32_t> tail = test_prompt(40, 42);
  b.insert(b.end(), tail.begin(), tail.end());
  EngineOptions o = serial();
  o.max_running_requests = 4;
  o.chunked_prefill_size = 128;  // the first prompt takes eight steps
  const Outcome b_alone = run_greedy(*start(o), b, 4);
  for (int32_t wait_tokens : {64, 0}) {
    SCOPED_TRACE("--shared-prefill-wait-tokens " + std::to_string(wait_tokens));
    o.shared_prefill_wait_tokens = wait_tokens;
    auto e = start(o);
    // Submitted from the scheduler thread, so that both reach the same admission.
    std::shared_ptr<RequestStream> first, second;
    engine_call(*e, [&](EngineState&) {
      first = *e->submit(spec(a, 4));
      second = *e->submit(spec(b, 4));
      return 0;
    }).get();
    const Outcome got_a = drain(*first);
    const Outcome got_b = drain(*second);
    EXPECT_EQ(got_b.tokens, b_alone.tokens);
    EXPECT_EQ(got_a.usage.cached_tokens, 0);
    if (wait_tokens > 0) {
      EXPECT_EQ(got_b.usage.cached_tokens, 960);
      EXPECT_EQ(e->counters().shared_prefill_waits, 1u);
    } else {
      EXPECT_EQ(got_b.usage.cached_tokens, 0);  // admitted beside it: computed it all
      EXPECT_EQ(e->counters().shared_prefill_waits, 0u);
    }
  }
}

TEST_F(SchedulingTest, OutputBeyondThePoolEndsWithLengthNotAnError) {
  EngineOptions o = serial();
  o.kv_cache_tokens = 256;
  auto e = start(o);
  ASSERT_LT(256, model_.config().max_position_embeddings);
  const Outcome out = run_greedy(*e, test_prompt(100, 11), 1'000'000);
  EXPECT_EQ(out.reason, FinishReason::kLength) << out.error;
  EXPECT_EQ(out.tokens.size(), 156u);  // 256 - 100
  // Two at once share the pool: retraction takes turns, both still end with kLength.
  o.max_running_requests = 2;
  auto e2 = start(o);
  auto a = e2->submit(spec(test_prompt(100, 12), 1'000'000));
  auto b = e2->submit(spec(test_prompt(120, 13), 1'000'000));
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(drain(**a).reason, FinishReason::kLength);
  EXPECT_EQ(drain(**b).reason, FinishReason::kLength);
  expect_engine_consistent(*e2);
}

}  // namespace
}  // namespace strata
