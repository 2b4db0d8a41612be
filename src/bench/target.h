// What every scenario needs to reach a server: the options naming it (--url of a running
// server, or --spawn of `strata serve` on --model with pass-through --server-arg), opening
// it (a fresh process per phase with --spawn), token counting for the conversation
// generator, and typed reads of /cache/state.
//
// Threads: options and CacheState are values; open_server() must run on the main thread
// (a spawned server is tied to the thread that forked it, see server_process.h).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/http_client.h"
#include "bench/server_process.h"
#include "bench/text_generator.h"
#include "common/result.h"

namespace strata::bench {

struct TargetOptions {
  std::string url;                       // --url: a running server
  bool spawn = false;                    // --spawn: start `strata serve` per phase
  std::string model_dir;                 // --model: served with --spawn; tokenizer source
  std::vector<std::string> server_args;  // --server-arg, each split at whitespace
  std::string strata_bin;                // --strata-bin (default: this executable)
  std::string kv_events_endpoint;        // --kv-events-endpoint of the --url server
  std::string api_key;                   // --api-key: the server's admin key
  double start_timeout_s = 300;          // a spawned server must answer /health by then
};

// Exactly one of --url and --spawn; --spawn needs --model.
Status validate(const TargetOptions& o);

struct RunOptions {
  std::string out_dir;  // results.json, charts, summary.md, server logs
  uint64_t seed = 1;    // every generated conversation follows from it
  bool quick = false;   // a small, fast configuration (scenario-specific)
  bool check = false;   // fail (exit 1) when a target is missed
};

// A server to drive: the --url one, or a process spawned for one phase.
struct ServerHandle {
  std::string url;
  std::string kv_events_endpoint;          // empty when the server publishes none
  std::unique_ptr<ServerProcess> process;  // null for --url
  std::filesystem::path log_path;          // spawned servers only
  std::string api_key;
  ServerClient client() const { return ServerClient(url, api_key); }
  std::vector<std::string> argv() const {
    return process ? process->argv() : std::vector<std::string>{};
  }
};

// With --spawn: starts `strata serve --model ... <server args> <extra_args>` logging to
// `log_path` (with KV events on fresh ports when `kv_events`). With --url: the server
// there (its KV events at --kv-events-endpoint).
Result<ServerHandle> open_server(const TargetOptions& o, const std::vector<std::string>& extra_args,
                                 const std::filesystem::path& log_path, bool kv_events);

// Splits each --server-arg at whitespace ("--kv-cache-tokens 4096" is two arguments).
std::vector<std::string> split_args(const std::vector<std::string>& args);

// The model folder's tokenizer when --model is given, else the --url server's /tokenize.
Result<TokenCounter> make_token_counter(const TargetOptions& o);

// True when `strata serve --help` of `strata_bin` lists `option`.
bool serve_supports(const std::string& strata_bin, const std::string& option);

// The figures of GET /cache/state the scenarios use (the whole answer is kept in `raw`).
struct CacheState {
  int64_t page_size = 0;
  int64_t capacity_tokens = 0;  // device pool
  int64_t capacity_pages = 0;
  int64_t cached_pages = 0;
  int64_t pinned_blocks = 0;
  bool has_host = false;  // host is not null: a hierarchical cache
  int64_t host_capacity_tokens = 0;
  int64_t evicted_pages_total = 0;
  int64_t auto_unpinned_blocks_total = 0;
  int64_t running = 0;
  int64_t waiting = 0;
  nlohmann::json raw;
};

Result<CacheState> read_cache_state(const ServerClient& client);
// Polls /cache/state until no request runs or waits; false on timeout.
Result<bool> wait_idle(const ServerClient& client, double timeout_s);
// data[0].id of GET /v1/models.
Result<std::string> served_model_id(const ServerClient& client);

}  // namespace strata::bench
