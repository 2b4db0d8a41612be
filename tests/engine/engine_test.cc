#include "engine/engine.h"
#include "engine/engine_test_access.h"

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <thread>

#include "engine_test_util.h"
#include "model/make_model.h"
#include "test_device.h"

namespace strata {
namespace {

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    STRATA_TEST_MODEL(model_, ModelPreset::kTiny, Architecture::kLlama, 7,
                      ModelOptions{.num_threads = 1});
  }

  std::unique_ptr<Engine> start(EngineOptions opts) {
    auto e = create_test_engine(model_, opts, [this](std::vector<KvEvent> batch) {
      std::lock_guard lock(events_mutex_);
      for (auto& ev : batch) events_.push_back(std::move(ev));
    });
    EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().message);
    return e ? std::move(*e) : nullptr;
  }

  RequestSpec greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
    RequestSpec spec;
    spec.prompt = std::move(prompt);
    spec.sampling.temperature = 0;
    spec.max_tokens = max_tokens;
    return spec;
  }

  std::vector<int32_t> prompt(int n, int salt) {
    std::vector<int32_t> p;
    std::mt19937 rng(static_cast<uint32_t>(salt));
    for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(rng() % 200) + 3);
    return p;
  }

  void expect_pages_accounted(Engine& engine) {
    auto st = engine_call(engine, [](EngineState& s) { return s.audit_pages(); }).get();
    EXPECT_TRUE(st.has_value()) << st.error().message;
    auto inv = engine_call(engine, [](EngineState& s) { return s.tree.check_invariants(); }).get();
    EXPECT_TRUE(inv.has_value()) << inv.error().message;
  }

  TestModel model_;  // before the engines that run on it
  std::mutex events_mutex_;
  std::vector<KvEvent> events_;
};

TEST_F(EngineTest, RepeatedPromptIsServedFromCacheWithTheSameGreedyOutput) {
  auto engine = start(EngineOptions{.page_size = 4, .kv_cache_tokens = 1024});
  const auto p = prompt(37, 1);
  Outcome first = drain(**engine->submit(greedy(p, 8)));
  EXPECT_EQ(first.reason, FinishReason::kLength);
  EXPECT_EQ(first.tokens.size(), 8u);
  EXPECT_EQ(first.usage.cached_tokens, 0);
  EXPECT_EQ(first.usage.prompt_tokens, 37);
  Outcome second = drain(**engine->submit(greedy(p, 8)));
  EXPECT_EQ(second.tokens, first.tokens);
  EXPECT_EQ(second.usage.cached_tokens, 36);  // all full pages of prompt[0:36]
  expect_pages_accounted(*engine);
}

// --kv-cache-memory sizes the pool by its pages' bytes, scales included: the same budget
// holds more int8 pages than BF16 ones, and an int8 pool serves a repeated prompt from its
// cache with the same greedy output (issue 54).
TEST_F(EngineTest, KvCacheMemorySizesThePoolByThePagesBytes) {
  const ModelConfig& c = model_.config();
  const int64_t budget = 3'000'000;
  if (test_device().value_or(TestDevice::kCpu) != TestDevice::kCpu) {
    // A model with KV memory of its own (own-kv, cuda) keeps its pages in its own dtype:
    // 8-bit pages are refused at start, naming the flag (external_kv_test.cc).
    auto refused = create_test_engine(
        model_,
        EngineOptions{.page_size = 4, .kv_cache_memory_bytes = budget, .kv_dtype = KvDtype::kInt8});
    ASSERT_FALSE(refused);
    EXPECT_NE(refused.error().message.find("--kv-cache-dtype int8"), std::string::npos)
        << refused.error().message;
    return;
  }
  auto pages_of = [&](KvDtype dtype) {
    return budget / static_cast<int64_t>(kv_page_bytes(
                        KvPoolShape{c.num_layers, c.num_kv_heads, c.head_dim, 1, 4, dtype}));
  };
  auto bf16 = start(
      EngineOptions{.page_size = 4, .kv_cache_memory_bytes = budget, .kv_dtype = KvDtype::kBF16});
  auto int8 = start(
      EngineOptions{.page_size = 4, .kv_cache_memory_bytes = budget, .kv_dtype = KvDtype::kInt8});
  ASSERT_TRUE(bf16 && int8);
  EXPECT_EQ(bf16->num_pages(), pages_of(KvDtype::kBF16));
  EXPECT_EQ(int8->num_pages(), pages_of(KvDtype::kInt8));
  EXPECT_GT(int8->num_pages(), bf16->num_pages() * 3 / 2);
  auto state = int8->cache().state().get();
  ASSERT_TRUE(state);
  EXPECT_EQ(state->kv_dtype, "int8");
  EXPECT_EQ(state->device.page_bytes,
            static_cast<int64_t>(kv_page_bytes(
                KvPoolShape{c.num_layers, c.num_kv_heads, c.head_dim, 1, 4, KvDtype::kInt8})));
  const auto p = prompt(37, 2);
  Outcome first = drain(**int8->submit(greedy(p, 8)));
  Outcome second = drain(**int8->submit(greedy(p, 8)));
  EXPECT_EQ(first.tokens.size(), 8u);
  EXPECT_EQ(second.tokens, first.tokens);
  EXPECT_EQ(second.usage.cached_tokens, 36);
  expect_pages_accounted(*int8);
  // A budget below 4 pages is refused, naming the flag.
  auto tiny =
      create_test_engine(model_, EngineOptions{.page_size = 4, .kv_cache_memory_bytes = 1000});
  ASSERT_FALSE(tiny);
  EXPECT_NE(tiny.error().message.find("--kv-cache-memory"), std::string::npos);
}

