// Helpers shared by the engine tests: run a request stream to its end.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_test_access.h"

namespace strata {

struct Outcome {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kError;
  RequestUsage usage;
  std::string error;
};

inline Outcome drain(RequestStream& stream) {
  Outcome out;
  for (int i = 0; i < 6000; ++i) {
    for (StreamItem& item : stream.wait(10)) {
      for (const auto& t : item.tokens) out.tokens.push_back(t.token);
      if (item.finish) {
        out.reason = *item.finish;
        out.usage = item.usage;
        out.error = item.error;
        return out;
      }
    }
  }
  ADD_FAILURE() << "request did not finish";
  return out;
}

// A deterministic prompt of `n` token ids in [3, 203).
inline std::vector<int32_t> test_prompt(int n, int salt) {
  std::vector<int32_t> p;
  std::mt19937 rng(static_cast<uint32_t>(salt));
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(rng() % 200) + 3);
  return p;
}

// Runs one greedy request to its end.
inline Outcome run_greedy(Engine& e, std::vector<int32_t> prompt, int32_t max_tokens,
                          std::string session = {}) {
  RequestSpec spec;
  spec.prompt = std::move(prompt);
  spec.sampling.temperature = 0;
  spec.max_tokens = max_tokens;
  spec.session_id = std::move(session);
  auto stream = e.submit(std::move(spec));
  EXPECT_TRUE(stream.has_value());
  return stream ? drain(**stream) : Outcome{};
}

// `n` distinct greedy prompts of `len` tokens (2 tokens out each): other traffic, enough to
// cycle a small device pool.
inline void flood_engine(Engine& e, int n, int len, int salt) {
  for (int i = 0; i < n; ++i) run_greedy(e, test_prompt(len, salt + i), 2);
}

// Waits (up to about `max_ms`) until no copy between the tiers is in flight: backups land
// asynchronously.
inline void settle_transfers(Engine& e, int max_ms = 2000) {
  for (int i = 0; i < max_ms; ++i) {
    if (!engine_call(e, [](EngineState& s) { return s.tree.io_pending(); }).get()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ADD_FAILURE() << "transfers never settled";
}

// Every page of both pools accounted for, and the tree's invariants.
inline void expect_engine_consistent(Engine& e) {
  auto st = engine_call(e, [](EngineState& s) { return s.audit_pages(); }).get();
  EXPECT_TRUE(st.has_value()) << st.error().message;
  auto inv = engine_call(e, [](EngineState& s) { return s.tree.check_invariants(); }).get();
  EXPECT_TRUE(inv.has_value()) << inv.error().message;
}

}  // namespace strata
