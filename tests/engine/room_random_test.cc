// Admission and the no-deadlock rule under random traffic, against a reference model of
// the pool, with and without the host tier, while the copy engine's completions are
// delayed at random (a seeded gate decides at each poll whether a finished copy lands: the
// timing of a busy machine, reproduced deterministically).
//
// The workload: waves of concurrent requests of random length up to the pool's size (some
// continuing earlier prompts, so loads and shared prefixes happen), random hard and soft
// pins of live prefixes, random tool offloads and restores, under write-through and
// write-back. After each wave:
//  - every request completed, and none failed for lack of room (each fits the pool, which
//    submit checks: the reference model's bound);
//  - with a host tier, no pin was released: the model keeps the pinned and session-held
//    pages within the host pool, so the host can always hold them (pins demote, never drop);
//  - every page of both pools is accounted for and the tree's invariants hold.
#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <map>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_test_access.h"
#include "engine_test_util.h"
#include "model/make_model.h"
#include "test_device.h"

namespace strata {
namespace {

constexpr int32_t kPageSize = 16;
constexpr int32_t kDevicePages = 48;
constexpr int32_t kPoolTokens = kPageSize * kDevicePages;

struct RoomCase {
  bool tiers = false;
  WritePolicy policy = WritePolicy::kWriteThrough;
  uint32_t seed = 1;
  LoadOverlap overlap = LoadOverlap::kLayer;  // how host hits load back
};

void PrintTo(const RoomCase& c, std::ostream* os) {
  *os << (c.tiers ? write_policy_name(c.policy) : "device only") << ", seed " << c.seed
      << ", load overlap " << load_overlap_name(c.overlap);
}

std::string case_name(const ::testing::TestParamInfo<RoomCase>& info) {
  const RoomCase& c = info.param;
  std::string name = c.tiers ? std::string(write_policy_name(c.policy)) : "device_only";
  for (char& ch : name) {
    if (ch == '-') ch = '_';
  }
  if (c.overlap == LoadOverlap::kNone) name += "_parked_loads";
  return name + "_seed" + std::to_string(c.seed);
}

// The reference model of the pool: what the workload may expect of it.
struct PoolModel {
  int32_t device_pages = kDevicePages;
  int32_t host_pages = 0;     // 0: no host tier
  int32_t pinned_pages = 0;   // distinct pinned blocks (upper bound: counted per pin call)
  int32_t session_pages = 0;  // tool sessions' offloaded pages (host-protected)
  // A request fits when its prompt and one decode slot fit the device pool.
  bool fits(size_t prompt_tokens) const {
    return static_cast<int64_t>(prompt_tokens + 1 + kPageSize - 1) / kPageSize <= device_pages;
  }
  // With a host tier the workload keeps what must stay on the host within half of it, so
  // that the host can always hold the pinned pages (no pin may then be released).
  bool may_protect_more(int32_t pages) const {
    if (host_pages == 0) return true;
    return pinned_pages + session_pages + pages <= host_pages / 2;
  }
};

class RoomRandomTest : public ::testing::TestWithParam<RoomCase> {
 protected:
  void SetUp() override {
    STRATA_TEST_MODEL(model_, ModelPreset::kTiny, Architecture::kLlama, 5,
                      ModelOptions{.num_threads = 1});
  }

