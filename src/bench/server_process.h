// Starts and stops `strata serve` (or `strata route`) processes for the benchmark's --spawn
// mode: fresh free loopback ports (or given ones, to restart a server where it was), the
// log in a file of the output folder, readiness by GET /health, and a stop by SIGTERM then
// SIGKILL after a timeout. Spawned servers are also stopped when the benchmark is
// interrupted (SIGINT/SIGTERM) or exits early, and die with it (they get SIGTERM when the
// benchmark process dies).
//
// Threads: a ServerProcess is owned by one thread. The interrupt handler and the registry
// of live children are process-wide and async-signal-safe.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/result.h"

namespace strata::bench {

struct SpawnOptions {
  std::string strata_bin;                 // the `strata` executable
  std::string command = "serve";          // the subcommand: "serve" or "route"
  std::string model_dir;                  // --model
  std::vector<std::string> extra_args;    // passed to `strata serve` after ours
  std::filesystem::path log_path;         // stdout and stderr of the server
  bool kv_events = false;                 // publish KV events (on fresh ports unless given)
  int port = 0;                           // the HTTP port; 0: a free one
  std::string kv_events_endpoint;         // with kv_events: tcp://host:port; "": a free port
  std::string kv_events_replay_endpoint;  // likewise, the replay socket
  double start_timeout_s = 300;           // until /health answers 200
  bool wait_ready = true;  // false: start() returns once forked; then call wait_ready()
};

class ServerProcess {
 public:
  static Result<std::unique_ptr<ServerProcess>> start(const SpawnOptions& options);
  // Waits until /health answers 200 (start() does, unless told not to); on a failure the
  // process is stopped and the error carries its log's tail.
  Status wait_ready(double timeout_s);
  ~ServerProcess();  // stop()
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  const std::string& url() const { return url_; }
  // Empty when started without kv_events.
  const std::string& kv_events_endpoint() const { return kv_events_endpoint_; }
  const std::string& kv_events_replay_endpoint() const { return kv_events_replay_endpoint_; }
  const std::vector<std::string>& argv() const { return argv_; }
  pid_t pid() const { return pid_; }
  bool alive();
  // The process's CPU time so far (user + system, /proc/PID/stat), in seconds; -1 when it
  // cannot be read (stopped, not Linux).
  double cpu_seconds() const;
  // SIGTERM, then SIGKILL after `timeout_s`. Idempotent.
  Status stop(double timeout_s = 15);

 private:
  ServerProcess() = default;
  pid_t pid_ = -1;
  std::string url_;
  std::string kv_events_endpoint_;
  std::string kv_events_replay_endpoint_;
  std::vector<std::string> argv_;
  std::string command_;
  std::filesystem::path log_path_;
};

// A free TCP port on 127.0.0.1 (bound to port 0 and released; another process may take
// it before us, which start() reports as a failed start).
Result<int> pick_free_port();
// This executable's path (/proc/self/exe).
std::string self_executable();
// Stdout of `command` run by the shell (for `strata serve --help`); empty on failure.
std::string command_output(const std::string& command);
// The last `max_bytes` of a file (server logs in error messages).
std::string file_tail(const std::filesystem::path& path, size_t max_bytes);

// Installs SIGINT/SIGTERM handlers that stop spawned servers and record the interrupt.
void install_interrupt_handler();
// True after SIGINT/SIGTERM.
bool interrupted();

}  // namespace strata::bench
