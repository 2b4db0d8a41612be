// The cache-control commands (engine/cache_control.h) through the public Engine API only:
// each command's answers and error codes, and the bounded tool-session records.
#include "engine/cache_control.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "engine/engine.h"
#include "engine/engine_test_access.h"
#include "engine_test_util.h"
#include "model/make_model.h"
#include "test_device.h"

namespace strata {
namespace {

// (Built by appending: g++ 12 warns falsely (-Wrestrict) on "s" + std::to_string(i).)
std::string session_name(int i) {
  std::string name = "s";
  name += std::to_string(i);
  return name;
}

class CacheControlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    STRATA_TEST_MODEL(model_, ModelPreset::kTiny, Architecture::kLlama, 17,
                      ModelOptions{.num_threads = 1});
  }

  std::unique_ptr<Engine> start(bool hicache, EngineOptions o = {}) {
    o.page_size = 16;
    o.kv_cache_tokens = 1024;
    o.max_running_requests = 4;
    o.chunked_prefill_size = 256;
    o.hicache.enabled = hicache;
    o.hicache.ratio = 4.0;
    auto e = create_test_engine(model_, o, {});
    EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().message);
    return e ? std::move(*e) : nullptr;
  }

  // The block hashes of a cached prompt: run it, then read them back from the tree.
  static std::vector<BlockHash> cache_prompt(Engine& e, int n, int salt,
                                             const std::string& session = {}) {
    run_greedy(e, test_prompt(n, salt), 1, session);
    auto state = e.cache().state(StateQuery{.with_tree = true}).get();
    EXPECT_TRUE(state.has_value());
    std::vector<BlockHash> hashes;
    for (const auto& node : *state->nodes) {
      hashes.insert(hashes.end(), node.block_hashes.begin(), node.block_hashes.end());
    }
    return hashes;
  }

  TestModel model_;  // before the engines that run on it
};

TEST_F(CacheControlTest, PinUnpinAndTheirCounts) {
  auto e = start(false);
  const auto hashes = cache_prompt(*e, 100, 1);
  ASSERT_EQ(hashes.size(), 6u);
  std::vector<BlockHash> ask = hashes;
  ask.push_back(0x1234);  // unknown: skipped and counted, not an error
  auto pinned = e->cache().pin(PinCommand{.hashes = ask}).get();
  ASSERT_TRUE(pinned.has_value()) << pinned.error().message;
  EXPECT_EQ(pinned->pinned, 6);
  EXPECT_EQ(pinned->unknown, 1);
  auto state = e->cache().state().get();
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(state->tree.pinned_blocks, 6);
  EXPECT_FALSE(state->host.has_value());
  EXPECT_FALSE(state->nodes.has_value());
  auto unpinned = e->cache().unpin(ask).get();
  ASSERT_TRUE(unpinned.has_value());
  EXPECT_EQ(unpinned->unpinned, 6);
  EXPECT_EQ(unpinned->unknown, 1);
  auto again = e->cache().unpin(hashes).get();
  EXPECT_EQ(again->not_pinned, 6);
  expect_engine_consistent(*e);
}

TEST_F(CacheControlTest, PinOverTheBudgetIsRefusedWholeWithItsCode) {
  EngineOptions o;
  o.max_pinned_ratio = 4.0 / 64.0;  // 4 of the 64 device pages
  auto e = start(false, o);
  const auto hashes = cache_prompt(*e, 100, 2);
  ASSERT_EQ(hashes.size(), 6u);
  auto refused = e->cache().pin(PinCommand{.hashes = hashes}).get();
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code, ErrorCode::kOverBudget);
  EXPECT_EQ(e->cache().state().get()->tree.pinned_blocks, 0);  // nothing pinned
  const std::vector<BlockHash> four(hashes.begin(), hashes.begin() + 4);
  EXPECT_TRUE(e->cache().pin(PinCommand{.hashes = four}).get().has_value());
  expect_engine_consistent(*e);
}

TEST_F(CacheControlTest, ClientPinsAreSoftLowestAndCapped) {
  EngineOptions o;
  o.max_client_pinned_ratio = 3.0 / 64.0;
  o.max_client_pin_ttl_ms = 5'000;
  auto e = start(false, o);
  const auto hashes = cache_prompt(*e, 100, 3);
  const std::vector<BlockHash> three(hashes.begin(), hashes.begin() + 3);
  // A hard pin asked by a client becomes a soft one.
  auto ok = e->cache().pin(PinCommand{.hashes = three, .authority = PinAuthority::kClient}).get();
  ASSERT_TRUE(ok.has_value());
  auto state = e->cache().state().get();
  EXPECT_EQ(state->tree.soft_pinned_blocks, 3);
  // The client budget is full; an admin is not held to it.
  const std::vector<BlockHash> more(hashes.begin() + 3, hashes.end());
  auto refused =
      e->cache().pin(PinCommand{.hashes = more, .authority = PinAuthority::kClient}).get();
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code, ErrorCode::kOverBudget);
  EXPECT_TRUE(e->cache().pin(PinCommand{.hashes = more}).get().has_value());
  expect_engine_consistent(*e);
}

