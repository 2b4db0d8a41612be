// The processes of one measured phase of `strata bench cluster`: N `strata serve` workers
// that publish KV events, and one `strata route` in front of them (or several replicas, each
// indexing every worker: --routers, with --session-store among their arguments so that they
// share session bindings, router/shared_sessions.h), on free loopback ports,
// each logging to a file, stopped by pid (also on failure and on Ctrl-C: server_process.h).
// A worker can be killed (SIGKILL, no goodbye) and restarted where it was: the same HTTP
// port and KV event endpoints, so that the router sees the same worker come back.
//
// Threads: a Fleet belongs to the thread that started it, which must be the main thread
// (a spawned process dies with the thread that forked it); its const accessors may be read
// from any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/http_client.h"
#include "bench/server_process.h"
#include "common/result.h"

namespace strata::bench {

struct FleetOptions {
  std::string strata_bin;                // the `strata` executable
  std::string model_dir;                 // served by the workers, tokenizer of the router
  int32_t workers = 3;                   // >= 1
  std::vector<std::string> worker_args;  // after `serve --model --host --port --kv-events-*`
  std::vector<std::string> router_args;  // after `route --model --host --port --worker...`
  int32_t routers = 1;                   // replicas of the router, >= 1
  std::filesystem::path log_dir;         // <log_dir>/<log_prefix>-worker-<i>.log, -router[-<j>].log
  std::string log_prefix;
  double start_timeout_s = 300;  // each process must answer /health by then
  double join_timeout_s = 60;    // the router must list every worker joined by then
};

class Fleet {
 public:
  // Starts the workers (all forked, then each awaited), then the routers, then waits until
  // each router's GET /workers shows every worker joined and eligible. On an error, what was
  // started is stopped.
  static Result<std::unique_ptr<Fleet>> start(const FleetOptions& options);
  ~Fleet();  // stop()
  Fleet(const Fleet&) = delete;
  Fleet& operator=(const Fleet&) = delete;

  const std::string& router_url() const { return router_urls_.front(); }
  const std::vector<std::string>& router_urls() const { return router_urls_; }
  const std::vector<std::string>& worker_urls() const { return worker_urls_; }

  // SIGKILL to worker `i`, then reaps it.
  Status kill_worker(size_t i);
  // Starts worker `i` again on its port and endpoints; returns when it answers /health.
  Status restart_worker(size_t i);
  // SIGKILL to router replica `i` (no goodbye: its clients' connections break), then reaps it.
  Status kill_router(size_t i);
  // The routers first (their running requests end), then the workers. Idempotent.
  void stop();

  // CPU seconds so far of each router replica and each worker (ServerProcess::cpu_seconds;
  // -1 for one killed or unreadable).
  struct CpuSeconds {
    std::vector<double> routers;
    std::vector<double> workers;
  };
  CpuSeconds cpu_seconds() const;

 private:
  Fleet() = default;
  FleetOptions options_;
  std::vector<std::unique_ptr<ServerProcess>> workers_;  // null while killed
  std::vector<std::string> worker_urls_;
  std::vector<std::string> kv_events_;                   // per worker: publisher endpoint
  std::vector<std::string> kv_replay_;                   // per worker: replay endpoint
  std::vector<int> restarts_;                            // per worker
  std::vector<std::unique_ptr<ServerProcess>> routers_;  // null once killed
  std::vector<std::string> router_urls_;
};

// Polls GET /workers of a router until it lists at least `expected` workers (0: at least
// one), every one joined and eligible and with a known device pool; returns that answer.
Result<nlohmann::json> wait_workers_joined(const ServerClient& router, size_t expected,
                                           double timeout_s);

}  // namespace strata::bench
