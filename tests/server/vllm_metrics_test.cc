// The model-server protocol's figures under vLLM's names (server/metrics.h,
// VllmGaugeValues): their meaning from one snapshot of the engine, and their samples in
// /metrics with vLLM's labels beside Strata's own names.
#include <gtest/gtest.h>

#include <optional>
#include <sstream>
#include <string>

#include "server/metrics.h"

namespace strata {
namespace {

// A snapshot of a device pool of 100 pages: 10 free, 50 cached of which 20 protected (so 30
// evictable), 40 held privately by running requests; 3 running, 5 waiting.
CacheState busy_state() {
  CacheState s;
  s.tree.page_size = 16;
  s.tree.cached_pages = 50;
  s.tree.protected_pages = 20;
  s.device = {.capacity_pages = 100, .free_pages = 10, .used_pages = 90};
  s.request_pages = 40;
  s.engine.running = 3;
  s.engine.waiting = 5;
  s.engine.free_pages = 10;
  s.engine.evictable_pages = 30;
  return s;
}

// The value of the sample whose line starts with `head` (name and labels, exactly).
std::optional<double> sample(const std::string& text, const std::string& head) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with(head + " ")) return std::stod(line.substr(head.size() + 1));
  }
  return std::nullopt;
}

TEST(VllmMetricsTest, UsageCountsThePagesANewRequestCannotHave) {
  const VllmGaugeValues v = vllm_gauge_values(busy_state(), BlockHashAlgo::kStrata);
  EXPECT_EQ(v.requests_running, 3);
  EXPECT_EQ(v.requests_waiting, 5);
  // Neither free (10) nor evictable (30): 60 of 100. vLLM counts its evictable cached
  // blocks as free; the protected ones and the requests' own are in use.
  EXPECT_DOUBLE_EQ(v.kv_cache_usage, 0.6);
  EXPECT_EQ(v.block_size, 16);
  EXPECT_EQ(v.num_gpu_blocks, 100);
  EXPECT_EQ(v.num_cpu_blocks, 0);
  EXPECT_EQ(v.prefix_caching_hash_algo, "strata");
}

TEST(VllmMetricsTest, AnIdlePoolIsEmptyAndAFullOneIsOne) {
  CacheState idle;
  idle.tree.page_size = 16;
  idle.device = {.capacity_pages = 64, .free_pages = 64, .used_pages = 0};
  idle.engine.free_pages = 64;
  EXPECT_DOUBLE_EQ(vllm_gauge_values(idle, BlockHashAlgo::kStrata).kv_cache_usage, 0.0);
  // A cache full of evictable pages is as empty for vLLM's meaning.
  CacheState cached = idle;
  cached.engine.free_pages = 0;
  cached.engine.evictable_pages = 64;
  EXPECT_DOUBLE_EQ(vllm_gauge_values(cached, BlockHashAlgo::kStrata).kv_cache_usage, 0.0);
  CacheState full = idle;
  full.engine.free_pages = 0;
  EXPECT_DOUBLE_EQ(vllm_gauge_values(full, BlockHashAlgo::kStrata).kv_cache_usage, 1.0);
  // No pool at all (a state never filled) reads 0, not a division by zero.
  EXPECT_DOUBLE_EQ(vllm_gauge_values(CacheState{}, BlockHashAlgo::kStrata).kv_cache_usage, 0.0);
}

TEST(VllmMetricsTest, TheHostPoolIsTheCpuBlocks) {
  CacheState s = busy_state();
  s.host = CacheState::Host{.pool = {.capacity_pages = 400, .free_pages = 400, .used_pages = 0}};
  EXPECT_EQ(vllm_gauge_values(s, BlockHashAlgo::kStrata).num_cpu_blocks, 400);
}

TEST(VllmMetricsTest, TheSamplesCarryVllmsNamesAndLabelsBesideStratasOwn) {
  CacheState s = busy_state();
  s.kv_dtype = "fp8_e4m3";
  Metrics metrics;
  metrics.set_cache(s);
  metrics.set_vllm(vllm_gauge_values(s, BlockHashAlgo::kSha256Cbor), "tiny-qwen3");
  const std::string text = metrics.serialize();
  const std::string labels = R"({engine="0",model_name="tiny-qwen3"})";
  EXPECT_EQ(sample(text, "vllm:num_requests_running" + labels), 3) << text;
  EXPECT_EQ(sample(text, "vllm:num_requests_waiting" + labels), 5) << text;
  EXPECT_EQ(sample(text, "vllm:kv_cache_usage_perc" + labels), 0.6) << text;
  EXPECT_EQ(
      sample(text,
             R"(vllm:cache_config_info{block_size="16",cache_dtype="fp8_e4m3",)"
             R"(enable_prefix_caching="True",)"
             R"(num_cpu_blocks="0",num_gpu_blocks="100",prefix_caching_hash_algo="sha256_cbor"})"),
      1)
      << text;
  // Strata's own names stay, with the same figures.
  EXPECT_EQ(sample(text, "strata_requests_running"), 3);
  EXPECT_EQ(sample(text, "strata_requests_waiting"), 5);
  // Gauges, as the protocol asks.
  EXPECT_NE(text.find("# TYPE vllm:num_requests_waiting gauge"), std::string::npos);
  EXPECT_NE(text.find("# TYPE vllm:kv_cache_usage_perc gauge"), std::string::npos);
}

}  // namespace
}  // namespace strata