// A pin that asks for its longest prefix (an Anthropic breakpoint's) is cut to the blocks
// that fit the budget, the first ones, instead of refused; with no room at all it is
// refused; both are counted (/cache/state: pins_cut_total, pins_refused_total and
// pin_blocks_refused_total).
TEST_F(CacheControlTest, ALongestPrefixPinIsCutToTheBudget) {
  EngineOptions o;
  o.max_client_pinned_ratio = 3.0 / 64.0;
  auto e = start(false, o);
  const auto hashes = cache_prompt(*e, 100, 5);
  ASSERT_EQ(hashes.size(), 6u);
  auto cut = e->cache()
                 .pin(PinCommand{
                     .hashes = hashes, .authority = PinAuthority::kClient, .longest_prefix = true})
                 .get();
  ASSERT_TRUE(cut.has_value()) << cut.error().message;
  EXPECT_EQ(cut->pinned, 3);
  EXPECT_EQ(cut->cut, 3);
  auto state = e->cache().state().get();
  EXPECT_EQ(state->tree.soft_pinned_blocks, 3);
  EXPECT_EQ(state->engine.pins_cut, 1u);
  EXPECT_EQ(state->engine.pin_blocks_refused, 3u);
  // The first three hold: unpinning them finds each pinned, the rest not.
  auto unpinned = e->cache().unpin(hashes).get();
  ASSERT_TRUE(unpinned.has_value());
  EXPECT_EQ(unpinned->unpinned, 3);
  EXPECT_EQ(unpinned->not_pinned, 3);
  // Pinned again, then a prefix of blocks that are all new finds no room: refused whole.
  ASSERT_TRUE(e->cache()
                  .pin(PinCommand{.hashes = {hashes.begin(), hashes.begin() + 3},
                                  .authority = PinAuthority::kClient})
                  .get()
                  .has_value());
  auto refused = e->cache()
                     .pin(PinCommand{.hashes = {hashes.begin() + 3, hashes.end()},
                                     .authority = PinAuthority::kClient,
                                     .longest_prefix = true})
                     .get();
  ASSERT_FALSE(refused.has_value());
  EXPECT_EQ(refused.error().code, ErrorCode::kOverBudget);
  state = e->cache().state().get();
  EXPECT_EQ(state->engine.pins_refused, 1u);
  EXPECT_EQ(state->engine.pin_blocks_refused, 6u);
  EXPECT_EQ(state->tree.soft_pinned_blocks, 3);
  // Without longest_prefix the same call is refused whole, as before.
  EXPECT_FALSE(e->cache()
                   .pin(PinCommand{.hashes = hashes, .authority = PinAuthority::kClient})
                   .get()
                   .has_value());
  expect_engine_consistent(*e);
}

TEST_F(CacheControlTest, EvictBlocksFlushAndEvictLru) {
  auto e = start(false);
  const auto hashes = cache_prompt(*e, 100, 4);
  ASSERT_TRUE(e->cache().pin(PinCommand{.hashes = {hashes[0]}}).get().has_value());
  // The last block goes; the pinned first block stays.
  auto one = e->cache().evict_blocks(EvictBlocksCommand{.hashes = {hashes.back(), 0x99}}).get();
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->evicted_blocks, 1);
  EXPECT_EQ(one->unknown, 1);
  auto pinned = e->cache().evict_blocks(EvictBlocksCommand{.hashes = {hashes[0]}}).get();
  EXPECT_EQ(pinned->skipped_pinned, 1);
  auto lru = e->cache().evict_lru(2).get();
  ASSERT_TRUE(lru.has_value());
  EXPECT_GE(lru->evicted_pages, 2);  // whole leaves: at least what was asked
  EXPECT_FALSE(e->cache().evict_lru(-1).get().has_value());
  auto flushed = e->cache().flush().get();
  ASSERT_TRUE(flushed.has_value());
  EXPECT_EQ(flushed->pinned_preserved, 1);
  EXPECT_EQ(e->cache().state().get()->tree.cached_pages, 1);
  expect_engine_consistent(*e);
}

