// Tool-call sessions inside the engine, with a test for each of the seed's seven caveats
// (../shared/seeds/002_*). The whole file also runs under ThreadSanitizer (caveat 2).
#include "engine/tool_sessions.h"

#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "../memory/fake_copy_device.h"
#include "engine/engine.h"
#include "engine/engine_test_access.h"
#include "engine_test_util.h"
#include "model/make_model.h"
#include "test_device.h"

namespace strata {
namespace {

class ToolSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    STRATA_TEST_MODEL(model_, ModelPreset::kTiny, Architecture::kLlama, 13,
                      ModelOptions{.num_threads = 1});
  }

  std::unique_ptr<Engine> start(int64_t ttl_ms = 3'600'000, int32_t device_tokens = 1024) {
    EngineOptions o;
    o.page_size = 16;
    o.kv_cache_tokens = device_tokens;
    o.max_running_requests = 4;
    o.chunked_prefill_size = 256;
    o.hicache.enabled = true;
    o.hicache.ratio = 4.0;
    o.tool_session_ttl_ms = ttl_ms;
    auto e = create_test_engine(model_, o, {});
    EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().message);
    return e ? std::move(*e) : nullptr;
  }

  static std::vector<int32_t> prompt(int n, int salt) { return test_prompt(n, salt); }
  // The agent's next turn: the last prompt, the model's answer, 20 tokens of tool result.
  static std::vector<int32_t> next_turn(std::vector<int32_t> turn, const Outcome& answer) {
    turn.insert(turn.end(), answer.tokens.begin(), answer.tokens.end());
    const auto more = prompt(20, 2);
    turn.insert(turn.end(), more.begin(), more.end());
    return turn;
  }
  static Outcome run(Engine& e, std::vector<int32_t> p, std::string session = {},
                     int32_t max_tokens = 8) {
    return run_greedy(e, std::move(p), max_tokens, std::move(session));
  }

  static Result<ToolSessionView> tool_start(Engine& e, const std::string& id) {
    return engine_call(e, [id](EngineState& s) { return s.sessions->tool_start(id); }).get();
  }
  static Result<ToolSessionView> tool_end(Engine& e, const std::string& id, uint64_t epoch) {
    return engine_call(e, [id, epoch](EngineState& s) { return s.sessions->tool_end(id, epoch); })
        .get();
  }
  static ToolSessionView meta(Engine& e, const std::string& id) {
    auto r = engine_call(e, [id](EngineState& s) { return s.sessions->kv_meta(id); }).get();
    EXPECT_TRUE(r.has_value());
    return r.value_or(ToolSessionView{});
  }
  // Waits until the session leaves OFFLOADING / RESTORING.
  static ToolSessionView settle(Engine& e, const std::string& id) {
    for (int i = 0; i < 5000; ++i) {
      ToolSessionView v = meta(e, id);
      if (v.state != ToolSessionState::kOffloading && v.state != ToolSessionState::kRestoring)
        return v;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ADD_FAILURE() << "session never settled";
    return meta(e, id);
  }
  static void expect_consistent(Engine& e) { expect_engine_consistent(e); }
  static int64_t host_protected(Engine& e) {
    return engine_call(e, [](EngineState& s) { return s.tree.stats().host_protected_pages; }).get();
  }
  static void flood(Engine& e, int n, int salt) {
    for (int i = 0; i < n; ++i) run(e, prompt(300, salt + i), {}, 2);
  }

  TestModel model_;  // before the engines that run on it
};

TEST_F(ToolSessionTest, OffloadAndRestoreGiveADeviceHitWithIdenticalOutput) {
  auto e = start();
  const auto turn1 = prompt(500, 1);
  const Outcome first = run(*e, turn1, "agent");
  auto started = tool_start(*e, "agent");
  ASSERT_TRUE(started.has_value()) << started.error().message;
  EXPECT_EQ(started->epoch, 1u);
  EXPECT_GE(started->moved_tokens, 496);
  ToolSessionView v = settle(*e, "agent");
  EXPECT_EQ(v.state, ToolSessionState::kOffloaded);
  EXPECT_EQ(v.tier, "host");
  flood(*e, 12, 100);  // other traffic fills the device pool several times
  EXPECT_EQ(settle(*e, "agent").tier, "host");
  auto ended = tool_end(*e, "agent", 1);
  ASSERT_TRUE(ended.has_value()) << ended.error().message;
  v = settle(*e, "agent");
  EXPECT_EQ(v.state, ToolSessionState::kRunnable);
  EXPECT_EQ(v.tier, "device");
  EXPECT_EQ(host_protected(*e), 0);
  // The next turn extends the session: its whole history is a device hit.
  const std::vector<int32_t> turn2 = next_turn(turn1, first);
  const Outcome second = run(*e, turn2, "agent");
  EXPECT_GE(second.usage.cached_device, 496);
  EXPECT_EQ(second.usage.cached_host, 0);
  auto fresh = start();
  EXPECT_EQ(run(*fresh, turn2).tokens, second.tokens);
  expect_consistent(*e);
}

