// Overlapped steps (EngineOptions::overlap_schedule, scheduler.h): the next decode step is
// prepared while one runs, its input tokens filled in on the forward thread. Against the
// same engine without it, on random traffic: the same tokens, log-probabilities and finish
// reasons for every request (greedy and seeded sampling, stop tokens met mid-decode,
// max_tokens, prompts of every length), with the model's own draws (OwnKvModel, as a GPU)
// and the CPU's; cancellations under way; every page accounted for after.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "engine/engine.h"
#include "engine_test_util.h"
#include "model/make_model.h"
#include "own_kv_model.h"

namespace strata {
namespace {

struct Got {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  FinishReason reason = FinishReason::kError;
};

Got collect(RequestStream& stream) {
  Got g;
  for (int i = 0; i < 6000; ++i) {
    for (StreamItem& item : stream.wait(10)) {
      for (const auto& t : item.tokens) {
        g.tokens.push_back(t.token);
        g.logprobs.push_back(t.logprob);
      }
      if (item.finish) {
        g.reason = *item.finish;
        return g;
      }
    }
  }
  ADD_FAILURE() << "request did not finish";
  return g;
}

// One engine over the tiny model: the CPU's (sampled by the engine), or the model keeping
// its KV and drawing decode rows itself, every `fallback`-th left to the engine.
struct Rig {
  std::unique_ptr<Model> cpu;
  std::unique_ptr<OwnKvModel> own;
  std::unique_ptr<Engine> engine;
};

EngineOptions overlap_options(bool overlap) {
  EngineOptions o;
  o.page_size = 4;
  o.kv_cache_tokens = 4096;
  o.max_running_requests = 8;
  o.chunked_prefill_size = 64;
  o.overlap_schedule = overlap;
  return o;
}

Rig make_rig(bool overlap, bool model_draws, int64_t fallback) {
  Rig r;
  auto model = make_preset_model(ModelPreset::kTiny, Architecture::kLlama, 7,
                                 ModelOptions{.num_threads = 1});
  EXPECT_TRUE(model.has_value());
  if (!model) return r;
  const EngineOptions o = overlap_options(overlap);
  ForwardModel* m = model->get();
  if (model_draws) {
    r.own = std::make_unique<OwnKvModel>(std::move(*model), o.kv_cache_tokens / o.page_size,
                                         o.page_size);
    r.own->sample_ = true;
    r.own->fallback_every_ = fallback;
    m = r.own.get();
  } else {
    r.cpu = std::move(*model);
  }
  auto e = Engine::create(m, o, {});
  EXPECT_TRUE(e.has_value()) << (e ? "" : e.error().message);
  if (e) r.engine = std::move(*e);
  return r;
}

// Random requests: prompts of 1-120 tokens (some sharing a prefix), 1-24 tokens out, greedy
// or seeded sampling with top-k / top-p, log-probabilities.
std::vector<RequestSpec> random_specs(uint32_t seed, int n) {
  std::mt19937 rng(seed);
  std::vector<RequestSpec> out;
  const std::vector<int32_t> shared = test_prompt(40, static_cast<int>(seed));
  for (int i = 0; i < n; ++i) {
    RequestSpec spec;
    const int len = 1 + static_cast<int>(rng() % 120);
    spec.prompt = test_prompt(len, static_cast<int>(seed * 100 + static_cast<uint32_t>(i)));
    if (rng() % 3 == 0) spec.prompt.insert(spec.prompt.begin(), shared.begin(), shared.end());
    spec.max_tokens = 1 + static_cast<int32_t>(rng() % 24);
    const uint32_t kind = rng() % 4;
    spec.sampling.temperature = kind == 0 ? 0.0f : 0.6f + 0.2f * static_cast<float>(kind);
    spec.sampling.seed = seed + static_cast<uint64_t>(i);
    if (kind == 2) spec.sampling.top_k = 20;
    if (kind == 3) spec.sampling.top_p = 0.85f;
    spec.sampling.logprobs = rng() % 2 == 0;
    out.push_back(std::move(spec));
  }
  return out;
}

// Submits `specs` in waves of `wave` (so that decodes run beside prompts and alone) and
// collects every answer.
std::vector<Got> run_all(Engine& e, const std::vector<RequestSpec>& specs, size_t wave) {
  std::vector<Got> got;
  for (size_t at = 0; at < specs.size(); at += wave) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (size_t i = at; i < std::min(specs.size(), at + wave); ++i) {
      auto s = e.submit(specs[i]);
      EXPECT_TRUE(s.has_value()) << (s ? "" : s.error().message);
      if (s) streams.push_back(*s);
    }
    for (auto& s : streams) got.push_back(collect(*s));
  }
  return got;
}

void expect_same(const std::vector<Got>& a, const std::vector<Got>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << "request " << i;
    EXPECT_EQ(a[i].reason, b[i].reason) << "request " << i;
    // (The batches differ, and with them the order of the products' sums: within 1e-5.)
    ASSERT_EQ(a[i].logprobs.size(), b[i].logprobs.size()) << "request " << i;
    for (size_t k = 0; k < a[i].logprobs.size(); ++k) {
      EXPECT_NEAR(a[i].logprobs[k], b[i].logprobs[k], 1e-5) << "request " << i << ", token " << k;
    }
  }
}

