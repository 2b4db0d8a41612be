// `strata bench load`: a concurrency sweep of multi-turn chat traffic. At each level,
// `concurrency` users replay generated conversations turn by turn (streaming) until the
// level's request budget is spent; reported per level: TTFT and inter-token latency
// p50/p90/p99, output tokens/s, requests/s and the cache hit rate.
//
// Threads: run_load() runs on the calling (main) thread; the traffic has its own workers.
#pragma once

#include <cstdint>
#include <vector>

#include "bench/conversation.h"
#include "bench/target.h"
#include "common/result.h"

namespace strata::bench {

struct LoadOptions {
  TargetOptions target;
  RunOptions run;
  std::vector<int32_t> concurrency = {1, 2, 4, 8};  // users per level, each >= 1
  int64_t requests_per_level = 48;                  // requests sent at each level, >= 1
  int32_t max_tokens = 64;                          // generated per request, >= 2
  ConversationShape shape;                          // the users' conversations
  bool flush_between_levels = true;                 // each level starts from an empty cache
};

void apply_quick(LoadOptions& o);
Status validate(const LoadOptions& o);
// Exit code: 0 done, 2 an error (a failed request included).
int run_load(const LoadOptions& o);

}  // namespace strata::bench
