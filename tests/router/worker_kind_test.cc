// Worker kinds and roles by name, and each kind's load report read from the pages it
// answers the router's load poll with (worker_kind.h): Prometheus text as vLLM, SGLang
// and llama.cpp write it, llama.cpp's /slots in its current and older shapes.
#include "router/worker_kind.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <utility>

namespace strata::router {
namespace {

TEST(WorkerKind, NamesRoundTripAndAnUnknownOneNamesTheKinds) {
  for (WorkerKind k : {WorkerKind::kStrata, WorkerKind::kVllm, WorkerKind::kSglang,
                       WorkerKind::kLlamaCpp, WorkerKind::kOpenAi}) {
    auto parsed = parse_worker_kind(worker_kind_name(k));
    ASSERT_TRUE(parsed.has_value()) << worker_kind_name(k);
    EXPECT_EQ(*parsed, k);
  }
  EXPECT_EQ(worker_kind_name(WorkerKind::kLlamaCpp), "llamacpp");
  EXPECT_EQ(worker_kind_name(WorkerKind::kOpenAi), "openai");
  for (std::string_view bad : {"", "tgi", "llama.cpp", "LLAMACPP", "vllm "}) {
    auto r = parse_worker_kind(bad);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    EXPECT_EQ(r.error().message, "unknown worker kind '" + std::string(bad) +
                                     "' (it must be strata, vllm, sglang, llamacpp or openai)");
  }
}

TEST(WorkerKind, OnlyEnginesThatPublishEventsTakeEndpointsAndNeedABlockSize) {
  EXPECT_TRUE(publishes_kv_events(WorkerKind::kStrata));
  EXPECT_TRUE(publishes_kv_events(WorkerKind::kVllm));
  EXPECT_TRUE(publishes_kv_events(WorkerKind::kSglang));
  EXPECT_FALSE(publishes_kv_events(WorkerKind::kLlamaCpp));
  EXPECT_FALSE(publishes_kv_events(WorkerKind::kOpenAi));
  EXPECT_EQ(default_block_size(WorkerKind::kVllm), 0);
  EXPECT_EQ(default_block_size(WorkerKind::kStrata), 0);
  EXPECT_EQ(default_block_size(WorkerKind::kLlamaCpp), kApproximateBlockSize);
  EXPECT_EQ(default_block_size(WorkerKind::kOpenAi), kApproximateBlockSize);
}

TEST(WorkerRole, NamesRoundTrip) {
  for (WorkerRole r : {WorkerRole::kMixed, WorkerRole::kPrefill, WorkerRole::kDecode}) {
    auto parsed = parse_worker_role(worker_role_name(r));
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(*parsed, r);
  }
  auto bad = parse_worker_role("both");
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().message,
            "unknown worker role 'both' (it must be mixed, prefill or decode)");
  EXPECT_EQ(load_source_name(LoadSource::kSlotsAndMetrics), "slots+metrics");
  EXPECT_EQ(load_source_name(LoadSource::kRouter), "router");
}

TEST(PdTransport, NamesRoundTripAndAnUnknownOneNamesTheTransports) {
  for (PdTransport t : {PdTransport::kUcx, PdTransport::kStorage}) {
    auto parsed = parse_pd_transport(pd_transport_name(t));
    ASSERT_TRUE(parsed.has_value()) << pd_transport_name(t);
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_EQ(pd_transport_name(PdTransport::kNone), "none");
  for (std::string_view bad : {"", "none", "UCX", "rdma"}) {
    auto r = parse_pd_transport(bad);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_EQ(r.error().message,
              "unknown PD transport '" + std::string(bad) + "' (it must be ucx or storage)");
  }
}

TEST(StrataLoad, ReadsEveryFieldAndAbsentOnesAsZero) {
  auto l =
      read_strata_load(R"({"instance_id":"i1","running":3,"waiting":2,"max_running_requests":32,)"
                       R"("queued_prefill_tokens":4096,"load_fraction":0.75,"saturated":false,)"
                       R"("recommended_pause_ms":50,"page_size":16,"kv_events_next_seq":12,)"
                       R"("device":{"total_pages":100,"free_pages":40,"evictable_pages":10}})");
  ASSERT_TRUE(l.has_value()) << l.error().message;
  EXPECT_EQ(l->kv_events_next_seq, 12);
  EXPECT_EQ(l->instance_id, "i1");
  EXPECT_EQ(l->running, 3);
  EXPECT_EQ(l->waiting, 2);
  EXPECT_EQ(l->max_running_requests, 32);
  EXPECT_EQ(l->queued_prefill_tokens, 4096);
  EXPECT_DOUBLE_EQ(l->load_fraction, 0.75);
  EXPECT_EQ(l->recommended_pause_ms, 50);
  EXPECT_TRUE(l->has_device);
  EXPECT_EQ(l->total_pages, 100);
  EXPECT_EQ(l->free_pages, 40);
  EXPECT_EQ(l->evictable_pages, 10);

  auto empty = read_strata_load(R"({"device":null,"running":null})");
  ASSERT_TRUE(empty.has_value());
  EXPECT_EQ(empty->instance_id, "");
  EXPECT_EQ(empty->running, 0);
  EXPECT_FALSE(empty->has_device);
  EXPECT_FALSE(empty->kv_events_next_seq.has_value());  // an older worker's report
  // An integral float is an integer (json_fields.h).
  auto as_float = read_strata_load(R"({"running":3.0})");
  ASSERT_TRUE(as_float.has_value());
  EXPECT_EQ(as_float->running, 3);
}

TEST(StrataLoad, AWronglyTypedOrNegativeFieldIsAnErrorNamingIt) {
  const std::pair<std::string_view, std::string_view> cases[] = {
      {R"({"running":"3"})", "'running' must be an integer"},
      {R"({"waiting":1.5})", "'waiting' must be an integer"},
      {R"({"max_running_requests":[32]})", "'max_running_requests' must be an integer"},
      {R"({"queued_prefill_tokens":-1})", "'queued_prefill_tokens' must be in [0, "},
      {R"({"recommended_pause_ms":true})", "'recommended_pause_ms' must be an integer"},
      {R"({"kv_events_next_seq":-2})", "'kv_events_next_seq' must be in [0, "},
      {R"({"load_fraction":"0.5"})", "'load_fraction' must be a number"},
      {R"({"load_fraction":-0.5})", "'load_fraction' must be in [0"},
      {R"({"instance_id":7})", "'instance_id' must be a string"},
      {R"({"device":[]})", "'device' must be an object"},
      {R"({"device":{"free_pages":{}}})", "'free_pages' must be an integer"},
      {R"({"device":{"total_pages":18446744073709551615}})", "'total_pages' is out of range"},
      {R"([1,2])", "GET /load: not a JSON object"},
      {R"(not json)", "GET /load: not a JSON object"},
  };
  for (const auto& [body, message] : cases) {
    auto l = read_strata_load(body);
    ASSERT_FALSE(l.has_value()) << body;
    EXPECT_EQ(l.error().code, ErrorCode::kInvalidArgument);
    EXPECT_EQ(l.error().message.rfind(message, 0), 0u) << body << ": " << l.error().message;
  }
}

TEST(PrometheusValue, SumsEverySampleOfTheNameAndNothingElse) {
  const std::string text =
      "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
      "# TYPE vllm:num_requests_running gauge\n"
      "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n"
      "vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 2.0\n"
      "vllm:num_requests_running_total 99\n"  // another metric that starts alike
      "vllm:num_requests_runningx 98\n"
      "llamacpp:requests_deferred 4\r\n"
      "llamacpp:prompt_tokens_total 1.5e+04 1712345678000\n"  // with a timestamp
      "llamacpp:bad_value abc\n"
      "llamacpp:nan_value NaN\n"
      "llamacpp:labels_with_space{path=\"/a b\"} 7";
  EXPECT_EQ(prometheus_value(text, "vllm:num_requests_running"), 5.0);
  EXPECT_EQ(prometheus_value(text, "llamacpp:requests_deferred"), 4.0);
  EXPECT_EQ(prometheus_value(text, "llamacpp:prompt_tokens_total"), 15000.0);
  EXPECT_EQ(prometheus_value(text, "llamacpp:labels_with_space"), 7.0);
  EXPECT_EQ(prometheus_value(text, "llamacpp:bad_value"), std::nullopt);
  EXPECT_EQ(prometheus_value(text, "llamacpp:nan_value"), std::nullopt);
  EXPECT_EQ(prometheus_value(text, "vllm:num_requests_waiting"), std::nullopt);
  EXPECT_EQ(prometheus_value("", "x"), std::nullopt);
}

TEST(EngineMetrics, VllmAndSglangReadAsBeforeAndAnotherEnginesPageReadsNothing) {
  auto v = read_engine_metrics(WorkerKind::kVllm,
                               "vllm:num_requests_running 4\nvllm:num_requests_waiting 2\n"
                               "vllm:kv_cache_usage_perc 0.95\n");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(v->source, LoadSource::kMetrics);
  EXPECT_EQ(v->running, 4);
  EXPECT_EQ(v->waiting, 2);
  EXPECT_DOUBLE_EQ(v->load_fraction, 1.95);  // waiting while the cache is 90 % used
  // Before v0.7 the usage was gpu_cache_usage_perc; waiting below 90 % adds nothing.
  v = read_engine_metrics(WorkerKind::kVllm,
                          "vllm:gpu_cache_usage_perc 0.5\nvllm:num_requests_waiting 3\n");
  ASSERT_TRUE(v.has_value());
  EXPECT_DOUBLE_EQ(v->load_fraction, 0.5);
  auto s = read_engine_metrics(WorkerKind::kSglang,
                               "sglang:num_running_reqs{model_name=\"m\"} 7\n"
                               "sglang:num_queue_reqs{model_name=\"m\"} 0\n"
                               "sglang:token_usage{model_name=\"m\"} 0.25\n");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->running, 7);
  EXPECT_DOUBLE_EQ(s->load_fraction, 0.25);
  // issue 33: a llama.cpp server entered as vllm.
  const std::string llama = "llamacpp:requests_processing 2\nllamacpp:requests_deferred 1\n";
  EXPECT_FALSE(read_engine_metrics(WorkerKind::kVllm, llama).has_value());
  EXPECT_FALSE(read_engine_metrics(WorkerKind::kSglang, llama).has_value());
  EXPECT_FALSE(read_engine_metrics(WorkerKind::kLlamaCpp, llama).has_value());
}

TEST(LlamaCppSlots, CurrentAndOlderShapes) {
  // The shape of llama-server's README (trimmed): `is_processing` per slot.
  auto s = read_llamacpp_slots(R"([
    {"id": 0, "id_task": 135, "n_ctx": 65536, "speculative": false, "is_processing": true,
     "params": {"n_predict": -1}, "next_token": {"has_next_token": true, "n_decoded": 0}},
    {"id": 1, "id_task": -1, "n_ctx": 65536, "speculative": false, "is_processing": false},
    {"id": 2, "id_task": 7, "n_ctx": 65536, "speculative": false, "is_processing": true}])");
  ASSERT_TRUE(s.has_value()) << s.error().message;
  EXPECT_EQ(s->total, 3);
  EXPECT_EQ(s->busy, 2);
  EXPECT_EQ(s->n_ctx, 65536);
  // Builds before late 2024: `state` (0 idle, 1 processing).
  s = read_llamacpp_slots(R"([{"id": 0, "n_ctx": 2048, "state": 1}, {"id": 1, "state": 0}])");
  ASSERT_TRUE(s.has_value()) << s.error().message;
  EXPECT_EQ(s->total, 2);
  EXPECT_EQ(s->busy, 1);
  EXPECT_EQ(s->n_ctx, 2048);
  for (std::string_view bad : {"", "{}", "[]", "[1]", R"([{"id": 0}])",
                               R"([{"id": 0, "is_processing": "yes"}])", "not json"}) {
    auto r = read_llamacpp_slots(bad);
    EXPECT_FALSE(r.has_value()) << bad;
  }
}

