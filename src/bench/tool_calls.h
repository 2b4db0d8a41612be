// `strata bench tool-calls`: agent sessions that alternate model turns and tool pauses
// while other multi-turn traffic runs. Half the agents bracket each pause with
// POST /session/tool_start (offload the session's KV to the host tier and protect it) and
// POST /session/tool_end (bring it back); the other half just wait. Reported: the TTFT of
// every resumed turn (the one that carries the tool's result), per arm, with the cached
// tokens per tier and the tool_start/tool_end latencies. Pause lengths are drawn uniformly
// from [pause_min_s, pause_max_s] by a generator seeded from --seed.
//
// A server without the session API (404 on /session/tool_start) is reported as such and
// the scenario exits non-zero before any measurement.
//
// Threads: run_tool_calls() runs on the calling (main) thread; agents and the background
// traffic have their own threads.
#pragma once

#include <cstdint>

#include "bench/conversation.h"
#include "bench/target.h"
#include "common/result.h"

namespace strata::bench {

struct ToolCallsOptions {
  TargetOptions target;
  RunOptions run;
  int32_t agents = 4;      // concurrent agent sessions (even ones use the API), >= 2
  int32_t tool_calls = 4;  // tool pauses per agent, >= 1
  double pause_min_s = 1;  // tool pause range, 0 <= min <= max
  double pause_max_s = 6;
  int32_t agent_max_tokens = 32;        // tokens of each model turn, >= 1
  int64_t agent_system_tokens = 1500;   // the agents' system prompt, >= 16
  int64_t tool_result_min_tokens = 50;  // a tool's answer, in tokens
  int64_t tool_result_max_tokens = 300;
  int32_t background_concurrency = 2;  // users of the other traffic, >= 0
  int32_t background_max_tokens = 16;
  ConversationShape background_shape;
};

void apply_quick(ToolCallsOptions& o);
Status validate(const ToolCallsOptions& o);
// Exit code: 0 done, 2 an error (the session API missing included).
int run_tool_calls(const ToolCallsOptions& o);

}  // namespace strata::bench