  TestModel model_;  // before the engines that run on it
};

TEST_P(RoomRandomTest, EveryRequestThatFitsCompletesAndPinsDemoteNeverDrop) {
  const RoomCase c = GetParam();
  EngineOptions o;
  o.page_size = kPageSize;
  o.kv_cache_tokens = kPoolTokens;
  o.max_running_requests = 4;
  o.chunked_prefill_size = 128;
  o.max_pinned_ratio = 0.9;
  if (c.tiers) {
    o.hicache.enabled = true;
    o.hicache.ratio = 3.0;
    o.hicache.write_policy = c.policy;
    o.hicache.load_overlap = c.overlap;
  }
  auto created = create_test_engine(model_, o, {});
  ASSERT_TRUE(created.has_value()) << created.error().message;
  std::unique_ptr<Engine> e = std::move(*created);

  PoolModel pool;
  if (c.tiers) pool.host_pages = kDevicePages * 3;
  std::mt19937 rng(c.seed);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  // Finished copies land at a poll with probability 1/4: backups and loads stay in flight
  // for many scheduler iterations, across admissions.
  if (c.tiers) {
    engine_call(*e, [seed = c.seed](EngineState& s) {
      s.set_copy_gate([gen = std::mt19937(seed * 7919u + 1)]() mutable {
        return std::uniform_int_distribution<int>(0, 3)(gen) == 0;
      });
    }).get();
  }

  std::vector<std::vector<int32_t>> live;             // prompts served, for continuations and pins
  std::vector<std::string> offloaded;                 // tool sessions offloaded, not yet restored
  std::vector<std::string> resumable;                 // sessions whose last request finished
  std::map<std::string, std::vector<int32_t>> turns;  // a session's last prompt
  std::vector<std::string> restored;                  // their next turn comes next wave
  std::set<std::string> session_ids;
  int salt = static_cast<int>(c.seed) * 100000;
  const uint64_t unpinned_before = e->counters().auto_unpinned_blocks;

  for (int wave = 0; wave < 10; ++wave) {
    SCOPED_TRACE("wave " + std::to_string(wave));
    // Pins of live prefixes (hard or soft), within the model's bound.
    for (int k = uniform(0, 2); k > 0 && !live.empty(); --k) {
      const auto& p = live[static_cast<size_t>(uniform(0, static_cast<int>(live.size()) - 1))];
      const int32_t blocks = uniform(1, static_cast<int>(p.size()) / kPageSize);
      if (blocks == 0 || !pool.may_protect_more(blocks)) continue;
      std::vector<int32_t> prefix(p.begin(), p.begin() + blocks * kPageSize);
      auto hashes = engine_call(*e, [prefix](EngineState& s) {
                      return s.tree.block_hashes_of(prefix, "");
                    }).get();
      PinCommand cmd;
      cmd.hashes = hashes;
      cmd.ttl_ms = uniform(0, 1) == 0 ? 0 : 60'000;
      auto pinned = e->cache().pin(cmd).get();
      if (pinned) pool.pinned_pages += pinned->pinned;
    }
    // Tool sessions: offload one that finished, restore one that waits.
    if (c.tiers && !resumable.empty() && uniform(0, 1) == 0) {
      const std::string id = resumable.back();
      auto meta = e->cache().kv_meta(id).get();
      const int32_t pages = meta ? static_cast<int32_t>(meta->tokens / kPageSize) : 0;
      if (pool.may_protect_more(pages)) {
        auto started = e->cache().tool_start(id).get();
        if (started) {
          resumable.pop_back();
          offloaded.push_back(id);
          pool.session_pages += pages;
        }
      }
    }
    if (c.tiers && !offloaded.empty() && uniform(0, 1) == 0) {
      const std::string id = offloaded.front();
      auto meta = e->cache().kv_meta(id).get();
      ASSERT_TRUE(meta.has_value()) << meta.error().message;
      // A restore may find the device busy for a moment (the server's route retries).
      Result<ToolSessionView> ended = make_error(ErrorCode::kOutOfPages, "not tried");
      for (int attempt = 0; attempt < 2000; ++attempt) {
        ended = e->cache().tool_end(id, meta->epoch).get();
        if (ended || ended.error().code != ErrorCode::kOutOfPages) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      ASSERT_TRUE(ended.has_value()) << ended.error().message;
      EXPECT_EQ(ended->state, ToolSessionState::kRunnable);
      restored.push_back(id);
      offloaded.erase(offloaded.begin());
      pool.session_pages -= static_cast<int32_t>(meta->tokens / kPageSize);
    }
    // A wave of concurrent requests: up to the pool's size, half of them long.
    struct Sent {
      std::shared_ptr<RequestStream> stream;
      std::vector<int32_t> prompt;
      std::string session;
    };
    std::vector<Sent> sent;
    // A restored agent sends its next turn (the tool's answer appended), as agents do.
    for (const std::string& id : restored) {
      std::vector<int32_t> p = turns[id];
      const auto answer = test_prompt(uniform(1, 40), ++salt);
      p.insert(p.end(), answer.begin(), answer.end());
      if (static_cast<int>(p.size()) > kPoolTokens - 5) p.resize(kPoolTokens - 5);
      RequestSpec spec;
      spec.prompt = p;
      spec.sampling.temperature = 0;
      spec.max_tokens = 1;
      spec.session_id = id;
      auto stream = e->submit(spec);
      ASSERT_TRUE(stream.has_value()) << stream.error().message;
      sent.push_back(Sent{*stream, std::move(p), id});
    }
    restored.clear();
    for (int k = uniform(2, 6); k > 0; --k) {
      std::vector<int32_t> p;
      if (!live.empty() && uniform(0, 2) == 0) {
        p = live[static_cast<size_t>(uniform(0, static_cast<int>(live.size()) - 1))];
      }
      const int max_len = kPoolTokens - 1 - 4;
      const int target = uniform(0, 1) == 0 ? uniform(1, 160) : uniform(160, max_len);
      const int extra = std::max(1, target - static_cast<int>(p.size()));
      const auto more = test_prompt(extra, ++salt);
      p.insert(p.end(), more.begin(), more.end());
      if (static_cast<int>(p.size()) > max_len) p.resize(static_cast<size_t>(max_len));
      ASSERT_TRUE(pool.fits(p.size()));
      RequestSpec spec;
      spec.prompt = p;
      spec.sampling.temperature = 0;
      spec.max_tokens = uniform(1, 3);
      if (c.tiers && uniform(0, 3) == 0 && offloaded.size() + resumable.size() < 3) {
        spec.session_id = "agent-" + std::to_string(salt);
      }
      auto stream = e->submit(spec);
      ASSERT_TRUE(stream.has_value()) << stream.error().message;
      sent.push_back(Sent{*stream, std::move(p), spec.session_id});
    }
    for (Sent& s : sent) {
      const Outcome out = drain(*s.stream);
      ASSERT_TRUE(out.reason != FinishReason::kError)
          << "a " << s.prompt.size() << "-token request failed: " << out.error;
      if (!s.session.empty()) {
        turns[s.session] = s.prompt;
        if (std::find(resumable.begin(), resumable.end(), s.session) == resumable.end()) {
          resumable.push_back(s.session);
        }
      }
      live.push_back(std::move(s.prompt));
    }
    if (live.size() > 12) live.erase(live.begin());
    if (c.tiers) {
      EXPECT_EQ(e->counters().auto_unpinned_blocks, unpinned_before)
          << "a pin was released while the host could hold the pinned pages";
    }
    // Let the delayed copies land, then audit.
    for (int i = 0; i < 5000; ++i) {
      if (!engine_call(*e, [](EngineState& s) { return s.tree.io_pending(); }).get()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    expect_engine_consistent(*e);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

std::vector<RoomCase> room_cases() {
  std::vector<RoomCase> cases;
  for (uint32_t seed : {1u, 2u, 3u}) {
    cases.push_back(RoomCase{false, WritePolicy::kWriteThrough, seed});
    cases.push_back(RoomCase{true, WritePolicy::kWriteThrough, seed});
    cases.push_back(RoomCase{true, WritePolicy::kWriteBack, seed});
    cases.push_back(RoomCase{true, WritePolicy::kWriteThrough, seed, LoadOverlap::kNone});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Modes, RoomRandomTest, ::testing::ValuesIn(room_cases()), case_name);

}  // namespace
}  // namespace strata
