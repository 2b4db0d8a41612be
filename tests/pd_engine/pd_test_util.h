// What the disaggregation tests' engines share (pd_engine_test.cc, pd_stage_test.cc): small
// pages and chunks (pages go out as each chunk completes), fast heartbeats and short
// deadlines, and the data plane under test (UCX over tcp, or the file store in `store_dir`).
#pragma once

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "engine/engine.h"
#include "engine/engine_options.h"
#include "engine/engine_test_access.h"

namespace strata {

inline EngineOptions pd_test_options(const std::string& transport,
                                     const std::filesystem::path& store_dir,
                                     const std::string& kv_layout, int32_t kv_cache_tokens) {
  EngineOptions o;
  o.page_size = 4;
  o.kv_cache_tokens = kv_cache_tokens;
  o.chunked_prefill_size = 16;
  o.pd.kv_layout = kv_layout;
  o.pd.transport = transport;
  if (transport == "storage") {
    o.pd.storage_backend = "file";
    o.pd.storage_extra_config = "{\"dir\": \"" + store_dir.string() + "\"}";
  }
  o.pd.heartbeat_ms = 50;
  o.pd.peer_timeout_ms = 400;
  o.pd.quarantine_ms = 300;
  return o;
}

// Every page accounted for once nothing runs (a stage's too); quarantined pages are waited
// out first.
inline void expect_pd_audited(Engine& e) {
  for (int i = 0; i < 300; ++i) {
    if (e.counters().pd_quarantined_pages == 0 && e.counters().pd_rooms_active == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(e.counters().pd_quarantined_pages, 0);
  auto st = engine_call(e, [](EngineState& s) { return s.audit_pages(); }).get();
  EXPECT_TRUE(st.has_value()) << st.error().message;
  auto inv = engine_call(e, [](EngineState& s) { return s.tree.check_invariants(); }).get();
  EXPECT_TRUE(inv.has_value()) << inv.error().message;
}

}  // namespace strata
