// `strata bench tool-calls`: agent sessions that alternate model turns and tool pauses
// while other multi-turn traffic runs. Half the agents bracket each pause with
// POST /session/tool_start (offload the session's KV to the host tier and protect it) and
// POST /session/tool_end (bring it back); the other half just wait. Reported: the TTFT of
// every resumed turn (the one that carries the tool's result), per arm, with the cached
// tokens per tier and the tool_start/tool_end latencies. Pause lengths are drawn uniformly
// from [pause_min_s, pause_max_s] by a generator seeded from --seed.
//
// The pressured variant (pressure_cycles > 0): while any agent is paused, separate
// "pressure" requests with fresh prompts (no shared prefix, one generated token) fill the
// device pool, and each pause lasts until the server's eviction counter
// (/cache/state evictions.evicted_pages_total: device pages freed or demoted to the host)
// has grown by pressure_cycles device pools since the pause began (at least the drawn
// length, at most pressure_timeout_s). So an agent that did not offload has lost its KV
// from the device when it resumes, and one that used tool_start/tool_end must get it back
// from the host. Every pause records the device pages evicted and demoted during it, which
// the report divides by the pool's size: the proof that the pool was cycled.
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
  double pressure_cycles = 0;             // device pools evicted during each pause; 0: off
  int32_t pressure_concurrency = 2;       // simultaneous pressure requests, >= 1
  int64_t pressure_prompt_tokens = 1024;  // each pressure prompt, >= 16 (<= pool / 4 as run)
  double pressure_timeout_s = 300;        // the longest a pause waits for its cycles, > 0
  // Targets (the resumed turn's time, tool_end + TTFT p50, with offloading / without):
  double max_resume_ratio = 1.0;            // without pressure
  double max_pressured_resume_ratio = 0.3;  // with pressure
  double max_tool_end_p50_s = 0.1;          // without pressure
};

void apply_quick(ToolCallsOptions& o);
Status validate(const ToolCallsOptions& o);
// Exit code: 0 done, 1 the pool was not cycled in every pause (pressured) or, with
// --check, a target was missed; 2 an error (the session API missing included).
int run_tool_calls(const ToolCallsOptions& o);

}  // namespace strata::bench
