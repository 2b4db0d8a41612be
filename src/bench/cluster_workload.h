// The traffic of `strata bench cluster` (cluster.h), generated deterministically from the
// seed before it is sent, so that every routing policy faces exactly the same requests at
// the same moments:
//
// 1. Shared-prefix groups (the shape llm-d published, scaled down): `groups` long prefixes
//    (system prompts) of `prefix_tokens` each, and at every rate level of the sweep a series
//    of one-turn requests, each a prefix and a short question, whose group and user are
//    drawn uniformly and whose arrivals are a Poisson process at the level's rate.
// 2. Agentic sessions: sessions arrive as a Poisson process; all share one boilerplate
//    system prompt, each has its own task, then alternates model turns and tool pauses, each
//    pause ended by a tool result that the next turn carries.
// 3. The worker-failure workload is workload 2's shape over a fixed duration (its own
//    stream of texts); the runner kills and restarts a worker meanwhile.
//
// Pure functions of (seed, shape, token counter); thread-safe as long as the counter is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/text_generator.h"
#include "common/result.h"

namespace strata::bench {

// Arrival offsets in seconds of a Poisson process of `rate_per_s` (> 0): `count` values,
// increasing, the first one exponential too (not 0). Drawn from `rng`.
std::vector<double> poisson_arrivals(BenchRng& rng, double rate_per_s, int64_t count);

// Workload 1. Token ranges are inclusive, min <= max, min >= 1.
struct SharedPrefixShape {
  int32_t groups = 6;            // distinct prefixes, >= 1
  int32_t users_per_group = 4;   // users asking questions of each prefix, >= 1
  int64_t prefix_tokens = 1024;  // each prefix (the runner sizes it from the cluster's KV)
  int64_t question_min_tokens = 20;
  int64_t question_max_tokens = 60;
  std::vector<double> rates_per_s = {0.5, 1, 2};  // the sweep's arrival rates, each > 0
  int32_t requests_per_rate = 20;                 // requests of each level, >= 1
};

Status validate(const SharedPrefixShape& shape);

// Each prefix's length such that all of them together take `kv_fraction` of the cluster's
// device KV (`workers` pools of `pool_tokens`): floor(kv_fraction * workers * pool_tokens /
// groups), at least 64.
int64_t shared_prefix_tokens(double kv_fraction, int32_t workers, int64_t pool_tokens,
                             int32_t groups);

struct SharedPrefixRequest {
  int32_t level = 0;  // index into rates_per_s
  int32_t group = 0;
  int32_t user = 0;
  int64_t index = 0;     // within the level
  double arrival_s = 0;  // since the level started
  std::string question;  // the user message
  int64_t question_tokens = 0;
};

struct SharedPrefixWorkload {
  SharedPrefixShape shape;
  std::vector<GeneratedText> prefixes;                   // one per group
  std::vector<std::vector<SharedPrefixRequest>> levels;  // one per rate, by arrival
};

Result<SharedPrefixWorkload> make_shared_prefix_workload(uint64_t seed,
                                                         const SharedPrefixShape& shape,
                                                         const TokenCounter& counter);

// [system: the group's prefix, user: the question].
nlohmann::ordered_json shared_prefix_messages(const SharedPrefixWorkload& w,
                                              const SharedPrefixRequest& r);

// Workloads 2 and 3.
struct AgenticShape {
  int32_t sessions = 12;              // sessions in all, >= 1
  double session_rate_per_s = 0.5;    // new sessions per second (Poisson), > 0
  int64_t boilerplate_tokens = 1500;  // the system prompt every session shares, >= 16
  int64_t task_min_tokens = 80;       // each session's own first user message
  int64_t task_max_tokens = 200;
  int32_t tool_calls = 3;  // tool pauses per session (turns = tool_calls + 1), >= 0
  double pause_min_s = 1;  // each pause drawn uniformly from [min, max], 0 <= min <= max
  double pause_max_s = 3;
  int64_t tool_result_min_tokens = 40;
  int64_t tool_result_max_tokens = 120;
};

Status validate(const AgenticShape& shape);

struct AgentSession {
  int32_t index = 0;
  double arrival_s = 0;  // since the workload started
  std::string task;
  std::vector<std::string> tool_results;  // tool_calls of them
  std::vector<double> pauses_s;           // tool_calls of them
};

struct AgenticWorkload {
  AgenticShape shape;
  GeneratedText boilerplate;
  std::vector<AgentSession> sessions;  // by arrival
};

// `stream` names the texts ("agentic", "failure"): two streams share no session text.
Result<AgenticWorkload> make_agentic_workload(uint64_t seed, const std::string& stream,
                                              const AgenticShape& shape,
                                              const TokenCounter& counter);

}  // namespace strata::bench
