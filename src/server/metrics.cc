#include "server/metrics.h"

#include <prometheus/text_serializer.h>

#include <algorithm>
#include <sstream>

namespace strata {
namespace {

prometheus::Histogram::BucketBoundaries latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

}  // namespace

VllmGaugeValues vllm_gauge_values(const CacheState& state, BlockHashAlgo hash_algo) {
  const EngineCounters& c = state.engine;
  VllmGaugeValues v;
  v.requests_running = c.running;
  v.requests_waiting = c.waiting;
  const int64_t total = state.device.capacity_pages;
  // What admission counts on, as GET /load reports it: the free pages and those eviction
  // can reclaim (Scheduler::publish_load_gauges).
  const int64_t available = std::clamp<int64_t>(c.free_pages + c.evictable_pages, 0, total);
  v.kv_cache_usage =
      total > 0 ? static_cast<double>(total - available) / static_cast<double>(total) : 0.0;
  v.block_size = state.tree.page_size;
  v.num_gpu_blocks = total;
  v.num_cpu_blocks = state.host ? state.host->pool.capacity_pages : 0;
  v.prefix_caching_hash_algo = std::string(block_hash_algo_name(hash_algo));
  v.cache_dtype = state.kv_dtype == "bf16" ? std::string("bfloat16") : state.kv_dtype;
  return v;
}

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {
  using namespace prometheus;
  requests_family_ = &BuildCounter()
                          .Name("strata_requests_total")
                          .Help("HTTP requests by endpoint and status code")
                          .Register(*registry_);
  prompt_tokens_ = &BuildCounter()
                        .Name("strata_prompt_tokens_total")
                        .Help("Prompt tokens of admitted requests")
                        .Register(*registry_)
                        .Add({});
  generation_tokens_ = &BuildCounter()
                            .Name("strata_generation_tokens_total")
                            .Help("Generated tokens")
                            .Register(*registry_)
                            .Add({});
  cache_hit_tokens_ = &BuildCounter()
                           .Name("strata_cache_hit_tokens_total")
                           .Help("Prompt tokens served from the KV cache")
                           .Register(*registry_)
                           .Add({});
  ttft_s_ = &BuildHistogram()
                 .Name("strata_time_to_first_token_seconds")
                 .Help("Time from request arrival to the first generated token")
                 .Register(*registry_)
                 .Add({}, latency_buckets());
  inter_token_s_ = &BuildHistogram()
                        .Name("strata_inter_token_latency_seconds")
                        .Help("Time between consecutive generated tokens of a request")
                        .Register(*registry_)
                        .Add({}, latency_buckets());
  e2e_s_ = &BuildHistogram()
                .Name("strata_e2e_request_latency_seconds")
                .Help("Time from request arrival to its end")
                .Register(*registry_)
                .Add({}, latency_buckets());
  refused_pins_ = &BuildCounter()
                       .Name("strata_cache_control_pins_refused_total")
                       .Help(
                           "Pins asked for by a message's cache_control that the pin policy "
                           "refused (over --max-pinned-ratio or --max-client-pinned-ratio)")
                       .Register(*registry_)
                       .Add({});
  auto& tool_calls = BuildCounter()
                         .Name("strata_tool_call_replies_total")
                         .Help(
                             "Chat replies parsed for tool calls by outcome: calls (one or "
                             "more tool calls), malformed (tool-call markup that did not parse, "
                             "returned as content)")
                         .Register(*registry_);
  tool_call_replies_ = &tool_calls.Add({{"outcome", "calls"}});
  malformed_tool_calls_ = &tool_calls.Add({{"outcome", "malformed"}});
  for (size_t i = 0; i < kCacheMetricFamilies.size(); ++i) {
    const CacheMetricFamily& f = kCacheMetricFamilies[i];
    if (f.kind == MetricKind::kGauge) {
      cache_gauges_[i] =
          &BuildGauge().Name(std::string(f.name)).Help(std::string(f.help)).Register(*registry_);
    } else {
      cache_counters_[i] =
          &BuildCounter().Name(std::string(f.name)).Help(std::string(f.help)).Register(*registry_);
    }
  }
  scheduler_events_family_ = &BuildGauge()
                                  .Name("strata_scheduler_events_total")
                                  .Help(
                                      "Scheduler events since start: requests retracted for "
                                      "pages, preempted for a better class, restores that made "
                                      "room, queued requests' load holds released for the "
                                      "head of the queue, forward steps")
                                  .Register(*registry_);
  tool_sessions_family_ = &BuildGauge()
                               .Name("strata_tool_sessions")
                               .Help("Tool sessions by state (docs/tool-sessions.md)")
                               .Register(*registry_);
  pd_events_family_ = &BuildGauge()
                           .Name("strata_pd_events_total")
                           .Help(
                               "Prefill/decode disaggregation since start: rooms ordered and "
                               "done (decode side), orders accepted, rejected, done and failed "
                               "(prefill side), KV pages and bytes moved")
                           .Register(*registry_);
  pd_fallbacks_family_ =
      &BuildGauge()
           .Name("strata_pd_fallbacks_total")
           .Help("Requests a decode worker prefilled locally after all, by reason")
           .Register(*registry_);
  pd_state_family_ = &BuildGauge()
                          .Name("strata_pd")
                          .Help(
                              "Disaggregation now: rooms or orders active, pages in quarantine, "
                              "peers alive")
                          .Register(*registry_);
  prefill_budget_ = &BuildGauge()
                         .Name("strata_prefill_budget_tokens")
                         .Help("Prefill tokens the last step could carry (step budgeting)")
                         .Register(*registry_)
                         .Add({});
  http_open_ = &BuildGauge()
                    .Name("strata_http_open_connections")
                    .Help("Open HTTP connections")
                    .Register(*registry_)
                    .Add({});
  http_refused_ = &BuildGauge()
                       .Name("strata_http_connections_refused_total")
                       .Help("Connections refused (over --http-max-connections, or shutting down)")
                       .Register(*registry_)
                       .Add({});
  conversations_ = &BuildGauge()
                        .Name("strata_conversation_records")
                        .Help("Conversations whose exact tokens the server keeps (--max-sessions)")
                        .Register(*registry_)
                        .Add({});
  conversations_dropped_family_ =
      &BuildGauge()
           .Name("strata_conversation_records_dropped_total")
           .Help(
               "Conversation records dropped, by reason (capacity: --max-sessions, least "
               "recently used first; idle: --session-ttl-s); their next turn is rendered in full")
           .Register(*registry_);
  stored_responses_ = &BuildGauge()
                           .Name("strata_stored_responses")
                           .Help("Responses kept for /v1/responses/{id} and previous_response_id")
                           .Register(*registry_)
                           .Add({});
  stored_response_bytes_ = &BuildGauge()
                                .Name("strata_stored_response_bytes")
                                .Help(
                                    "What the stored responses hold, estimated "
                                    "(--max-stored-responses-mb)")
                                .Register(*registry_)
                                .Add({});
  stored_responses_dropped_ =
      &BuildGauge()
           .Name("strata_stored_responses_dropped_total")
           .Help(
               "Stored responses dropped for --max-stored-responses or --max-stored-responses-mb "
               "(least recently used first)")
           .Register(*registry_)
           .Add({});
  http_timeouts_family_ = &BuildGauge()
                               .Name("strata_http_timeouts_total")
                               .Help(
                                   "Connections closed by a timeout, by phase (header, body, "
                                   "idle, write)")
                               .Register(*registry_);
  http_disconnects_ = &BuildGauge()
                           .Name("strata_http_client_disconnects_total")
                           .Help(
                               "Clients that went away while their request ran (the request "
                               "was cancelled)")
                           .Register(*registry_)
                           .Add({});
  http_slow_streams_ = &BuildGauge()
                            .Name("strata_http_slow_streams_cancelled_total")
                            .Help(
                                "Streams cut because the client read slower than they were "
                                "produced (--http-max-stream-buffer-bytes)")
                            .Register(*registry_)
                            .Add({});
  http_bad_requests_ = &BuildGauge()
                            .Name("strata_http_bad_requests_total")
                            .Help(
                                "Malformed or oversized requests answered with 4xx/501 and "
                                "closed")
                            .Register(*registry_)
                            .Add({});
  cache_events_subscribers_ = &BuildGauge()
                                   .Name("strata_cache_events_subscribers")
                                   .Help("Clients following GET /cache/events")
                                   .Register(*registry_)
                                   .Add({});
  cache_events_dropped_ = &BuildGauge()
                               .Name("strata_cache_events_dropped_subscribers_total")
                               .Help(
                                   "GET /cache/events clients dropped for falling behind (told "
                                   "'overflow'; they resync from /cache/state)")
                               .Register(*registry_)
                               .Add({});
  // vLLM's names (VllmGaugeValues); their help is vLLM's.
  vllm_running_family_ = &BuildGauge()
                              .Name("vllm:num_requests_running")
                              .Help("Number of requests in model execution batches.")
                              .Register(*registry_);
  vllm_waiting_family_ = &BuildGauge()
                              .Name("vllm:num_requests_waiting")
                              .Help("Number of requests waiting to be processed.")
                              .Register(*registry_);
  vllm_kv_usage_family_ = &BuildGauge()
                               .Name("vllm:kv_cache_usage_perc")
                               .Help("KV-cache usage. 1 means 100 percent usage.")
                               .Register(*registry_);
  vllm_cache_config_family_ = &BuildGauge()
                                   .Name("vllm:cache_config_info")
                                   .Help("Information of the LLMEngine CacheConfig")
                                   .Register(*registry_);
}

prometheus::Counter& Metrics::requests(const std::string& endpoint, const std::string& status) {
  return requests_family_->Add({{"endpoint", endpoint}, {"status", status}});
}

void Metrics::set_cache(const CacheState& state) {
  for (const CacheFigure& figure : kCacheFigures) {
    if (figure.metric == CacheMetric::kNone) continue;
    if (!figure.metric_without_section && !has_section(state, figure.section)) continue;
    const auto index = static_cast<size_t>(figure.metric);
    const CacheMetricFamily& family = kCacheMetricFamilies[index];
    prometheus::Labels labels;
    if (!family.label.empty()) labels.emplace(family.label, figure.label);
    const double value = std::visit([](auto v) { return static_cast<double>(v); },
                                    cache_figure_value(state, figure));
    if (cache_gauges_[index] != nullptr) {
      cache_gauges_[index]->Add(labels).Set(value);
    } else {
      // A counter only goes up: it takes the rise since the last scrape.
      prometheus::Counter& counter = cache_counters_[index]->Add(labels);
      if (value > counter.Value()) counter.Increment(value - counter.Value());
    }
  }
}

void Metrics::set_engine(const EngineGaugeValues& v) {
  for (const auto& [event, n] : v.scheduler_events) {
    scheduler_events_family_->Add({{"event", event}}).Set(static_cast<double>(n));
  }
  prefill_budget_->Set(static_cast<double>(v.prefill_budget_tokens));
  for (const auto& [state, n] : v.tool_sessions) {
    tool_sessions_family_->Add({{"state", state}}).Set(static_cast<double>(n));
  }
  for (const auto& [event, n] : v.pd_events) {
    pd_events_family_->Add({{"event", event}}).Set(static_cast<double>(n));
  }
  for (const auto& [reason, n] : v.pd_fallbacks) {
    pd_fallbacks_family_->Add({{"reason", reason}}).Set(static_cast<double>(n));
  }
  for (const auto& [state, n] : v.pd_state) {
    pd_state_family_->Add({{"state", state}}).Set(static_cast<double>(n));
  }
}

void Metrics::set_http(const http::ServerStats& s) {
  http_open_->Set(static_cast<double>(s.open_connections));
  http_refused_->Set(static_cast<double>(s.connections_refused));
  http_timeouts_family_->Add({{"phase", "header"}}).Set(static_cast<double>(s.header_timeouts));
  http_timeouts_family_->Add({{"phase", "body"}}).Set(static_cast<double>(s.body_timeouts));
  http_timeouts_family_->Add({{"phase", "idle"}}).Set(static_cast<double>(s.idle_timeouts));
  http_timeouts_family_->Add({{"phase", "write"}}).Set(static_cast<double>(s.write_timeouts));
  http_disconnects_->Set(static_cast<double>(s.client_disconnects));
  http_slow_streams_->Set(static_cast<double>(s.slow_streams_cancelled));
  http_bad_requests_->Set(static_cast<double>(s.bad_requests));
}

void Metrics::set_cache_events(int64_t subscribers, uint64_t dropped_subscribers) {
  cache_events_subscribers_->Set(static_cast<double>(subscribers));
  cache_events_dropped_->Set(static_cast<double>(dropped_subscribers));
}

void Metrics::set_conversations(const ConversationRecords::Stats& s) {
  conversations_->Set(static_cast<double>(s.records));
  conversations_dropped_family_->Add({{"reason", "capacity"}})
      .Set(static_cast<double>(s.dropped_capacity));
  conversations_dropped_family_->Add({{"reason", "idle"}}).Set(static_cast<double>(s.dropped_idle));
}

void Metrics::set_stored_responses(const ResponseStore::Stats& s) {
  stored_responses_->Set(static_cast<double>(s.responses));
  stored_response_bytes_->Set(static_cast<double>(s.bytes));
  stored_responses_dropped_->Set(static_cast<double>(s.dropped));
}

void Metrics::set_vllm(const VllmGaugeValues& v, const std::string& model_name) {
  const prometheus::Labels labels{{"model_name", model_name}, {"engine", "0"}};
  vllm_running_family_->Add(labels).Set(static_cast<double>(v.requests_running));
  vllm_waiting_family_->Add(labels).Set(static_cast<double>(v.requests_waiting));
  vllm_kv_usage_family_->Add(labels).Set(v.kv_cache_usage);
  // One sample whose labels say the configuration (they are fixed for the process's life;
  // vLLM writes its CacheConfig's fields as strings, booleans as Python's "True").
  vllm_cache_config_family_
      ->Add({{"block_size", std::to_string(v.block_size)},
             {"cache_dtype", v.cache_dtype},
             {"num_gpu_blocks", std::to_string(v.num_gpu_blocks)},
             {"num_cpu_blocks", std::to_string(v.num_cpu_blocks)},
             {"enable_prefix_caching", "True"},
             {"prefix_caching_hash_algo", v.prefix_caching_hash_algo}})
      .Set(1);
}

std::string Metrics::serialize() const {
  prometheus::TextSerializer serializer;
  std::ostringstream out;
  serializer.Serialize(out, registry_->Collect());
  return out.str();
}

}  // namespace strata
