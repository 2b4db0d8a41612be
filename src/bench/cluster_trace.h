// Production traces for `strata bench cluster --trace FILE` (issue 33), in Mooncake's
// format (kvcache-ai/Mooncake, FAST'25): JSON lines, one request each,
//
//   {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}
//
// - timestamp: the arrival in milliseconds from the trace's start (>= 0);
// - input_length, output_length: prompt and completion tokens (>= 1);
// - hash_ids: the prompt's blocks of `block_tokens` tokens (512 in Mooncake's traces), as
//   small integers: two requests share a prefix exactly as far as their lists agree from
//   the start. The last block is cut to input_length, so ceil(input_length / block_tokens)
//   ids are needed; ids beyond those are ignored;
// - session_id (optional, not Mooncake's): a string or integer naming the request's
//   session; our agentic traces carry it (agentic_trace.h). Other fields are ignored.
//
// Replay. Every hash id becomes a block of token ids drawn from a vocabulary with a
// generator seeded by (seed, id) (TraceTokens): equal ids give equal blocks, different ids
// different ones (a collision of two random blocks is out of reach), so the trace's prefix
// sharing is kept exactly, and a prompt is its blocks end to end, the last one cut.
//
// The ideal (trace_ideal_hit): what one infinite cache would hit, counting over the
// requests in order what earlier ones already brought. Mooncake's count is blocks already
// seen; the token count, which a worker's `usage.cached_tokens` compares with, is each
// request's leading run of tokens that earlier requests held (a block seen only cut short
// counts as far as it was seen, and ends the run), in whole pages of `page_tokens`.
//
// Pure functions and values; a TraceTokens is immutable once made and may be shared.
#pragma once

#include <cstdint>
#include <filesystem>
#include <istream>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace strata::bench {

inline constexpr const char* kTrace = "trace";  // the workload's name in results.json

// Mooncake's block size.
inline constexpr int64_t kMooncakeBlockTokens = 512;

struct TraceRequest {
  int64_t line = 0;           // 1-based line of the file
  double timestamp_ms = 0;    // arrival since the trace's start, >= 0
  int64_t input_tokens = 0;   // >= 1
  int64_t output_tokens = 0;  // >= 1
  // ceil(input_tokens / block_tokens) ids, the prompt's blocks in order (extra ids of the
  // line dropped).
  std::vector<int64_t> hash_ids;
  std::string session;  // the line's session_id, as a string; empty without one
};

// One line (without its newline). kInvalidArgument naming "line N" and the field on a
// line that is not a JSON object, misses a field, holds a value of the wrong type or sign,
// or whose hash_ids are too few for its input_length.
Result<TraceRequest> parse_trace_line(std::string_view text, int64_t line, int64_t block_tokens);

// The first `limit` requests (0: all) of a trace, blank lines skipped, stably sorted by
// timestamp. `name` (the file) prefixes every error. An empty trace is an error.
Result<std::vector<TraceRequest>> parse_trace(std::istream& in, const std::string& name,
                                              int64_t block_tokens, int64_t limit);
Result<std::vector<TraceRequest>> load_trace(const std::filesystem::path& path,
                                             int64_t block_tokens, int64_t limit);

// The token blocks of hash ids.
class TraceTokens {
 public:
  // `vocabulary`: the token ids blocks are drawn from (ordinary tokens of the served
  // model, >= 2 distinct); block_tokens >= 1.
  TraceTokens(uint64_t seed, int64_t block_tokens, std::vector<int32_t> vocabulary);

  int64_t block_tokens() const { return block_tokens_; }
  // block_tokens ids, a function of (seed, hash_id, vocabulary) alone.
  std::vector<int32_t> block(int64_t hash_id) const;
  // The request's prompt: its blocks end to end, cut to input_tokens.
  std::vector<int32_t> prompt(const TraceRequest& r) const;

 private:
  uint64_t seed_;
  int64_t block_tokens_;
  std::vector<int32_t> vocabulary_;
};

// What one infinite cache would hit over `requests` in order (see the top).
struct TraceIdeal {
  int64_t blocks = 0;       // hash ids of every request
  int64_t seen_blocks = 0;  // of them: ids an earlier request had (Mooncake's count)
  int64_t prompt_tokens = 0;
  int64_t hit_tokens = 0;  // leading runs held by earlier requests, in whole pages
  std::vector<int64_t> hit_tokens_per_request;  // in the order of `requests`
  double block_fraction() const;                // seen_blocks / blocks; 0 when empty
  double token_fraction() const;                // hit_tokens / prompt_tokens; 0 when empty
};

// block_tokens >= 1, page_tokens >= 1 (1: no rounding).
TraceIdeal trace_ideal_hit(std::span<const TraceRequest> requests, int64_t block_tokens,
                           int64_t page_tokens);

// The prefix families of a trace: requests of one session_id form one; requests without
// one form one when their first hash id is equal (a conversation's turns, an agent's
// calls, users of one system prompt). For each request, its family's index (in order of
// first appearance) and whether it is the family's first request. A family stands for a
// session in the per-worker balance (its first request's worker owns it), since
// Mooncake's format has no session ids.
struct TraceFamilies {
  std::vector<int64_t> family;  // per request
  std::vector<bool> first;      // per request
  int64_t count = 0;
};
TraceFamilies trace_families(std::span<const TraceRequest> requests);

}  // namespace strata::bench
