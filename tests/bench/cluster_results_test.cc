// The cluster scenario's results, apart from running it (cluster_results.h): the router's
// counters read from /metrics, one phase's figures, where round-robin saturates, the checks
// against the issue's targets and the shape of results.json, from hand-made phases.
#include "bench/cluster_results.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "bench/cluster_trace.h"

namespace strata::bench {
namespace {

const std::vector<std::string> kWorkers = {"http://w1", "http://w2", "http://w3"};

RoutedRequest request(const std::string& worker, double ttft_s, int64_t prompt, int64_t cached,
                      int64_t session = -1, int32_t turn = 0) {
  RoutedRequest r;
  r.ok = true;
  r.status = 200;
  r.worker = worker;
  r.ttft_s = ttft_s;
  r.itl_s = {0.01, 0.02};
  r.prompt_tokens = prompt;
  r.cached_tokens = cached;
  r.completion_tokens = 4;
  r.session = session;
  r.turn = turn;
  return r;
}

RoutedRequest failed(const std::string& worker, double start_s, bool broken) {
  RoutedRequest r;
  r.worker = worker;
  r.start_s = start_s;
  r.end_s = start_s + 1;
  r.status = broken ? 200 : 502;
  r.broken_stream = broken;
  r.error = "boom";
  return r;
}

PhaseRecord phase(const std::string& workload, const std::string& policy, double rate,
                  double ttft_s, int64_t cached) {
  PhaseRecord p;
  p.workload = workload;
  p.policy = policy;
  p.rate_per_s = rate;
  p.workers = kWorkers;
  p.wall_s = 10;
  p.arrival_span_s = 9;
  for (int i = 0; i < 6; ++i) {
    RoutedRequest r = request(kWorkers[static_cast<size_t>(i % 3)], ttft_s, 1000, cached);
    r.reusable_tokens = i < 2 ? 0 : 960;
    p.requests.push_back(r);
  }
  p.router.prompt_tokens = 6000;
  p.router.predicted_cached_tokens = static_cast<double>(cached) * 3;
  return p;
}

TEST(ClusterResultsTest, ParsesTheRoutersCounters) {
  const std::string text =
      "# HELP strata_router_prompt_tokens_total x\n"
      "# TYPE strata_router_prompt_tokens_total counter\n"
      "strata_router_prompt_tokens_total 1200\n"
      "strata_router_predicted_cached_tokens_total 800.5\n"
      "strata_router_reported_cached_tokens_total 700\n"
      "strata_router_queued_total 3\n"
      "strata_router_queue_seconds_bucket{le=\"0.1\"} 2\n"
      "strata_router_queue_seconds_sum 0.6\n"
      "strata_router_queue_seconds_count 3\n"
      "strata_router_retries_total 1\n"
      "strata_router_decisions_total{reason=\"cache\",worker=\"a\"} 5\n"
      "strata_router_streams_broken_total 2\n"
      "strata_router_rejected_total{} 4\n";
  const RouterCounters c = parse_router_metrics(text);
  EXPECT_EQ(c.prompt_tokens, 1200);
  EXPECT_EQ(c.predicted_cached_tokens, 800.5);
  EXPECT_EQ(c.reported_cached_tokens, 700);
  EXPECT_EQ(c.queued, 3);
  EXPECT_EQ(c.queue_seconds_sum, 0.6);
  EXPECT_EQ(c.queue_seconds_count, 3);
  EXPECT_EQ(c.retries, 1);
  EXPECT_EQ(c.streams_broken, 2);
  EXPECT_EQ(c.rejected, 4);
  const RouterCounters d = c - parse_router_metrics("strata_router_prompt_tokens_total 200\n");
  EXPECT_EQ(d.prompt_tokens, 1000);
  EXPECT_EQ(d.queued, 3);
}

TEST(ClusterResultsTest, SummarizesAPhase) {
  PhaseRecord p = phase(kAgentic, "default", 0, 0.5, 900);
  p.requests[0].session = 0;
  p.requests[1].session = 1;
  p.requests[2].session = 2;
  p.requests[3].session = 3;
  p.requests[4].session = 0;
  p.requests[4].turn = 1;  // not a new session
  p.requests.push_back(failed("http://w2", 3, false));
  p.router.queued = 2;
  p.router.queue_seconds_sum = 0.4;
  p.router.queue_seconds_count = 2;
  const PolicyFigures f = summarize_phase(p);
  EXPECT_EQ(f.name, "default");
  EXPECT_EQ(f.requests, 7);
  EXPECT_EQ(f.failed_requests, 1);
  EXPECT_EQ(f.failed_other, 1);
  EXPECT_EQ(f.ttft.count, 6);
  EXPECT_DOUBLE_EQ(f.ttft.p90, 0.5);
  EXPECT_EQ(f.itl.count, 12);
  EXPECT_DOUBLE_EQ(f.cache_hit_fraction, 0.9);
  EXPECT_DOUBLE_EQ(f.reusable_fraction, 4 * 960 / 6000.0);
  EXPECT_DOUBLE_EQ(f.predicted_hit_fraction, 2700 / 6000.0);
  EXPECT_DOUBLE_EQ(f.output_tokens_per_s, 24 / 10.0);
  EXPECT_EQ(f.requests_per_worker, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(f.sessions_per_worker, (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(f.queued, 2);
  EXPECT_DOUBLE_EQ(f.queue_mean_s, 0.2);
  EXPECT_DOUBLE_EQ(spread(f.requests_per_worker), 1);
  EXPECT_DOUBLE_EQ(spread(f.sessions_per_worker), 2);
  EXPECT_DOUBLE_EQ(spread({4, 2, 8}), 4);
  EXPECT_TRUE(std::isnan(spread({3, 0})));
}

TEST(ClusterResultsTest, FailureWorkloadExcusesOnlyStreamsOnTheKilledWorker) {
  PhaseRecord p = phase(kFailure, "default", 0, 0.5, 900);
  p.killed_worker = 1;
  p.killed_at_s = 5;
  p.restarted_at_s = 8;
  p.requests.push_back(failed("http://w2", 4, true));   // streaming on the killed one: excused
  p.requests.push_back(failed("http://w2", 6, true));   // sent after the kill: not excused
  p.requests.push_back(failed("http://w1", 4, true));   // another worker: not excused
  p.requests.push_back(failed("http://w2", 4, false));  // never answered: not excused
  RoutedRequest back = request("http://w2", 0.3, 1000, 0);
  back.start_s = 9.5;
  p.requests.push_back(back);
  const PolicyFigures f = summarize_phase(p);
  EXPECT_EQ(f.failed_requests, 4);
  EXPECT_EQ(f.failed_streaming_on_killed, 1);
  EXPECT_EQ(f.failed_other, 3);
  EXPECT_DOUBLE_EQ(f.back_after_s, 1.5);
}

TEST(ClusterResultsTest, SaturationIsWhereRoundRobinSlowsDown) {
  std::vector<PhaseRecord> levels = {phase(kSharedPrefix, "round-robin", 0.5, 1.0, 0),
                                     phase(kSharedPrefix, "round-robin", 1, 1.5, 0),
                                     phase(kSharedPrefix, "round-robin", 2, 2.5, 0)};
  EXPECT_EQ(saturation_level(levels), 2);  // 2.5 >= 2 * 1.0
  levels[1].wall_s = 20;                   // answers took > 1.5x the arrivals' span
  EXPECT_EQ(saturation_level(levels), 1);
  levels[1].wall_s = 10;
  levels[2].requests[0].ttft_s = levels[2].requests[1].ttft_s = 1.2;
  for (auto& r : levels[2].requests) r.ttft_s = 1.2;
  EXPECT_EQ(saturation_level(levels), 2);  // none: the last
  EXPECT_EQ(saturation_level({}), -1);
}

ClusterRecord record(double default_ttft, int64_t default_cached) {
  ClusterRecord r;
  r.model = "m";
  r.machine = {{"cpu_model", "test CPU"}, {"cores", 2}};
  for (double rate : {0.5, 1.0, 2.0}) {
    r.phases.push_back(phase(kSharedPrefix, "round-robin", rate, rate < 2 ? 1.0 : 3.0, 100));
    r.phases.push_back(phase(kSharedPrefix, "default", rate, default_ttft, default_cached));
  }
  for (const char* policy : {"round-robin", "precise", "default"}) {
    PhaseRecord a = phase(kAgentic, policy, 0, 0.5, std::string(policy) == "precise" ? 900 : 870);
    for (size_t i = 0; i < a.requests.size(); ++i) a.requests[i].session = static_cast<int64_t>(i);
    r.phases.push_back(a);
  }
  PhaseRecord f = phase(kFailure, "default", 0, 0.5, 900);
  f.killed_worker = 0;
  f.killed_at_s = 3;
  f.restarted_at_s = 5;
  f.requests[5].start_s = 6;  // on w3; then one back on w1
  RoutedRequest back = request("http://w1", 0.2, 1000, 0);
  back.start_s = 7;
  f.requests.push_back(back);
  f.requests.push_back(failed("http://w1", 2, true));
  r.phases.push_back(f);
  return r;
}

TEST(ClusterResultsTest, ChecksTheTargets) {
  const ClusterTargets t;
  const std::vector<Check> pass = cluster_checks(record(0.5, 880), t);
  ASSERT_EQ(pass.size(), 6u);
  for (const Check& c : pass) EXPECT_TRUE(c.passed) << c.name << ": " << c.detail;
  EXPECT_NE(pass[0].detail.find("at 2 req/s"), std::string::npos) << pass[0].detail;
  EXPECT_EQ(pass[3].name, "agentic hit fraction vs precise");

  // Slower than a third of round-robin, and too few hits for the reusable share.
  const std::vector<Check> fail = cluster_checks(record(1.5, 500), t);
  EXPECT_FALSE(fail[0].passed);
  EXPECT_FALSE(fail[1].passed);
  EXPECT_TRUE(all_passed(validity_checks(record(1.5, 500))));

  ClusterRecord r = record(0.5, 880);
  r.phases.back().requests.push_back(failed("http://w2", 4, false));
  r.phases.back().restarted_at_s = 100;  // nothing came back after it
  const std::vector<Check> f3 = cluster_checks(r, t);
  EXPECT_FALSE(f3[4].passed) << f3[4].detail;
  EXPECT_FALSE(f3[5].passed) << f3[5].detail;
}

TEST(ClusterResultsTest, ValidityNeedsEveryPhaseToComplete) {
  ClusterRecord r = record(0.5, 880);
  EXPECT_TRUE(all_passed(validity_checks(r)));
  r.phases[2].error = "router died";
  EXPECT_FALSE(all_passed(validity_checks(r)));
  r = record(0.5, 880);
  for (auto& q : r.phases[0].requests) q.ok = false;
  EXPECT_FALSE(all_passed(validity_checks(r)));
}

TEST(ClusterResultsTest, ResultsJsonHasTheIssuesShape) {
  const ClusterRecord r = record(0.5, 880);
  const std::vector<Check> checks = cluster_checks(r, ClusterTargets{});
  const auto j = cluster_results_json(r, checks);
  EXPECT_EQ(j["scenario"], "cluster");
  ASSERT_EQ(j["workloads"].size(), 3u);
  EXPECT_EQ(j["workloads"][0]["name"], "shared-prefix");
  EXPECT_EQ(j["workloads"][0]["saturation"]["rate_per_s"], 2.0);
  EXPECT_EQ(j["workloads"][0]["levels"].size(), 3u);
  for (const auto& w : j["workloads"]) {
    ASSERT_FALSE(w["policies"].empty());
    for (const auto& p : w["policies"]) {
      for (const char* key :
           {"name", "ttft_s", "itl_s", "cache_hit_fraction", "predicted_hit_fraction",
            "sessions_per_worker", "requests_per_worker", "failed_requests", "output_tokens_per_s",
            "router_queue"}) {
        EXPECT_TRUE(p.contains(key)) << w["name"] << " lacks " << key;
      }
      for (const char* q : {"p50", "p90", "p99"}) EXPECT_TRUE(p["ttft_s"].contains(q));
      EXPECT_EQ(p["requests_per_worker"].size(), 3u);
    }
  }
  EXPECT_EQ(j["workloads"][2]["policies"][0]["failed_streaming_on_killed"], 1);
  EXPECT_EQ(j["passed"], true);
  const std::string md = cluster_summary_markdown(r, checks);
  EXPECT_NE(md.find("Workload 1"), std::string::npos);
  EXPECT_NE(md.find("| round-robin |"), std::string::npos);
  EXPECT_NE(md.find("PASS shared-prefix TTFT p90"), std::string::npos);
}

// The router's decision-time histogram, read like the counters and taken apart by bucket.
TEST(ClusterResultsTest, DecisionTimeFromTheRoutersHistogram) {
  const auto text = [](int a, int b, int c) {
    return "strata_router_decision_seconds_bucket{le=\"1e-05\"} " + std::to_string(a) + "\n" +
           "strata_router_decision_seconds_bucket{le=\"2.5e-05\"} " + std::to_string(b) + "\n" +
           "strata_router_decision_seconds_bucket{le=\"+Inf\"} " + std::to_string(c) + "\n" +
           "strata_router_decision_seconds_sum 0.002\n" + "strata_router_decision_seconds_count " +
           std::to_string(c) + "\n";
  };
  const RouterCounters before = parse_router_metrics(text(10, 10, 10));
  const RouterCounters after = parse_router_metrics(text(60, 108, 110));
  const RouterCounters d = after - before;
  EXPECT_EQ(d.decision_seconds_count, 100);
  ASSERT_EQ(d.decision_buckets.size(), 3u);
  EXPECT_EQ(d.decision_buckets.at(1e-05), 50);
  EXPECT_EQ(bucket_quantile(d.decision_buckets, 0.5), 1e-05);
  EXPECT_EQ(bucket_quantile(d.decision_buckets, 0.9), 2.5e-05);
  EXPECT_TRUE(std::isinf(bucket_quantile(d.decision_buckets, 0.99)));
  EXPECT_TRUE(std::isnan(bucket_quantile({}, 0.5)));
  PhaseRecord p = phase(kAgentic, "default", 0, 0.5, 900);
  p.router = d;
  const PolicyFigures f = summarize_phase(p);
  EXPECT_EQ(f.decisions, 100);
  EXPECT_EQ(f.decision_p50_s, 1e-05);
  EXPECT_EQ(f.decision_p99_s, std::numeric_limits<double>::infinity());
}

// The trace workload: its figures against the ideal, its checks, its place in results.json.
TEST(ClusterResultsTest, TraceFiguresAndChecks) {
  // Every request's ideal is 960 of 1000 prompt tokens; round-robin hits 300, default 900.
  auto trace_phase = [](const std::string& policy, double ttft_s, int64_t cached) {
    PhaseRecord p = phase(kTrace, policy, 0, ttft_s, cached);
    for (size_t i = 0; i < p.requests.size(); ++i) {
      p.requests[i].reusable_tokens = 960;
      p.requests[i].trace_line = static_cast<int64_t>(i) + 1;
      p.requests[i].session = static_cast<int64_t>(i % 3);  // a family per worker
      p.requests[i].turn = i < 3 ? 0 : 1;
    }
    p.sessions_planned = 3;
    return p;
  };
  ClusterRecord r;
  r.model = "m";
  r.machine = {{"cpu_model", "test CPU"}, {"cores", 2}};
  r.phases.push_back(trace_phase("round-robin", 2.0, 300));
  r.phases.push_back(trace_phase("default", 0.3, 900));
  r.cluster["trace"] = {{"file", "t.jsonl"},
                        {"requests", 6},
                        {"arrival_span_s", 9.0},
                        {"time_scale", 0.5},
                        {"ideal", {{"token_fraction", 0.96}, {"block_fraction", 0.9}}}};
  const PolicyFigures f = summarize_phase(r.phases[1]);
  EXPECT_DOUBLE_EQ(f.reusable_fraction, 0.96);
  EXPECT_EQ(f.sessions_per_worker, (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(f.computed_tokens_per_worker, (std::vector<int64_t>{200, 200, 200}));
  const std::vector<Check> checks = cluster_checks(r, ClusterTargets{});
  ASSERT_EQ(checks.size(), 3u);
  EXPECT_EQ(checks[0].name, "trace hit fraction of the ideal");
  EXPECT_TRUE(checks[0].passed) << checks[0].detail;  // 0.90 / 0.96 = 0.94
  EXPECT_TRUE(checks[1].passed) << checks[1].detail;  // one family per worker
  EXPECT_TRUE(checks[2].passed) << checks[2].detail;  // 0.3 / 2.0 s = 0.15
  r.phases[1] = trace_phase("default", 0.5, 800);
  r.phases[1].router_cpu_s = 1.5;  // measured for this one only
  r.phases[1].worker_cpu_s = 30.5;
  const std::vector<Check> missed = cluster_checks(r, ClusterTargets{});
  EXPECT_FALSE(missed[0].passed) << missed[0].detail;  // 0.80 / 0.96 = 0.83
  EXPECT_FALSE(missed[2].passed) << missed[2].detail;  // 0.25
  const auto j = cluster_results_json(r, missed);
  ASSERT_EQ(j["workloads"].size(), 1u);
  EXPECT_EQ(j["workloads"][0]["name"], "trace");
  const auto& d = j["workloads"][0]["policies"][1];
  EXPECT_EQ(d["name"], "default");
  EXPECT_DOUBLE_EQ(d["ideal_hit_fraction"].get<double>(), 0.96);
  EXPECT_NEAR(d["hit_of_ideal"].get<double>(), 0.8 / 0.96, 1e-9);
  EXPECT_EQ(j["phases"][1]["requests"][0]["line"], 1);
  EXPECT_DOUBLE_EQ(d["router_cpu_s"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(d["worker_cpu_s"].get<double>(), 30.5);
  EXPECT_TRUE(j["workloads"][0]["policies"][0]["router_cpu_s"].is_null());
  const std::string md = cluster_summary_markdown(r, missed);
  EXPECT_NE(md.find("Workload 4: trace replay"), std::string::npos);
  EXPECT_NE(md.find("| 1.5 / 30.5 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| default | 6 | 0 |"), std::string::npos) << md;
}

}  // namespace
}  // namespace strata::bench