TEST(OverlapTest, OverlappedStepsGiveWhatSteppingOneByOneGives) {
  for (const bool model_draws : {false, true}) {
    for (const uint32_t seed : {1u, 2u, 3u}) {
      SCOPED_TRACE(testing::Message() << "model draws " << model_draws << ", seed " << seed);
      Rig on = make_rig(true, model_draws, model_draws ? 3 : 0);
      Rig off = make_rig(false, model_draws, model_draws ? 3 : 0);
      ASSERT_TRUE(on.engine && off.engine);
      std::vector<RequestSpec> specs = random_specs(seed, 24);
      expect_same(run_all(*on.engine, specs, 6), run_all(*off.engine, specs, 6));
      // Again, half of them with a stop id that the first run drew mid-decode (seeded: the
      // same tokens come again), so that requests end while the next step is on its way.
      const std::vector<Got> first = run_all(*off.engine, specs, 24);
      expect_same(run_all(*on.engine, specs, 24), first);
      for (size_t i = 0; i < specs.size(); i += 2) {
        const std::vector<int32_t>& t = first[i].tokens;
        if (t.size() > 2) specs[i].sampling.stop_token_ids = {t[1 + i % (t.size() - 2)]};
      }
      const std::vector<Got> want = run_all(*off.engine, specs, 6);
      const std::vector<Got> got = run_all(*on.engine, specs, 6);
      expect_same(got, want);
      int stops = 0;
      for (const Got& g : want) stops += g.reason == FinishReason::kStop ? 1 : 0;
      EXPECT_GT(stops, 0) << "no request met a stop id: the test lost its edge";
      EXPECT_GT(on.engine->counters().overlapped_steps, 0u);
      EXPECT_EQ(off.engine->counters().overlapped_steps, 0u);
      expect_engine_consistent(*on.engine);
      expect_engine_consistent(*off.engine);
    }
  }
}

TEST(OverlapTest, ARequestAloneDecodesOverlappedToItsLastToken) {
  Rig on = make_rig(true, false, 0);
  Rig off = make_rig(false, false, 0);
  ASSERT_TRUE(on.engine && off.engine);
  for (const int len : {1, 15, 16, 17, 90}) {
    const std::vector<int32_t> prompt = test_prompt(len, 500 + len);
    EXPECT_EQ(run_greedy(*on.engine, prompt, 40).tokens, run_greedy(*off.engine, prompt, 40).tokens)
        << len;
  }
  // One request decoding alone: every step after the first two is prepared beside the last.
  EXPECT_GE(on.engine->counters().overlapped_steps, 5u * 30);
  expect_engine_consistent(*on.engine);
}

TEST(OverlapTest, CancellingWhileStepsOverlapGivesEveryPageBack) {
  for (const bool model_draws : {false, true}) {
    Rig on = make_rig(true, model_draws, 0);
    ASSERT_TRUE(on.engine);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < 6; ++i) {
      RequestSpec spec;
      spec.prompt = test_prompt(10 + 7 * i, 900 + i);
      spec.sampling.temperature = 0;
      spec.max_tokens = 400;
      auto s = on.engine->submit(std::move(spec));
      ASSERT_TRUE(s.has_value());
      streams.push_back(*s);
    }
    // Let them decode (overlapped), then cancel half while they do.
    for (int i = 0; i < 200 && on.engine->counters().overlapped_steps < 20; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_GE(on.engine->counters().overlapped_steps, 20u);
    for (size_t i = 0; i < streams.size(); i += 2) streams[i]->cancel();
    for (size_t i = 0; i < streams.size(); ++i) {
      const Got g = collect(*streams[i]);
      EXPECT_EQ(g.reason, i % 2 == 0 ? FinishReason::kCancelled : FinishReason::kLength) << i;
    }
    expect_engine_consistent(*on.engine);
  }
}

}  // namespace
}  // namespace strata