TEST_F(EngineTest, OutputTokensAreCachedForTheNextTurn) {
  auto engine = start(EngineOptions{.page_size = 4, .kv_cache_tokens = 1024});
  auto p = prompt(20, 2);
  Outcome first = drain(**engine->submit(greedy(p, 12)));
  // The next turn continues the conversation: prompt + answer + new tokens.
  std::vector<int32_t> next = p;
  next.insert(next.end(), first.tokens.begin(), first.tokens.end());
  for (int i = 0; i < 6; ++i) next.push_back(100 + i);
  Outcome second = drain(**engine->submit(greedy(next, 4)));
  // Everything computed before (prompt + 11 fed-back tokens = 31) in full pages: 28.
  EXPECT_EQ(second.usage.cached_tokens, 28);
  expect_pages_accounted(*engine);
}

TEST_F(EngineTest, ConcurrentRequestsMatchTheirSoloOutputs) {
  auto engine = start(EngineOptions{.page_size = 4,
                                    .kv_cache_tokens = 4096,
                                    .max_running_requests = 8,
                                    .chunked_prefill_size = 16});
  std::vector<std::vector<int32_t>> prompts;
  std::vector<Outcome> solo;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(prompt(10 + 7 * i, 10 + i));
    solo.push_back(drain(**engine->submit(greedy(prompts.back(), 10))));
  }
  ASSERT_TRUE(
      engine_call(*engine, [](EngineState& s) { return s.tree.reset(); }).get().has_value());
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& p : prompts) streams.push_back(*engine->submit(greedy(p, 10)));
  for (size_t i = 0; i < streams.size(); ++i) {
    Outcome o = drain(*streams[i]);
    EXPECT_EQ(o.tokens, solo[i].tokens) << "request " << i;
  }
  expect_pages_accounted(*engine);
}

TEST_F(EngineTest, CancelReleasesPagesAtOnce) {
  auto engine = start(EngineOptions{.page_size = 4, .kv_cache_tokens = 1024});
  auto stream = *engine->submit(greedy(prompt(30, 3), 100000));
  // Let it run a little, then cancel.
  for (int i = 0; i < 200; ++i) {
    auto items = stream->wait(10);
    if (!items.empty()) break;
  }
  stream->cancel();
  Outcome o = drain(*stream);
  EXPECT_EQ(o.reason, FinishReason::kCancelled);
  auto private_pages =
      engine_call(*engine, [](EngineState& s) { return s.request_private_pages; }).get();
  EXPECT_EQ(private_pages, 0);
  expect_pages_accounted(*engine);
}

// Destroying an engine mid-decode ends its requests and returns, wherever the scheduler
// thread was in its step. It used to stop the forward thread at the same time as the
// scheduler thread: a step that had not yet seen the stop then handed the exited forward
// thread a batch and waited for it forever (a CI hang under ThreadSanitizer). The delays
// spread the destruction over the phases of a step.
TEST_F(EngineTest, DestroyedMidDecodeEndsItsRequestsAndNeverHangs) {
  for (int i = 0; i < 60; ++i) {
    auto engine = start(EngineOptions{.page_size = 4, .kv_cache_tokens = 1024});
    ASSERT_TRUE(engine);
    auto stream = *engine->submit(greedy(prompt(20, i), 100000));
    for (int w = 0; w < 200 && stream->wait(10).empty(); ++w) {
    }
    std::this_thread::sleep_for(std::chrono::microseconds(97 * (i % 11)));
    engine.reset();
    EXPECT_EQ(drain(*stream).reason, FinishReason::kCancelled) << i;
  }
}

TEST_F(EngineTest, TightPoolEvictsAndRetractsButFinishesEverything) {
  // 40 pages of 4 tokens; 8 requests of ~60 tokens each cannot all fit at once.
  auto engine = start(EngineOptions{.page_size = 4,
                                    .kv_cache_tokens = 160,
                                    .max_running_requests = 8,
                                    .chunked_prefill_size = 32});
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int i = 0; i < 8; ++i) streams.push_back(*engine->submit(greedy(prompt(40, 30 + i), 20)));
  for (auto& s : streams) {
    Outcome o = drain(*s);
    EXPECT_EQ(o.reason, FinishReason::kLength);
    EXPECT_EQ(o.tokens.size(), 20u);
  }
  expect_pages_accounted(*engine);
}