TEST(LlamaCppLoad, FromSlotsAndMetricsEitherOrNeither) {
  const LlamaCppSlots slots{.total = 4, .busy = 3, .n_ctx = 8192};
  const std::string_view metrics =
      "llamacpp:prompt_tokens_total 33065\nllamacpp:requests_processing 3\n"
      "llamacpp:requests_deferred 2\nllamacpp:kv_cache_usage_ratio 0.99\n";
  auto both = read_llamacpp_load(&slots, &metrics);
  ASSERT_TRUE(both.has_value());
  EXPECT_EQ(both->source, LoadSource::kSlotsAndMetrics);
  EXPECT_EQ(both->running, 3);
  EXPECT_EQ(both->waiting, 2);
  EXPECT_EQ(both->max_running, 4);
  EXPECT_EQ(both->context_tokens, 8192);
  EXPECT_EQ(both->prompt_tokens_total, 33065);
  EXPECT_DOUBLE_EQ(both->load_fraction, 1.25);  // (3 + 2) / 4: the cache ratio is not load

  auto only_slots = read_llamacpp_load(&slots, nullptr);
  ASSERT_TRUE(only_slots.has_value());
  EXPECT_EQ(only_slots->source, LoadSource::kSlots);
  EXPECT_DOUBLE_EQ(only_slots->load_fraction, 0.75);
  EXPECT_EQ(only_slots->prompt_tokens_total, std::nullopt);

  auto only_metrics = read_llamacpp_load(nullptr, &metrics);
  ASSERT_TRUE(only_metrics.has_value());
  EXPECT_EQ(only_metrics->source, LoadSource::kMetrics);
  EXPECT_EQ(only_metrics->running, 3);
  EXPECT_EQ(only_metrics->max_running, 0);
  EXPECT_DOUBLE_EQ(only_metrics->load_fraction, 1.0);  // deferring: saturated
  const std::string_view idle = "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n";
  EXPECT_DOUBLE_EQ(read_llamacpp_load(nullptr, &idle)->load_fraction, 0.0);

  EXPECT_FALSE(read_llamacpp_load(nullptr, nullptr).has_value());
  const std::string_view vllm = "vllm:num_requests_running 1\n";
  EXPECT_FALSE(read_llamacpp_load(nullptr, &vllm).has_value());
  // A page without llamacpp names next to good slots: the slots alone.
  auto slots_vllm = read_llamacpp_load(&slots, &vllm);
  ASSERT_TRUE(slots_vllm.has_value());
  EXPECT_EQ(slots_vllm->source, LoadSource::kSlots);
}

}  // namespace
}  // namespace strata::router
