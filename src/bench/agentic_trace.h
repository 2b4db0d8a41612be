// An agentic trace of our own, in Mooncake's format (cluster_trace.h), for
// `strata bench cluster --trace` (issue 33): `strata bench make-trace --out FILE`.
//
// What it models: agent sessions (a coding or tool-using agent, one user task each) that
// call the model again and again. A session's prompt is one growing token stream:
//
//   [system prompt + tool schemas: one of `templates`, shared by the sessions that use it]
//   [the user's task: the session's own]
//   [call 1's output][tool result 1][call 2's output][tool result 2]...
//
// Call j's prompt is the stream's first L_j tokens, and call j+1's prompt extends call j's
// token for token (the agent appends the model's answer and the tool's result), so every
// call after the first could reuse all of the previous call's prompt from the cache. The
// stream is cut into blocks of `block_tokens`; a block wholly inside the template is the
// template's (the same hash id in every session using it), every other block the
// session's own. A call's hash ids are its prompt's blocks, the last one cut (a block a
// call sees cut short is the same id, whole, in the next call: its first tokens are the
// same).
//
// Timing. Sessions start as a Poisson process of `session_rate_per_s`; templates are
// drawn with a Zipf skew (a few system prompts serve most sessions). Call j+1 arrives
// after call j's expected answer time (`seconds_per_output_token` per output token) plus
// the tool's run time (exponential, mean `tool_seconds_mean`): open-loop timestamps, as
// the format has. A session ends after its drawn number of calls, or before a call whose
// prompt would pass `max_prompt_tokens`.
//
// Each line also carries "session_id" (e.g. "agent-17"), which Mooncake's format lacks:
// the replay groups the calls of a session by it (trace_families) and, with
// --trace-sessions, sends it as the request's session.
//
// Pure: the same options give the same trace, byte for byte.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "bench/cluster_trace.h"
#include "common/result.h"

namespace strata::bench {

struct AgenticTraceOptions {
  int64_t sessions = 400;
  double session_rate_per_s = 2.0;
  int64_t templates = 8;
  double template_skew = 1.0;  // Zipf exponent over the templates (0: uniform)
  int64_t template_tokens_min = 4096;
  int64_t template_tokens_max = 12288;
  int64_t task_tokens_min = 256;
  int64_t task_tokens_max = 2048;
  int64_t calls_min = 4;
  int64_t calls_max = 24;
  int64_t output_tokens_min = 32;
  int64_t output_tokens_max = 320;
  int64_t tool_tokens_min = 128;
  int64_t tool_tokens_max = 3072;
  double tool_seconds_mean = 2.0;
  double seconds_per_output_token = 0.01;
  int64_t max_prompt_tokens = 40000;
  int64_t block_tokens = kMooncakeBlockTokens;
  uint64_t seed = 1;
};

// kInvalidArgument naming the option (as its flag) when a count is < 1, a range is
// inverted, a rate or mean is not positive and finite, or a template cannot fit in
// max_prompt_tokens with its largest task.
Status validate(const AgenticTraceOptions& o);

struct AgenticTraceLine {
  TraceRequest request;  // line, timestamp, lengths, hash ids
  std::string session;   // "agent-<n>", n from 0 in order of the sessions' starts
  int64_t call = 0;      // 0-based call of its session
};

// The trace's calls, sorted by timestamp (stable: a session's calls keep their order),
// numbered by line from 1. Requires validate(o).
std::vector<AgenticTraceLine> make_agentic_trace(const AgenticTraceOptions& o);

// One JSON line per call: timestamp (ms, integer), input_length, output_length, hash_ids,
// session_id.
void write_trace_jsonl(std::ostream& out, const std::vector<AgenticTraceLine>& lines);

}  // namespace strata::bench
