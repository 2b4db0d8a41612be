// The engine's options register their own flags (engine_options.h): names and aliases,
// defaults taken from the fields, seconds turned into milliseconds, enums parsed once,
// ranges refused by the parser.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include <string>
#include <utility>
#include <vector>

#include "engine/engine_options.h"

namespace strata {
namespace {

// Parses `args` (without the program name) into fresh options with every engine flag.
struct Parsed {
  EngineOptions options;
  CLI::App app{"test"};
  Parsed() {
    add_engine_flags(app, options);
    add_hicache_flags(app, options.hicache);
    add_pd_flags(app, options.pd);
  }
  void parse(std::vector<std::string> args) {
    std::vector<const char*> argv{"test"};
    for (const auto& a : args) argv.push_back(a.c_str());
    app.parse(static_cast<int>(argv.size()), argv.data());
  }
};

TEST(EngineOptionsFlagsTest, NoFlagsLeaveTheDefaults) {
  Parsed p;
  p.parse({});
  const EngineOptions defaults;
  EXPECT_EQ(p.options.page_size, defaults.page_size);
  EXPECT_EQ(p.options.chunked_prefill_size, defaults.chunked_prefill_size);
  EXPECT_EQ(p.options.kv_dtype, defaults.kv_dtype);
  EXPECT_EQ(p.options.max_client_pin_ttl_ms, defaults.max_client_pin_ttl_ms);
  EXPECT_EQ(p.options.max_sessions, defaults.max_sessions);
  EXPECT_EQ(p.options.session_idle_ttl_ms, defaults.session_idle_ttl_ms);
  EXPECT_EQ(p.options.tool_session_ttl_ms, defaults.tool_session_ttl_ms);
  EXPECT_EQ(p.options.hicache.write_policy, defaults.hicache.write_policy);
  EXPECT_EQ(p.options.pd.role, WorkerRole::kMixed);
  EXPECT_TRUE(validate(p.options));
}

TEST(EngineOptionsFlagsTest, TheHelpShowsEachDefault) {
  Parsed p;
  const std::string help = p.app.help();
  for (const char* expected : {"--page-size",
                               "=16",
                               "--kv-cache-dtype",
                               "=f32",
                               "--max-client-pin-ttl-s",
                               "=300",
                               "--max-conversations",
                               "--max-sessions",
                               "=10000",
                               "--conversation-ttl-s",
                               "--session-ttl-s",
                               "=3600",
                               "--hicache-write-policy",
                               "=write_through",
                               "--hicache-mem-layout",
                               "=layer_first",
                               "--hicache-storage-prefetch-policy",
                               "=best_effort",
                               "--role",
                               "=mixed",
                               "--pd-transport",
                               "=ucx"}) {
    EXPECT_NE(help.find(expected), std::string::npos) << expected << "\n" << help;
  }
}

TEST(EngineOptionsFlagsTest, SecondsFillMilliseconds) {
  Parsed p;
  p.parse(
      {"--max-client-pin-ttl-s", "12", "--conversation-ttl-s", "7", "--tool-session-ttl-s", "90"});
  EXPECT_EQ(p.options.max_client_pin_ttl_ms, 12'000);
  EXPECT_EQ(p.options.session_idle_ttl_ms, 7'000);
  EXPECT_EQ(p.options.tool_session_ttl_ms, 90'000);
}

TEST(EngineOptionsFlagsTest, TheOldSessionNamesAreAliases) {
  Parsed p;
  p.parse({"--max-sessions", "5", "--session-ttl-s", "9"});
  EXPECT_EQ(p.options.max_sessions, 5);
  EXPECT_EQ(p.options.session_idle_ttl_ms, 9'000);
  Parsed q;
  q.parse({"--max-conversations", "6"});
  EXPECT_EQ(q.options.max_sessions, 6);
}

TEST(EngineOptionsFlagsTest, TheChunkIsAtLeastAPageWhicheverFlagComesFirst) {
  for (const auto& args :
       {std::vector<std::string>{"--page-size", "64", "--chunked-prefill-size", "8"},
        std::vector<std::string>{"--chunked-prefill-size", "8", "--page-size", "64"}}) {
    Parsed p;
    p.parse(args);
    EXPECT_EQ(p.options.page_size, 64);
    EXPECT_EQ(p.options.chunked_prefill_size, 64);
  }
  Parsed p;
  p.parse({"--page-size", "32", "--chunked-prefill-size", "100"});
  EXPECT_EQ(p.options.chunked_prefill_size, 100);
}

TEST(EngineOptionsFlagsTest, EnumsAreParsedOnce) {
  Parsed p;
  p.parse({"--kv-cache-dtype", "bf16", "--hicache-write-policy", "write_back",
           "--hicache-mem-layout", "page_first", "--hicache-storage-prefetch-policy", "timeout",
           "--role", "decode", "--pd-prefill-peer", "tcp://127.0.0.1:1"});
  EXPECT_EQ(p.options.kv_dtype, KvDtype::kBF16);
  EXPECT_EQ(p.options.hicache.write_policy, WritePolicy::kWriteBack);
  EXPECT_EQ(p.options.hicache.layout, HostLayout::kPageFirst);
  EXPECT_EQ(p.options.hicache.prefetch_policy, PrefetchPolicy::kTimeout);
  EXPECT_EQ(p.options.pd.role, WorkerRole::kDecode);
  EXPECT_EQ(p.options.pd.prefill_peers, std::vector<std::string>{"tcp://127.0.0.1:1"});
}

TEST(EngineOptionsFlagsTest, BadValuesAreRefusedWithTheFlagsName) {
  const std::vector<std::vector<std::string>> bad = {
      {"--kv-cache-dtype", "f64"},
      {"--kv-cache-dtype", "int4"},
      {"--kv-cache-memory", "lots"},
      {"--kv-cache-memory", "12XB"},
      {"--kv-cache-memory", "0"},
      {"--kv-cache-memory", "-1GB"},
      {"--kv-cache-memory", "0.5"},
      {"--kv-cache-memory", "1e30"},
      {"--hicache-write-policy", "sometimes"},
      {"--hicache-mem-layout", "sideways"},
      {"--hicache-storage-prefetch-policy", "never"},
      {"--role", "router"},
      {"--page-size", "0"},
      {"--page-size", "512"},
      {"--max-pinned-ratio", "1.5"},
      {"--max-client-pin-ttl-s", "0"},
      {"--conversation-ttl-s", "0"},
      {"--max-conversations", "-1"},
      {"--pd-transport", "carrier-pigeon"},
  };
  for (const auto& args : bad) {
    Parsed p;
    try {
      p.parse(args);
      ADD_FAILURE() << args[0] << " " << args[1] << " was accepted";
    } catch (const CLI::ParseError& e) {
      EXPECT_NE(std::string(e.what()).find(args[0]), std::string::npos) << e.what();
    }
  }
}

// 8-bit pages and a pool sized in bytes (issue 54).
TEST(EngineOptionsFlagsTest, KvCacheMemoryTakesBytesWithUnits) {
  const std::vector<std::pair<std::string, int64_t>> sizes = {{"512MiB", int64_t{512} << 20},
                                                              {"2GB", 2'000'000'000},
                                                              {"2gb", 2'000'000'000},
                                                              {"1.5GiB", int64_t{3} << 29},
                                                              {"4096", 4096},
                                                              {"64KB", 64'000},
                                                              {"3G", int64_t{3} << 30},
                                                              {"1TiB", int64_t{1} << 40},
                                                              {"100B", 100}};
  for (const auto& [text, bytes] : sizes) {
    auto parsed = parse_byte_size(text);
    ASSERT_TRUE(parsed) << text << ": " << parsed.error().message;
    EXPECT_EQ(*parsed, bytes) << text;
  }
  for (const char* bad : {"", "GB", "1.2.3GB", "5 GB", "-5MB", "5PB", "0", "0.25", "1e3"}) {
    EXPECT_FALSE(parse_byte_size(bad)) << bad;
  }
  Parsed p;
  p.parse({"--kv-cache-memory", "512MiB", "--kv-cache-dtype", "fp8"});
  EXPECT_EQ(p.options.kv_cache_memory_bytes, int64_t{512} << 20);
  EXPECT_EQ(p.options.kv_dtype, KvDtype::kFp8E4M3);
  Parsed q;
  q.parse({"--kv-cache-dtype", "int8"});
  EXPECT_EQ(q.options.kv_dtype, KvDtype::kInt8);
  EXPECT_EQ(q.options.kv_cache_memory_bytes, 0);
}

TEST(EngineOptionsFlagsTest, KvCacheMemoryAndTokensExcludeEachOther) {
  Parsed p;
  try {
    p.parse({"--kv-cache-memory", "1GB", "--kv-cache-tokens", "4096"});
    ADD_FAILURE() << "both were accepted";
  } catch (const CLI::ParseError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("--kv-cache-memory"), std::string::npos) << what;
    EXPECT_NE(what.find("--kv-cache-tokens"), std::string::npos) << what;
  }
}

TEST(EngineOptionsFlagsTest, SizePoolByMemoryCountsWholePages) {
  EngineOptions o;
  o.page_size = 16;
  EXPECT_TRUE(size_pool_by_memory(o, 1000));  // unset: nothing changes
  EXPECT_EQ(o.kv_cache_tokens, EngineOptions{}.kv_cache_tokens);
  o.kv_cache_memory_bytes = 10'500;
  ASSERT_TRUE(size_pool_by_memory(o, 1000));
  EXPECT_EQ(o.kv_cache_tokens, 10 * 16);
  o.kv_cache_memory_bytes = 3'999;
  const Status small = size_pool_by_memory(o, 1000);
  ASSERT_FALSE(small);
  EXPECT_NE(small.error().message.find("--kv-cache-memory"), std::string::npos);
}

TEST(EngineOptionsFlagsTest, PrefetchPolicyNamesRoundTrip) {
  for (PrefetchPolicy policy :
       {PrefetchPolicy::kBestEffort, PrefetchPolicy::kWaitComplete, PrefetchPolicy::kTimeout}) {
    auto parsed = parse_prefetch_policy(prefetch_policy_name(policy));
    ASSERT_TRUE(parsed);
    EXPECT_EQ(*parsed, policy);
  }
}

}  // namespace
}  // namespace strata
