// The agentic trace generator (agentic_trace.h): every call's prompt extends its session's
// previous one block for block, templates are shared and nothing else is, the file reads
// back through the replay's own parser, and bad options are refused by name.
#include "bench/agentic_trace.h"

#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "bench/cluster_trace.h"

namespace strata::bench {
namespace {

AgenticTraceOptions small_options() {
  AgenticTraceOptions o;
  o.sessions = 60;
  o.templates = 3;
  o.template_tokens_min = 300;
  o.template_tokens_max = 900;
  o.task_tokens_min = 10;
  o.task_tokens_max = 200;
  o.calls_min = 2;
  o.calls_max = 9;
  o.tool_tokens_min = 5;
  o.tool_tokens_max = 300;
  o.max_prompt_tokens = 3000;
  o.block_tokens = 64;
  o.seed = 7;
  return o;
}

TEST(AgenticTraceTest, CallsExtendTheirSessionsPromptBlockForBlock) {
  const AgenticTraceOptions o = small_options();
  ASSERT_TRUE(validate(o));
  const std::vector<AgenticTraceLine> lines = make_agentic_trace(o);
  std::map<std::string, const AgenticTraceLine*> last;  // per session
  std::set<std::string> sessions;
  double previous_ms = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const AgenticTraceLine& l = lines[i];
    const TraceRequest& r = l.request;
    EXPECT_EQ(r.line, static_cast<int64_t>(i) + 1);
    EXPECT_GE(r.timestamp_ms, previous_ms);  // sorted
    previous_ms = r.timestamp_ms;
    EXPECT_EQ(static_cast<int64_t>(r.hash_ids.size()),
              (r.input_tokens + o.block_tokens - 1) / o.block_tokens);
    EXPECT_LE(r.input_tokens, o.max_prompt_tokens);
    EXPECT_GE(r.output_tokens, o.output_tokens_min);
    EXPECT_LE(r.output_tokens, o.output_tokens_max);
    sessions.insert(l.session);
    if (auto it = last.find(l.session); it != last.end()) {
      const TraceRequest& p = it->second->request;
      EXPECT_EQ(l.call, it->second->call + 1);
      EXPECT_GT(r.timestamp_ms, p.timestamp_ms);
      // The previous prompt, its output and at least one tool token.
      EXPECT_GE(r.input_tokens, p.input_tokens + p.output_tokens + o.tool_tokens_min);
      ASSERT_GE(r.hash_ids.size(), p.hash_ids.size());
      EXPECT_TRUE(std::equal(p.hash_ids.begin(), p.hash_ids.end(), r.hash_ids.begin()))
          << "line " << r.line;
    } else {
      EXPECT_EQ(l.call, 0);
    }
    last[l.session] = &l;
  }
  EXPECT_EQ(static_cast<int64_t>(sessions.size()), o.sessions);
}

// A block id appears in two sessions only when it is one of a template's whole blocks,
// and the sessions of one template share exactly its whole blocks.
TEST(AgenticTraceTest, OnlyTemplateBlocksAreShared) {
  const AgenticTraceOptions o = small_options();
  const std::vector<AgenticTraceLine> lines = make_agentic_trace(o);
  std::map<int64_t, std::set<std::string>> holders;  // block id -> sessions
  std::map<std::string, std::vector<int64_t>> first_blocks;
  for (const AgenticTraceLine& l : lines) {
    for (int64_t id : l.request.hash_ids) holders[id].insert(l.session);
    if (l.call == 0) first_blocks[l.session] = l.request.hash_ids;
  }
  // Template blocks are numbered first; every template has at least 300 / 64 = 4 of them.
  int64_t shared = 0;
  for (const auto& [id, who] : holders) {
    if (who.size() > 1) {
      ++shared;
      EXPECT_LT(id, o.templates * (o.template_tokens_max / o.block_tokens)) << id;
    }
  }
  EXPECT_GT(shared, 0);
  // Two sessions either start with the same block (the same template) or share nothing.
  for (const auto& [a, ids_a] : first_blocks) {
    for (const auto& [b, ids_b] : first_blocks) {
      if (a >= b) continue;
      const std::set<int64_t> sa(ids_a.begin(), ids_a.end());
      size_t common = 0;
      for (int64_t id : ids_b) common += sa.count(id);
      if (ids_a.front() != ids_b.front()) {
        EXPECT_EQ(common, 0u) << a << " " << b;
      } else {
        EXPECT_GE(common, 4u) << a << " " << b;
      }
    }
  }
}

TEST(AgenticTraceTest, TheFileReadsBackAsTheReplayReadsIt) {
  const AgenticTraceOptions o = small_options();
  const std::vector<AgenticTraceLine> lines = make_agentic_trace(o);
  std::stringstream file;
  write_trace_jsonl(file, lines);
  auto parsed = parse_trace(file, "agentic.jsonl", o.block_tokens, 0);
  ASSERT_TRUE(parsed) << parsed.error().message;
  ASSERT_EQ(parsed->size(), lines.size());
  for (size_t i = 0; i < lines.size(); ++i) {
    const TraceRequest& r = (*parsed)[i];
    EXPECT_EQ(r.timestamp_ms, lines[i].request.timestamp_ms);
    EXPECT_EQ(r.input_tokens, lines[i].request.input_tokens);
    EXPECT_EQ(r.output_tokens, lines[i].request.output_tokens);
    EXPECT_EQ(r.hash_ids, lines[i].request.hash_ids);
    EXPECT_EQ(r.session, lines[i].session);
  }
  // Families are the sessions; a session's first call is its family's first request.
  const TraceFamilies f = trace_families(*parsed);
  EXPECT_EQ(f.count, o.sessions);
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(f.first[i], lines[i].call == 0);
  // Every call after a session's first could reuse its previous prompt: the ideal is high.
  EXPECT_GT(trace_ideal_hit(*parsed, o.block_tokens, 1).token_fraction(), 0.5);
}

TEST(AgenticTraceTest, TheSameOptionsGiveTheSameTraceAndAnotherSeedAnother) {
  const AgenticTraceOptions o = small_options();
  std::stringstream a, b, c;
  write_trace_jsonl(a, make_agentic_trace(o));
  write_trace_jsonl(b, make_agentic_trace(o));
  AgenticTraceOptions other = o;
  other.seed = 8;
  write_trace_jsonl(c, make_agentic_trace(other));
  EXPECT_EQ(a.str(), b.str());
  EXPECT_NE(a.str(), c.str());
}

TEST(AgenticTraceTest, BadOptionsAreRefusedByName) {
  auto refused = [](auto change, const char* flag) {
    AgenticTraceOptions o = small_options();
    change(o);
    const Status s = validate(o);
    ASSERT_FALSE(s) << flag;
    EXPECT_NE(s.error().message.find(flag), std::string::npos) << s.error().message;
  };
  refused([](auto& o) { o.sessions = 0; }, "--sessions");
  refused([](auto& o) { o.templates = 0; }, "--templates");
  refused([](auto& o) { o.block_tokens = 0; }, "--block-tokens");
  refused([](auto& o) { o.template_skew = -1; }, "--template-skew");
  refused([](auto& o) { o.calls_max = 1; }, "--calls-max");
  refused([](auto& o) { o.task_tokens_min = 0; }, "--task-tokens-min");
  refused([](auto& o) { o.output_tokens_max = 0; }, "--output-tokens-max");
  refused([](auto& o) { o.tool_tokens_max = 1; }, "--tool-tokens-max");
  refused([](auto& o) { o.session_rate_per_s = 0; }, "--session-rate");
  refused([](auto& o) { o.tool_seconds_mean = std::nan(""); }, "--tool-seconds");
  refused([](auto& o) { o.seconds_per_output_token = -1; }, "--seconds-per-output-token");
  refused([](auto& o) { o.max_prompt_tokens = 1000; }, "--max-prompt-tokens");
}

// session_id: a string or an integer; anything else names the line.
TEST(AgenticTraceTest, SessionIdsAreReadOrRefused) {
  auto r = parse_trace_line(
      R"({"timestamp": 1, "input_length": 4, "output_length": 1, "hash_ids": [1], "session_id": 42})",
      1, 4);
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->session, "42");
  for (const char* bad : {R"("session_id": [1])", R"("session_id": "")", R"("session_id": 1.5)"}) {
    const std::string line =
        std::string(
            R"({"timestamp": 1, "input_length": 4, "output_length": 1, "hash_ids": [1], )") +
        bad + "}";
    auto refused = parse_trace_line(line, 3, 4);
    ASSERT_FALSE(refused) << bad;
    EXPECT_NE(refused.error().message.find("line 3: 'session_id'"), std::string::npos)
        << refused.error().message;
  }
}

}  // namespace
}  // namespace strata::bench