TEST_F(EngineTest, LockedPrefixesNeverLivelockTheScheduler) {
  // The fuzz suite's livelock (tests/fuzz/repro_scheduler_livelock.mjs): 128 pages; 8
  // cached 12-page prefixes; 8 concurrent requests on them, the first adding 50 pages and
  // the others 2 to 4. Retracting one request per step and re-admitting it at once used
  // to stall every request; now each finishes (drain() fails after 60 s).
  auto engine = start(EngineOptions{.page_size = 16,
                                    .kv_cache_tokens = 2048,
                                    .max_running_requests = 8,
                                    .chunked_prefill_size = 2048});
  std::vector<std::vector<int32_t>> prefixes;
  for (int k = 0; k < 8; ++k) prefixes.push_back(prompt(16 * 12, 2000 + k));
  for (int round = 0; round < 10; ++round) {
    for (const auto& p : prefixes) drain(**engine->submit(greedy(p, 1)));
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int k = 0; k < 8; ++k) {
      std::vector<int32_t> p = prefixes[static_cast<size_t>(k)];
      const auto more = prompt(k == 0 ? 16 * 50 : 16 * (2 + (k + round) % 3), 3000 + round * 8 + k);
      p.insert(p.end(), more.begin(), more.end());
      streams.push_back(*engine->submit(greedy(p, 4)));
    }
    for (auto& s : streams) {
      const Outcome o = drain(*s);
      ASSERT_EQ(o.reason, FinishReason::kLength) << "round " << round << ": " << o.error;
    }
  }
  expect_pages_accounted(*engine);
}

TEST_F(EngineTest, PinsNeverDeadlockTheScheduler) {
  auto engine = start(EngineOptions{.page_size = 4, .kv_cache_tokens = 128});
  // Fill the pool with a pinned prompt, then send one that needs most of the pool.
  const auto vip = prompt(100, 4);
  drain(**engine->submit(greedy(vip, 1)));
  const auto hashes = hash_blocks(vip, 4);
  auto pinned =
      engine_call(*engine, [&](EngineState& s) { return s.tree.pin(hashes).pinned; }).get();
  EXPECT_EQ(pinned, 25);
  Outcome big = drain(**engine->submit(greedy(prompt(90, 5), 4)));
  EXPECT_EQ(big.reason, FinishReason::kLength);
  EXPECT_GT(engine->counters().auto_unpinned_blocks, 0u);
  expect_pages_accounted(*engine);
}

TEST_F(EngineTest, BadRequestsAreRefusedAndChangeNothing) {
  auto engine = start(EngineOptions{.page_size = 4, .kv_cache_tokens = 64});
  EXPECT_FALSE(engine->submit(greedy({}, 4)).has_value());
  EXPECT_FALSE(engine->submit(greedy({1, 2, 1 << 30}, 4)).has_value());
  EXPECT_FALSE(engine->submit(greedy({1, 2}, 0)).has_value());
  auto too_big = engine->submit(greedy(prompt(200, 6), 4));
  ASSERT_FALSE(too_big.has_value());
  EXPECT_EQ(too_big.error().code, ErrorCode::kResourceExhausted);
  RequestSpec bad_sampling = greedy({1, 2, 3}, 2);
  bad_sampling.sampling.top_p = 0;
  EXPECT_FALSE(engine->submit(bad_sampling).has_value());
  EXPECT_EQ(engine->counters().requests_finished, 0u);
  expect_pages_accounted(*engine);
}

TEST_F(EngineTest, SaltsIsolateTenants) {
  auto engine = start(EngineOptions{.page_size = 4, .kv_cache_tokens = 1024});
  auto spec = greedy(prompt(33, 7), 2);
  spec.cache_salt = "a";
  drain(**engine->submit(spec));
  spec.cache_salt = "b";
  EXPECT_EQ(drain(**engine->submit(spec)).usage.cached_tokens, 0);
  spec.cache_salt = "a";
  EXPECT_EQ(drain(**engine->submit(spec)).usage.cached_tokens, 32);
}

TEST_F(EngineTest, EventsReplayToTheTreeState) {
  auto engine = start(EngineOptions{.page_size = 4, .kv_cache_tokens = 256});
  for (int i = 0; i < 10; ++i) drain(**engine->submit(greedy(prompt(30, 40 + i), 6)));
  auto state = engine_call(*engine, [](EngineState& s) { return s.tree.all_block_hashes(); }).get();
  std::set<BlockHash> replayed;
  {
    std::lock_guard lock(events_mutex_);
    for (const auto& e : events_) {
      if (const auto* st = std::get_if<BlockStored>(&e)) {
        for (BlockHash h : st->block_hashes) EXPECT_TRUE(replayed.insert(h).second);
      } else if (const auto* rm = std::get_if<BlockRemoved>(&e)) {
        for (BlockHash h : rm->block_hashes) EXPECT_EQ(replayed.erase(h), 1u);
      } else {
        replayed.clear();
      }
    }
  }
  EXPECT_EQ(replayed, std::set<BlockHash>(state.begin(), state.end()));
}

}  // namespace
}  // namespace strata
