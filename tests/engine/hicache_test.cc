// The hierarchical cache inside the engine: demotion to the host under a flood, load-back
// with identical greedy output, write policies, pins that survive on the host, storage
// shared across engine restarts, and faults that fall back to computing (storage faults, and
// device <-> host copies that fail or stall, through a copy device the test controls).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "../memory/fake_copy_device.h"
#include "engine/engine.h"
#include "engine/engine_test_access.h"
#include "engine_test_util.h"
#include "model/make_model.h"
#include "test_device.h"

namespace strata {
namespace {

class HiCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    STRATA_TEST_MODEL(model_, ModelPreset::kTiny, Architecture::kLlama, 11,
                      ModelOptions{.num_threads = 1});
    dir_ = std::filesystem::temp_directory_path() /
           ("strata-hicache-test-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  EngineOptions options(WritePolicy policy = WritePolicy::kWriteThrough) {
    EngineOptions o;
    o.page_size = 16;
    o.kv_cache_tokens = 1024;  // 64 device pages: a flood of a few prompts cycles it
    o.max_running_requests = 4;
    o.chunked_prefill_size = 256;
    o.hicache.enabled = true;
    o.hicache.ratio = 4.0;
    o.hicache.write_policy = policy;
    return o;
  }

  std::unique_ptr<Engine> start(EngineOptions o) {
    auto e = create_test_engine(model_, std::move(o), {});
    EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().message);
    return e ? std::move(*e) : nullptr;
  }

  static std::vector<int32_t> prompt(int n, int salt) { return test_prompt(n, salt); }
  static Outcome run(Engine& e, std::vector<int32_t> p, int32_t max_tokens = 8) {
    return run_greedy(e, std::move(p), max_tokens);
  }

  // Other traffic: `n` distinct prompts of `len` tokens, enough to cycle the device pool.
  static void flood(Engine& e, int n, int len, int salt) { flood_engine(e, n, len, salt); }

  static void expect_consistent(Engine& e) { expect_engine_consistent(e); }

  static TreeStats stats(Engine& e) {
    return engine_call(e, [](EngineState& s) { return s.tree.stats(); }).get();
  }

  // Waits until no copy is in flight (backups land asynchronously).
  static void settle(Engine& e) { settle_transfers(e); }

  TestModel model_;  // before the engines that run on it
  std::filesystem::path dir_;
};

TEST_F(HiCacheTest, FloodDemotesToHostAndTheNextTurnLoadsBackWithIdenticalOutput) {
  for (WritePolicy policy :
       {WritePolicy::kWriteThrough, WritePolicy::kWriteBack, WritePolicy::kWriteThroughSelective}) {
    SCOPED_TRACE(std::string(write_policy_name(policy)));
    auto e = start(options(policy));
    const std::vector<int32_t> vip = prompt(400, 1);
    const Outcome first = run(*e, vip);
    if (policy == WritePolicy::kWriteThroughSelective) run(*e, vip);  // a second hit
    // Twice the device pool, well inside the host pool (which keeps LRU host leaves).
    flood(*e, 8, 300, 100);
    settle(*e);
    const TreeStats st = stats(*e);
    EXPECT_GT(st.evicted_pages_total, 0u);
    const Outcome again = run(*e, vip);
    EXPECT_EQ(again.tokens, first.tokens);
    EXPECT_GT(again.usage.cached_host, 0)
        << "the next turn should come from the host: device " << again.usage.cached_device
        << ", evicted " << st.evicted_pages_total << ", demoted " << st.demoted_pages_total
        << ", host cached " << st.host_cached_pages;
    EXPECT_EQ(again.usage.cached_tokens,
              again.usage.cached_device + again.usage.cached_host + again.usage.cached_storage);
    settle(*e);
    expect_consistent(*e);
  }
}

TEST_F(HiCacheTest, AFullHitOnTheHostIsCountedEvenWhenItEndsBeforeItsLoadLands) {
  // The same prompt again samples its first token from the remembered logits at admission;
  // with one token asked for it ends before its overlapped load settles, and its usage still
  // says where its prefix came from.
  for (LoadOverlap overlap : {LoadOverlap::kLayer, LoadOverlap::kNone}) {
    SCOPED_TRACE(std::string(load_overlap_name(overlap)));
    EngineOptions o = options();
    o.hicache.load_overlap = overlap;
    auto e = start(o);
    const std::vector<int32_t> vip = prompt(400, 5);
    const Outcome first = run(*e, vip, 1);
    settle(*e);
    ASSERT_TRUE(e->cache().evict_lru(int64_t{1} << 30).get().has_value());
    settle(*e);
    const Outcome again = run(*e, vip, 1);
    EXPECT_EQ(again.tokens, first.tokens);
    EXPECT_EQ(again.usage.cached_host, 384);  // the full pages of all but the last token
    settle(*e);
    expect_consistent(*e);
  }
}