TEST_F(CacheControlTest, ToolSessionCommandsSayWhatWentWrong) {
  auto none = start(false);
  run_greedy(*none, test_prompt(100, 5), 1, "agent");
  EXPECT_EQ(none->cache().tool_start("agent").get().error().code, ErrorCode::kNoHostTier);

  auto e = start(true);
  EXPECT_EQ(e->cache().tool_start("nobody").get().error().code, ErrorCode::kNotFound);
  EXPECT_EQ(e->cache().kv_meta("nobody").get().error().code, ErrorCode::kNotFound);
  run_greedy(*e, test_prompt(100, 6), 1, "agent");
  EXPECT_EQ(e->cache().tool_end("agent", 1).get().error().code, ErrorCode::kFailedPrecondition);
  auto started = e->cache().tool_start("agent").get();
  ASSERT_TRUE(started.has_value()) << started.error().message;
  EXPECT_EQ(started->epoch, 1u);
  EXPECT_EQ(e->cache().tool_start("agent").get().error().code, ErrorCode::kFailedPrecondition);
  for (int i = 0; i < 5000; ++i) {
    if (e->cache().kv_meta("agent").get()->state == ToolSessionState::kOffloaded) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(e->cache().tool_end("agent", 7).get().error().code, ErrorCode::kStaleEpoch);
  EXPECT_TRUE(e->cache().tool_end("agent", 1).get().has_value());
  expect_engine_consistent(*e);
}

TEST_F(CacheControlTest, ASessionWithARunningRequestIsBusy) {
  auto e = start(true);
  run_greedy(*e, test_prompt(50, 7), 1, "agent");
  RequestSpec spec;
  spec.prompt = test_prompt(50, 8);
  spec.max_tokens = 400;
  spec.session_id = "agent";
  auto stream = e->submit(std::move(spec));
  ASSERT_TRUE(stream.has_value());
  // Wait for the request to reach the engine (its first token).
  bool busy = false;
  for (int i = 0; i < 2000 && !busy; ++i) {
    auto r = e->cache().tool_start("agent").get();
    busy = !r && r.error().code == ErrorCode::kBusy;
    if (r) break;  // finished before we looked: the test proves nothing, but is not wrong
  }
  EXPECT_TRUE(busy);
  (*stream)->cancel();
  drain(**stream);
  expect_engine_consistent(*e);
}

TEST_F(CacheControlTest, IdleSessionRecordsStayWithinTheCap) {
  EngineOptions o;
  o.max_sessions = 8;
  auto e = start(true, o);
  for (int i = 0; i < 40; ++i) run_greedy(*e, test_prompt(20, 100 + i), 1, session_name(i));
  // Records are trimmed on the scheduler's next session tick.
  int64_t known = 40;
  for (int k = 0; k < 2000 && known > 8; ++k) {
    known = 0;
    for (int i = 0; i < 40; ++i) known += e->cache().kv_meta(session_name(i)).get() ? 1 : 0;
  }
  EXPECT_LE(known, 8);
  // The most recent ones are the ones kept.
  EXPECT_TRUE(e->cache().kv_meta("s39").get().has_value());
  EXPECT_GE(e->counters().session_records_dropped, 32u);
  expect_engine_consistent(*e);
}

TEST_F(CacheControlTest, NodeGivesOneNodesContentByItsTreeId) {
  auto e = start(false);
  const std::vector<int32_t> prompt = test_prompt(100, 9);
  run_greedy(*e, prompt, 1);
  run_greedy(*e, test_prompt(40, 9), 1);  // a shared prefix: the first node splits
  auto state = e->cache().state(StateQuery{.with_tree = true}).get();
  ASSERT_TRUE(state.has_value());
  ASSERT_GE(state->nodes->size(), 2u);
  std::map<uint64_t, CacheNodeContent> by_id;
  for (const CacheState::Node& view : *state->nodes) {
    auto got = e->cache().node(view.id).get();
    ASSERT_TRUE(got.has_value()) << got.error().message;
    EXPECT_EQ(got->node.parent_id, view.parent_id);
    EXPECT_EQ(got->node.num_tokens, view.num_tokens);
    EXPECT_EQ(got->node.block_hashes, view.block_hashes);
    EXPECT_EQ(got->node.on_device, view.on_device);
    EXPECT_EQ(got->node.hit_count, view.hit_count);
    EXPECT_EQ(got->token_ids.size(), static_cast<size_t>(view.num_tokens));
    by_id.emplace(view.id, std::move(*got));
  }
  // Along a path from the root, the nodes' tokens are the prompt's.
  const auto deepest = std::max_element(by_id.begin(), by_id.end(), [&](auto& a, auto& b) {
    auto depth = [&](uint64_t id) {
      int d = 0;
      for (; id != 0; id = by_id.at(id).node.parent_id) ++d;
      return d;
    };
    return depth(a.first) < depth(b.first);
  });
  std::vector<int32_t> path;
  for (uint64_t id = deepest->first; id != 0; id = by_id.at(id).node.parent_id) {
    const auto& ids = by_id.at(id).token_ids;
    path.insert(path.begin(), ids.begin(), ids.end());
  }
  ASSERT_LE(path.size(), prompt.size() + 1);
  EXPECT_TRUE(std::equal(path.begin(), path.begin() + std::min(path.size(), prompt.size()),
                         prompt.begin()));
  for (uint64_t id : {uint64_t{0}, uint64_t{1'000'000}}) {  // the root, and no node
    auto missing = e->cache().node(id).get();
    ASSERT_FALSE(missing.has_value());
    EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
  }
  expect_engine_consistent(*e);
}

}  // namespace
}  // namespace strata