// A restore whose copy fails (a GPU's copy can; here a copy device that fails on command,
// tests/memory/fake_copy_device.h): the session does not stay RESTORING, its host copy is
// no longer protected, it is OFFLOADED again with the same epoch, and a later tool_end
// recovers it; the next turn's output is a fresh engine's.
TEST_F(ToolSessionTest, ARestoreWhoseCopyFailsIsOffloadedAgainAndRecovers) {
  FakeCopyDevice device;  // outlives the engine
  auto e = start();
  device.set_auto(true);
  const Status use = engine_call(*e, [&](EngineState& s) {
                       return s.use_copy_device(device, /*stall_timeout_ms=*/10'000);
                     }).get();
  ASSERT_TRUE(use) << use.error().message;
  const auto turn1 = prompt(500, 1);
  const Outcome first = run(*e, turn1, "agent");
  ASSERT_TRUE(tool_start(*e, "agent").has_value());
  EXPECT_EQ(settle(*e, "agent").state, ToolSessionState::kOffloaded);
  flood(*e, 12, 100);
  ASSERT_EQ(settle(*e, "agent").tier, "host");
  device.fail_all(true);
  ASSERT_TRUE(tool_end(*e, "agent", 1).has_value());  // the restore starts; its copy fails
  ToolSessionView v = settle(*e, "agent");
  EXPECT_EQ(v.state, ToolSessionState::kOffloaded);
  EXPECT_EQ(v.epoch, 1u);
  EXPECT_EQ(host_protected(*e), 0);
  EXPECT_GT(e->counters().copy_faults, 0u);
  expect_consistent(*e);
  device.fail_all(false);
  ASSERT_TRUE(tool_end(*e, "agent", 1).has_value());
  v = settle(*e, "agent");
  EXPECT_EQ(v.state, ToolSessionState::kRunnable);
  EXPECT_EQ(v.tier, "device");
  const std::vector<int32_t> turn2 = next_turn(turn1, first);
  const Outcome second = run(*e, turn2, "agent");
  auto fresh = start();
  EXPECT_EQ(run(*fresh, turn2).tokens, second.tokens);
  expect_consistent(*e);
}

// A restore whose copy hangs (the load queue is stuck; backups go on): tool_end answers at
// the stall deadline, RESTORING, instead of holding the scheduler thread or its caller; the
// agent's next request computes what has not landed; the copy's pages stay with it until it
// lands.
TEST_F(ToolSessionTest, ARestoreWhoseCopyHangsIsAnsweredAtTheStallAndTheAgentGoesOn) {
  FakeCopyDevice device;  // outlives the engine
  // 128 device pages: room for the next turn beside the stalled restore's 31.
  auto e = start(3'600'000, 2048);
  device.set_auto(true);
  const Status use = engine_call(*e, [&](EngineState& s) {
                       return s.use_copy_device(device, /*stall_timeout_ms=*/200);
                     }).get();
  ASSERT_TRUE(use) << use.error().message;
  const auto turn1 = prompt(500, 1);
  const Outcome first = run(*e, turn1, "agent");
  ASSERT_TRUE(e->cache().tool_start("agent", {}).get().has_value());
  ASSERT_EQ(settle(*e, "agent").state, ToolSessionState::kOffloaded);
  flood(*e, 24, 100);
  ASSERT_EQ(settle(*e, "agent").tier, "host");
  device.hang(CopyQueue::kLoad, true);
  const Result<ToolSessionView> answer = e->cache().tool_end("agent", 1, {}).get();
  ASSERT_TRUE(answer.has_value()) << answer.error().message;
  EXPECT_EQ(answer->state, ToolSessionState::kRestoring);
  // The counters are published after the scheduler's iteration: read them once it has ended.
  bool counted = false;
  for (int i = 0; i < 2000 && !counted; ++i) {
    counted = e->counters().copies_stalled > 0;
    if (!counted) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(counted);

  const std::vector<int32_t> turn2 = next_turn(turn1, first);
  const Outcome second = run(*e, turn2, "agent");
  auto fresh = start();
  EXPECT_EQ(run(*fresh, turn2).tokens, second.tokens);

  // The copy lands late: its pages come back, the cache stays whole.
  device.hang(CopyQueue::kLoad, false);
  EXPECT_NE(settle(*e, "agent").state, ToolSessionState::kRestoring);
  expect_consistent(*e);
}

TEST_F(ToolSessionTest, BadCallsAreRefusedAndChangeNothing) {
  auto e = start();
  EXPECT_EQ(tool_start(*e, "nobody").error().code, ErrorCode::kNotFound);
  EXPECT_EQ(tool_end(*e, "nobody", 1).error().code, ErrorCode::kNotFound);
  run(*e, prompt(200, 3), "s");
  EXPECT_EQ(tool_end(*e, "s", 0).error().code, ErrorCode::kFailedPrecondition);  // no tool_start
  ASSERT_TRUE(tool_start(*e, "s").has_value());
  EXPECT_EQ(tool_start(*e, "s").error().code, ErrorCode::kFailedPrecondition);  // twice
  settle(*e, "s");
  EXPECT_EQ(tool_end(*e, "s", 7).error().code, ErrorCode::kStaleEpoch);  // stale epoch
  EXPECT_EQ(meta(*e, "s").state, ToolSessionState::kOffloaded);
  EXPECT_EQ(meta(*e, "s").epoch, 1u);
  ASSERT_TRUE(tool_end(*e, "s", 1).has_value());
  expect_consistent(*e);
}

// Caveat 1: a failed restore releases the host protection, and the session can recover.
TEST_F(ToolSessionTest, FailedRestoreReleasesProtectionAndALaterToolEndRecovers) {
  auto e = start(3'600'000, 512);  // 32 device pages
  const auto turn = prompt(300, 4);
  const Outcome first = run(*e, turn, "a");
  ASSERT_TRUE(tool_start(*e, "a").has_value());
  settle(*e, "a");
  EXPECT_GT(host_protected(*e), 0);
  // A long request holds nearly all device pages while tool_end runs.
  RequestSpec hog;
  hog.prompt = prompt(400, 5);
  hog.sampling.temperature = 0;
  hog.max_tokens = 60;
  auto stream = e->submit(hog);
  ASSERT_TRUE(stream.has_value());
  while (e->counters().running == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto ended = tool_end(*e, "a", 1);
  ASSERT_FALSE(ended.has_value()) << "the hog should leave no room to restore";
  EXPECT_EQ(ended.error().code, ErrorCode::kOutOfPages);
  EXPECT_EQ(meta(*e, "a").state, ToolSessionState::kOffloaded);
  EXPECT_EQ(host_protected(*e), 0) << "a failed restore keeps nothing protected";
  expect_consistent(*e);
  drain(**stream);
  // The same epoch: a later tool_end recovers. The hog's pages become evictable once their
  // write-through backups to the host landed, later on a loaded machine: until then the
  // restore finds no room, and is retried as the HTTP route retries kOutOfPages.
  auto again = tool_end(*e, "a", 1);
  for (int i = 0; i < 200 && !again && again.error().code == ErrorCode::kOutOfPages; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    again = tool_end(*e, "a", 1);
  }
  ASSERT_TRUE(again.has_value()) << again.error().message;
  EXPECT_EQ(settle(*e, "a").state, ToolSessionState::kRunnable);
  std::vector<int32_t> next = turn;
  next.insert(next.end(), first.tokens.begin(), first.tokens.end());
  EXPECT_GT(run(*e, next, "a").usage.cached_tokens, 0);
  expect_consistent(*e);
}

// Caveats 3 and 4: eviction never strands host pages; host eviction never takes a
// protected session's pages, however much other traffic wants the room.
TEST_F(ToolSessionTest, HostEvictionNeverTakesProtectedPagesNorStrandsAny) {
  auto e = start();
  const auto turn = prompt(480, 6);
  run(*e, turn, "keep");
  ASSERT_TRUE(tool_start(*e, "keep").has_value());
  settle(*e, "keep");
  const int64_t protected_pages = host_protected(*e);
  EXPECT_GE(protected_pages, 30);
  flood(*e, 40, 200);  // several times device + host capacity
  EXPECT_EQ(host_protected(*e), protected_pages);
  EXPECT_EQ(meta(*e, "keep").tier, "host");
  expect_consistent(*e);  // every host page is in the tree or free (none unreachable)
  auto ended = tool_end(*e, "keep", 1);
  ASSERT_TRUE(ended.has_value()) << ended.error().message;
  EXPECT_GE(ended->moved_tokens, 480);
  settle(*e, "keep");
  expect_consistent(*e);
}

// Caveat 5: the session's node is split by other requests (a shared prefix) and its
// neighbours evicted; the session still finds exactly its blocks.
TEST_F(ToolSessionTest, SplitsAndEvictionsNeverLeaveAStaleNode) {
  auto e = start();
  const auto turn = prompt(400, 7);
  const Outcome first = run(*e, turn, "s");
  ASSERT_TRUE(tool_start(*e, "s").has_value());
  // A request sharing the first 200 tokens splits the session's node mid-offload.
  std::vector<int32_t> branch(turn.begin(), turn.begin() + 200);
  const auto tail = prompt(100, 8);
  branch.insert(branch.end(), tail.begin(), tail.end());
  run(*e, branch, {}, 2);
  settle(*e, "s");
  flood(*e, 12, 300);
  auto ended = tool_end(*e, "s", 1);
  ASSERT_TRUE(ended.has_value()) << ended.error().message;
  EXPECT_GE(ended->moved_tokens, 400);
  settle(*e, "s");
  std::vector<int32_t> next = turn;
  next.insert(next.end(), first.tokens.begin(), first.tokens.end());
  const Outcome o = run(*e, next, "s");
  EXPECT_GE(o.usage.cached_device, 400);
  expect_consistent(*e);
}

// Caveat 6: the TTL releases a session whose tool_end never comes, by itself.
TEST_F(ToolSessionTest, TtlReleasesAbandonedSessionsByItself) {
  auto e = start(/*ttl_ms=*/150);
  run(*e, prompt(300, 9), "gone");
  ASSERT_TRUE(tool_start(*e, "gone").has_value());
  for (int i = 0; i < 2000 && e->counters().tool_sessions_expired == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(e->counters().tool_sessions_expired, 1u);
  EXPECT_EQ(meta(*e, "gone").state, ToolSessionState::kRunnable);
  EXPECT_EQ(host_protected(*e), 0);
  EXPECT_EQ(tool_end(*e, "gone", 1).error().code, ErrorCode::kFailedPrecondition);
  expect_consistent(*e);
}

// Caveat 7 (and 2): offloads racing with eviction, flushes and other requests from
// several threads never lose or corrupt KV: every restored turn gives the same output.
TEST_F(ToolSessionTest, OffloadsRacingWithEvictionNeverCorruptKv) {
  auto e = start();
  auto reference = start();
  constexpr int kAgents = 3;
  std::vector<std::vector<int32_t>> turns;
  std::vector<std::vector<int32_t>> expected;
  for (int a = 0; a < kAgents; ++a) {
    turns.push_back(prompt(260, 20 + a));
    expected.push_back(run(*reference, turns[a]).tokens);
  }
  std::atomic<bool> stop{false};
  std::thread noise([&] {
    int i = 0;
    while (!stop.load()) {
      run(*e, prompt(250, 500 + i++), {}, 2);
      if (i % 3 == 0) engine_call(*e, [](EngineState& s) { return s.tree.flush(); }).get();
    }
  });
  std::vector<std::thread> agents;
  for (int a = 0; a < kAgents; ++a) {
    agents.emplace_back([&, a] {
      const std::string id = "agent" + std::to_string(a);
      for (int round = 0; round < 3; ++round) {
        const Outcome o = run(*e, turns[a], id);
        EXPECT_EQ(o.tokens, expected[a]) << id << " round " << round;
        auto s = tool_start(*e, id);
        ASSERT_TRUE(s.has_value()) << s.error().message;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        auto t = tool_end(*e, id, s->epoch);
        if (!t) {
          EXPECT_EQ(t.error().code, ErrorCode::kOutOfPages);
        }
        settle(*e, id);
      }
    });
  }
  for (auto& t : agents) t.join();
  stop = true;
  noise.join();
  for (int a = 0; a < kAgents; ++a) EXPECT_EQ(run(*e, turns[a]).tokens, expected[a]);
  expect_consistent(*e);
}

}  // namespace
}  // namespace strata