TEST_F(HiCacheTest, PinnedPrefixSurvivesOnTheHostAndFlushKeepsIt) {
  auto e = start(options());
  const std::vector<int32_t> vip = prompt(480, 2);
  const Outcome first = run(*e, vip);
  auto hashes =
      engine_call(*e, [&](EngineState& s) { return s.tree.block_hashes_of(vip, ""); }).get();
  const PinResult pinned =
      engine_call(*e, [&](EngineState& s) { return s.tree.pin(hashes); }).get();
  EXPECT_EQ(pinned.pinned, static_cast<int32_t>(hashes.size()));
  // A flood that far exceeds device and host pools together.
  flood(*e, 30, 400, 300);
  settle(*e);
  FlushResult fr = engine_call(*e, [](EngineState& s) { return s.tree.flush(); }).get();
  EXPECT_EQ(fr.pinned_preserved, static_cast<int32_t>(hashes.size()));
  settle(*e);
  const TreeStats st = stats(*e);
  EXPECT_EQ(st.pinned_blocks, static_cast<int64_t>(hashes.size()));
  EXPECT_GE(st.host_protected_pages, static_cast<int64_t>(hashes.size()));
  const Outcome again = run(*e, vip);
  EXPECT_EQ(again.tokens, first.tokens);
  EXPECT_EQ(again.usage.cached_tokens,
            static_cast<int32_t>(hashes.size()) * 16 - (vip.size() % 16 == 0 ? 16 : 0));
  EXPECT_GT(again.usage.cached_host, 0);
  expect_consistent(*e);
}

TEST_F(HiCacheTest, FileStorageIsSharedAcrossRestartsAndChecked) {
  const std::vector<int32_t> vip = prompt(600, 3);
  Outcome first;
  EngineOptions o = options();
  o.hicache.storage_backend = "file";
  o.hicache.storage_extra_config =
      R"({"dir": ")" + (dir_ / "store").string() + R"(", "prefetch_threshold": 64})";
  o.hicache.storage_namespace = "test";
  o.hicache.prefetch_policy = PrefetchPolicy::kWaitComplete;
  {
    auto e = start(o);
    first = run(*e, vip);
    settle(*e);
    // Let the storage writes land before the engine stops.
    for (int i = 0; i < 2000 && e->counters().storage_pages_written < 37; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_GE(e->counters().storage_pages_written, 37u);
  }
  {
    auto e = start(o);  // a fresh engine: empty device and host pools
    const Outcome again = run(*e, vip);
    EXPECT_EQ(again.tokens, first.tokens);
    EXPECT_GE(again.usage.cached_storage, 37 * 16 - 16);
    settle(*e);
    expect_consistent(*e);
  }
  // Corrupt every stored value: the next fresh engine computes instead, same output.
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir_ / "store")) {
    if (!f.is_regular_file()) continue;
    std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(f.file_size() - 1));
    io.put('\x5a');
  }
  {
    auto e = start(o);
    const Outcome again = run(*e, vip);
    EXPECT_EQ(again.tokens, first.tokens);
    EXPECT_EQ(again.usage.cached_storage, 0);
    EXPECT_GT(e->counters().storage_faults, 0u);
    settle(*e);
    expect_consistent(*e);
  }
}

TEST_F(HiCacheTest, BadOptionsAreRefused) {
  EngineOptions o = options();
  o.hicache.ratio = 0.5;
  EXPECT_FALSE(create_test_engine(model_, o, {}).has_value());
  o = options();
  o.hicache.enabled = false;
  o.hicache.storage_backend = "file";
  EXPECT_FALSE(create_test_engine(model_, o, {}).has_value());
  o = options();
  o.hicache.storage_backend = "nfs";
  EXPECT_FALSE(create_test_engine(model_, o, {}).has_value());
}

