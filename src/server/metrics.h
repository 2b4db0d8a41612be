// Prometheus metrics (prometheus-cpp core), served as text on GET /metrics.
//
// Thread: counters and histograms are thread-safe (prometheus-cpp); gauges of the cache
// are refreshed from a consistent snapshot taken on the scheduler thread before each
// scrape.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "http/server.h"
#include "server/cache_figures.h"
#include "server/conversations.h"
#include "server/response_store.h"

namespace strata {

// The engine's figures besides the cache's (those are CacheState's, cache_figures.h).
struct EngineGaugeValues {
  // The scheduler (docs/scheduling.md): strata_scheduler_events_total{event} and the
  // last step's prefill budget.
  std::vector<std::pair<std::string, uint64_t>> scheduler_events;
  int64_t prefill_budget_tokens = 0;
  // strata_tool_sessions{state}: tool sessions by state now.
  std::vector<std::pair<std::string, int64_t>> tool_sessions;
  // Prefill/decode disaggregation (docs/pd-disaggregation.md): strata_pd_events_total{event}
  // (rooms, orders, pages and bytes moved), strata_pd_fallbacks_total{reason} (requests a
  // decode worker prefilled locally after all) and strata_pd{state} (rooms active, pages
  // in quarantine, peers alive). Empty without disaggregation.
  std::vector<std::pair<std::string, uint64_t>> pd_events;
  std::vector<std::pair<std::string, uint64_t>> pd_fallbacks;
  std::vector<std::pair<std::string, int64_t>> pd_state;
};

// The model-server protocol of the Gateway API Inference Extension (its proposal
// 003-model-server-protocol; docs/model-server-protocol.md): the figures its endpoint picker
// and llm-d's scorers read, under vLLM's names and with vLLM's meaning, served beside
// Strata's own.
struct VllmGaugeValues {
  int64_t requests_running = 0;  // vllm:num_requests_running: requests in the running batch
  int64_t requests_waiting = 0;  // vllm:num_requests_waiting: requests waiting for admission
  // vllm:kv_cache_usage_perc, a fraction in [0, 1] (vLLM's name says "perc"; 1 means full):
  // the device pages a new request cannot have, neither free nor reclaimable by eviction
  // (vLLM counts its evictable cached blocks as free, and so does this).
  double kv_cache_usage = 0;
  // vllm:cache_config_info's labels (its value is 1): the block size in tokens, the device
  // and host pools' capacities in blocks, and how blocks are hashed (strata | sha256_cbor).
  int64_t block_size = 0;
  int64_t num_gpu_blocks = 0;
  int64_t num_cpu_blocks = 0;
  std::string prefix_caching_hash_algo;
  // The pages' dtype under vLLM's CacheConfig.cache_dtype names where they exist
  // (bfloat16, fp8_e4m3), Strata's otherwise (f32, f16, int8): a router tells a worker with
  // 8-bit pages apart (issue 54).
  std::string cache_dtype;
};

// The protocol's figures of one consistent snapshot of the engine and the cache's hasher.
VllmGaugeValues vllm_gauge_values(const CacheState& state, BlockHashAlgo hash_algo);

class Metrics {
 public:
  Metrics();

  prometheus::Counter& requests(const std::string& endpoint, const std::string& status);
  prometheus::Counter& prompt_tokens() { return *prompt_tokens_; }
  prometheus::Counter& generation_tokens() { return *generation_tokens_; }
  prometheus::Counter& cache_hit_tokens() { return *cache_hit_tokens_; }
  prometheus::Histogram& ttft_s() { return *ttft_s_; }
  prometheus::Histogram& inter_token_s() { return *inter_token_s_; }
  prometheus::Histogram& e2e_s() { return *e2e_s_; }
  // Pins a message's cache_control asked for that the pin policy refused (over budget).
  prometheus::Counter& refused_pins() { return *refused_pins_; }
  // Chat replies with tool calls, and replies whose tool-call markup did not parse (their
  // text comes back as content): strata_tool_call_replies_total{outcome}.
  prometheus::Counter& tool_call_replies() { return *tool_call_replies_; }
  prometheus::Counter& malformed_tool_calls() { return *malformed_tool_calls_; }

  // Every figure of kCacheFigures that has a metric (cache_figures.h): the state's.
  void set_cache(const CacheState& state);
  void set_engine(const EngineGaugeValues& v);
  // The HTTP layer's connections, refusals, timeouts by phase, disconnects.
  void set_http(const http::ServerStats& s);
  void set_conversations(const ConversationRecords::Stats& s);
  void set_stored_responses(const ResponseStore::Stats& s);
  // GET /cache/events: clients following now, and those dropped for falling behind.
  void set_cache_events(int64_t subscribers, uint64_t dropped_subscribers);
  // vLLM's names, labelled as vLLM labels them (model_name, engine "0").
  void set_vllm(const VllmGaugeValues& v, const std::string& model_name);
  // The Prometheus text exposition format.
  std::string serialize() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_family_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generation_tokens_;
  prometheus::Counter* cache_hit_tokens_;
  prometheus::Histogram* ttft_s_;
  prometheus::Histogram* inter_token_s_;
  prometheus::Histogram* e2e_s_;
  prometheus::Counter* refused_pins_;
  prometheus::Counter* tool_call_replies_;
  prometheus::Counter* malformed_tool_calls_;
  // By CacheMetric: the family of its kind (the other null).
  std::array<prometheus::Family<prometheus::Gauge>*, kCacheMetricFamilies.size()> cache_gauges_{};
  std::array<prometheus::Family<prometheus::Counter>*, kCacheMetricFamilies.size()>
      cache_counters_{};
  prometheus::Family<prometheus::Gauge>* scheduler_events_family_;
  prometheus::Gauge* prefill_budget_;
  prometheus::Family<prometheus::Gauge>* tool_sessions_family_;
  prometheus::Family<prometheus::Gauge>* pd_events_family_;
  prometheus::Family<prometheus::Gauge>* pd_fallbacks_family_;
  prometheus::Family<prometheus::Gauge>* pd_state_family_;
  prometheus::Gauge* conversations_;
  prometheus::Family<prometheus::Gauge>* conversations_dropped_family_;
  prometheus::Gauge* stored_responses_;
  prometheus::Gauge* stored_response_bytes_;
  prometheus::Gauge* stored_responses_dropped_;
  prometheus::Gauge* http_open_;
  prometheus::Gauge* http_refused_;
  prometheus::Family<prometheus::Gauge>* http_timeouts_family_;
  prometheus::Gauge* http_disconnects_;
  prometheus::Gauge* http_slow_streams_;
  prometheus::Gauge* http_bad_requests_;
  prometheus::Gauge* cache_events_subscribers_;
  prometheus::Gauge* cache_events_dropped_;
  prometheus::Family<prometheus::Gauge>* vllm_running_family_;
  prometheus::Family<prometheus::Gauge>* vllm_waiting_family_;
  prometheus::Family<prometheus::Gauge>* vllm_kv_usage_family_;
  prometheus::Family<prometheus::Gauge>* vllm_cache_config_family_;
};

}  // namespace strata