// The host tier's copies through a device the test controls (tests/memory/fake_copy_device.h,
// the same StreamTransferEngine a GPU uses): copies that fail or stall cost the requests that
// needed them only their cache hit (they compute instead, with the same output), every page
// comes back, and the counters say what happened.
class CopyFaultTest : public HiCacheTest {
 protected:
  // `device` must outlive the engine (declared before it).
  std::unique_ptr<Engine> start_on(FakeCopyDevice& device,
                                   LoadOverlap overlap = LoadOverlap::kLayer) {
    EngineOptions o = options(WritePolicy::kWriteThrough);
    o.hicache.load_overlap = overlap;
    auto e = start(o);
    device.set_auto(true);
    const Status st = engine_call(*e, [&](EngineState& s) {
                        return s.use_copy_device(device, /*stall_timeout_ms=*/100);
                      }).get();
    EXPECT_TRUE(st) << st.error().message;
    return e;
  }
  static EngineCounters counters(Engine& e) { return e.counters(); }
  // Runs `vip`, then a flood that demotes it to the host; the first run's outcome.
  static Outcome run_then_demote(Engine& e, const std::vector<int32_t>& vip) {
    const Outcome first = run(e, vip);
    flood(e, 8, 300, 100);
    settle(e);
    return first;
  }
};

TEST_F(CopyFaultTest, CopiesThroughTheStreamEngineLoadBackWithIdenticalOutput) {
  FakeCopyDevice device;
  auto e = start_on(device);
  const std::vector<int32_t> vip = prompt(400, 1);
  const Outcome first = run_then_demote(*e, vip);
  const Outcome again = run(*e, vip);
  EXPECT_EQ(again.tokens, first.tokens);
  EXPECT_GT(again.usage.cached_host, 0);
  settle(*e);
  expect_consistent(*e);
  EXPECT_EQ(counters(*e).copy_faults, 0u);
}

TEST_F(CopyFaultTest, FailedCopiesFallBackToComputingAndGiveTheirPagesBack) {
  FakeCopyDevice device;
  auto e = start_on(device);
  const std::vector<int32_t> vip = prompt(400, 1);
  const Outcome first = run_then_demote(*e, vip);
  device.fail_all(true);  // the load back fails, and so does every backup from now on
  const Outcome again = run(*e, vip);
  EXPECT_EQ(again.tokens, first.tokens);
  flood(*e, 4, 300, 200);  // backups that fail: their host pages come back
  settle(*e);
  EXPECT_GT(counters(*e).copy_faults, 0u);
  EXPECT_EQ(counters(*e).loads_abandoned, 1u);  // the overlapped load's request stepped back
  expect_consistent(*e);
  device.fail_all(false);  // and the tier works again
  const Outcome third = run(*e, vip);
  EXPECT_EQ(third.tokens, first.tokens);
  settle(*e);
  expect_consistent(*e);
}

TEST_F(CopyFaultTest, AStalledLoadStopsHoldingUpItsRequest) {
  // Parked until the load lands, or overlapped with its prefill (which then read pages that
  // never came): either way the request computes its prefix instead, with the same output.
  for (LoadOverlap overlap : {LoadOverlap::kNone, LoadOverlap::kLayer}) {
    SCOPED_TRACE(std::string(load_overlap_name(overlap)));
    FakeCopyDevice device;
    auto e = start_on(device, overlap);
    const std::vector<int32_t> vip = prompt(400, 1);
    const Outcome first = run_then_demote(*e, vip);
    device.hang(CopyQueue::kLoad, true);  // nothing of the load lands: it stalls
    const Outcome again = run(*e, vip);   // computed instead, after the stall timeout
    EXPECT_EQ(again.tokens, first.tokens);
    EXPECT_GT(counters(*e).copies_stalled, 0u);
    EXPECT_EQ(counters(*e).loads_abandoned, overlap == LoadOverlap::kLayer ? 1u : 0u);
    device.hang(CopyQueue::kLoad, false);  // the copies land late; their pages come back then
    device.land_all();
    settle(*e);
    expect_consistent(*e);
    EXPECT_EQ(run(*e, vip).tokens, first.tokens);
    settle(*e);
    expect_consistent(*e);
  }
}

TEST_F(CopyFaultTest, AnOverlappedLoadWaitsLayerByLayerOnTheComputeStream) {
  FakeCopyDevice device;
  auto e = start_on(device);
  const std::vector<int32_t> vip = prompt(400, 1);
  const Outcome first = run_then_demote(*e, vip);
  const size_t waits_before = device.compute_waits_now().size();
  const Outcome again = run(*e, vip);
  EXPECT_EQ(again.tokens, first.tokens);
  EXPECT_GT(again.usage.cached_host, 0);
  EXPECT_EQ(counters(*e).loads_overlapped, 1u);
  EXPECT_EQ(counters(*e).loads_abandoned, 0u);
  // One compute wait per layer of the model, each on a load event, in increasing order (a
  // layer's event is issued after the one before it).
  const std::vector<CopyEvent> waits = device.compute_waits_now();
  ASSERT_EQ(waits.size() - waits_before, static_cast<size_t>(model_.config().num_layers));
  for (size_t i = waits_before; i < waits.size(); ++i) {
    EXPECT_EQ(device.queue_of(waits[i]), CopyQueue::kLoad);
    if (i > waits_before) {
      EXPECT_GT(waits[i], waits[i - 1]);
    }
  }
  settle(*e);
  expect_consistent(*e);
}

// Random waves of concurrent requests over conversations that keep growing (so host hits
// and their overlapped loads mix with other requests' prefill and decode in one batch), with
// floods that demote them and copies failing at random, against outputs computed once on an
// engine without tiers: no fault changes an output, every page comes back.
TEST_F(CopyFaultTest, RandomFaultsUnderOverlappedLoadsNeverChangeAnOutput) {
  auto spec_of = [](std::vector<int32_t> prompt) {
    RequestSpec spec;
    spec.prompt = std::move(prompt);
    spec.sampling.temperature = 0;
    spec.max_tokens = 4;
    return spec;
  };
  EngineOptions plain = options();
  plain.hicache.enabled = false;
  auto reference = start(plain);
  std::map<std::vector<int32_t>, std::vector<int32_t>> expected;
  auto expect_of = [&](const std::vector<int32_t>& prompt) {
    auto it = expected.find(prompt);
    if (it == expected.end())
      it = expected.emplace(prompt, run(*reference, prompt, 4).tokens).first;
    return it->second;
  };
  for (uint32_t seed : {1u, 2u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    FakeCopyDevice device;
    auto e = start_on(device);
    std::mt19937 rng(seed);
    std::vector<std::vector<int32_t>> conversations;
    for (int c = 0; c < 4; ++c) conversations.push_back(prompt(160 + 40 * c, 100 + c));
    for (int wave = 0; wave < 8; ++wave) {
      if (rng() % 2 == 0) flood(*e, 3, 300, 1000 + static_cast<int>(seed) * 100 + wave);
      if (rng() % 3 == 0) device.fail_next_batch();
      const bool fail_all = rng() % 5 == 0;
      device.fail_all(fail_all);
      std::vector<std::vector<int32_t>> prompts;
      std::vector<std::shared_ptr<RequestStream>> streams;
      for (auto& conv : conversations) {
        if (rng() % 3 == 0) continue;
        // The next turn: the conversation so far and a few new tokens (within the pool).
        if (conv.size() < 700) {
          const std::vector<int32_t> more =
              prompt(8 + static_cast<int>(rng() % 24), static_cast<int>(rng() % 100000));
          conv.insert(conv.end(), more.begin(), more.end());
        }
        prompts.push_back(conv);
        auto stream = e->submit(spec_of(conv));
        ASSERT_TRUE(stream.has_value());
        streams.push_back(*stream);
      }
      std::vector<Outcome> got;
      for (auto& stream : streams) got.push_back(drain(*stream));
      // (The reference engine shares the model: it runs only once the wave is over.)
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_EQ(got[i].tokens, expect_of(prompts[i])) << "wave " << wave << ", request " << i;
      }
      device.fail_all(false);
      settle(*e);
      expect_consistent(*e);
      if (::testing::Test::HasFailure()) return;
    }
    EXPECT_GT(counters(*e).loads_overlapped, 0u);
    std::printf("seed %u: loads overlapped %llu, abandoned %llu, copy faults %llu\n", seed,
                static_cast<unsigned long long>(counters(*e).loads_overlapped),
                static_cast<unsigned long long>(counters(*e).loads_abandoned),
                static_cast<unsigned long long>(counters(*e).copy_faults));
  }
}

}  // namespace
}  // namespace strata
