#include "bench/server_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "bench/http_client.h"

namespace strata::bench {

namespace {

// Live children, for the signal handler (async-signal-safe: fixed slots, atomics).
constexpr size_t kMaxChildren = 16;
std::array<std::atomic<pid_t>, kMaxChildren> g_children{};
std::atomic<bool> g_interrupted{false};

void register_child(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t empty = 0;
    if (slot.compare_exchange_strong(empty, pid)) return;
  }
}

void unregister_child(pid_t pid) {
  for (auto& slot : g_children) {
    pid_t expected = pid;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}

void on_interrupt(int) {
  g_interrupted.store(true);
  for (auto& slot : g_children) {
    const pid_t pid = slot.load();
    if (pid > 0) ::kill(pid, SIGTERM);
  }
}

}  // namespace

void install_interrupt_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

bool interrupted() {
  return g_interrupted.load();
}

Result<int> pick_free_port() {
  // The kernel picks a random free port; once released it may pick it again, so ports
  // handed out before (to processes that may not have bound them yet: a fleet's workers
  // start together) are not handed out twice.
  static std::mutex mutex;
  static std::set<int> handed_out;  // GUARDED_BY(mutex)
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return make_error(ErrorCode::kIoError, "socket() failed");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof(addr);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      ::close(fd);
      return make_error(ErrorCode::kIoError, "cannot bind a loopback port");
    }
    const int port = ntohs(addr.sin_port);
    ::close(fd);
    std::lock_guard lock(mutex);
    if (handed_out.size() >= 8192) handed_out.clear();
    if (handed_out.insert(port).second) return port;
  }
  return make_error(ErrorCode::kIoError, "no loopback port that was not handed out before");
}

std::string self_executable() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("strata") : p.string();
}

std::string command_output(const std::string& command) {
  std::string out;
  FILE* f = ::popen(command.c_str(), "r");
  if (f == nullptr) return out;
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
  ::pclose(f);
  return out;
}

std::string file_tail(const std::filesystem::path& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return all.size() > max_bytes ? all.substr(all.size() - max_bytes) : all;
}

Result<std::unique_ptr<ServerProcess>> ServerProcess::start(const SpawnOptions& o) {
  auto port = o.port > 0 ? Result<int>(o.port) : pick_free_port();
  if (!port) return std::unexpected(port.error());
  std::unique_ptr<ServerProcess> p(new ServerProcess());
  p->log_path_ = o.log_path;
  p->command_ = o.command;
  p->url_ = "http://127.0.0.1:" + std::to_string(*port);
  p->argv_ = {o.strata_bin, o.command,   "--model", o.model_dir,
              "--host",     "127.0.0.1", "--port",  std::to_string(*port)};
  if (o.kv_events) {
    auto endpoint = [](const std::string& given) -> Result<std::string> {
      if (!given.empty()) return given;
      auto free = pick_free_port();
      if (!free) return make_error(ErrorCode::kIoError, "no free port for KV events");
      return "tcp://127.0.0.1:" + std::to_string(*free);
    };
    auto pub = endpoint(o.kv_events_endpoint);
    if (!pub) return std::unexpected(pub.error());
    auto replay = endpoint(o.kv_events_replay_endpoint);
    if (!replay) return std::unexpected(replay.error());
    p->kv_events_endpoint_ = *pub;
    p->kv_events_replay_endpoint_ = *replay;
    p->argv_.insert(p->argv_.end(), {"--kv-events-endpoint", p->kv_events_endpoint_,
                                     "--kv-events-replay-endpoint", p->kv_events_replay_endpoint_});
  }
  p->argv_.insert(p->argv_.end(), o.extra_args.begin(), o.extra_args.end());

  std::error_code ec;
  std::filesystem::create_directories(o.log_path.parent_path(), ec);
  const int log_fd = ::open(o.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return make_error(ErrorCode::kIoError, "cannot write the server log " + o.log_path.string());
  }
  std::vector<char*> args;
  for (std::string& a : p->argv_) args.push_back(a.data());
  args.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log_fd);
    return make_error(ErrorCode::kIoError, "fork() failed");
  }
  if (pid == 0) {
    // Child: die with the benchmark; output to the log; our own process group so that a
    // terminal's Ctrl-C reaches the benchmark, which stops us in order.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    ::setpgid(0, 0);
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    ::execv(args[0], args.data());
    std::perror("execv");
    ::_exit(127);
  }
  ::close(log_fd);
  p->pid_ = pid;
  register_child(pid);
  if (o.wait_ready) {
    if (auto st = p->wait_ready(o.start_timeout_s); !st) return std::unexpected(st.error());
  }
  return p;
}

Status ServerProcess::wait_ready(double timeout_s) {
  ServerClient client(url_);
  if (auto st = client.wait_healthy(timeout_s, [this] { return alive(); }); !st) {
    (void)stop(5);
    return make_error(st.error().code, "`strata " + command_ + "` did not start (" +
                                           st.error().message + "); log " + log_path_.string() +
                                           ":\n" + file_tail(log_path_, 2000));
  }
  return {};
}

bool ServerProcess::alive() {
  if (pid_ <= 0) return false;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    unregister_child(pid_);
    pid_ = -1;
    return false;
  }
  return true;
}

double ServerProcess::cpu_seconds() const {
  if (pid_ <= 0) return -1;
  std::ifstream in("/proc/" + std::to_string(pid_) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return -1;
  // After "pid (comm) ": fields 3 on; utime and stime are fields 14 and 15 (proc(5)). The
  // command may hold spaces and parentheses: read from the last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int k = 3; k <= 15 && fields >> field; ++k) {
    if (k == 14) utime = std::stoull(field);
    if (k == 15) stime = std::stoull(field);
  }
  if (!fields) return -1;
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

Status ServerProcess::stop(double timeout_s) {
  if (pid_ <= 0) return {};
  ::kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      unregister_child(pid_);
      pid_ = -1;
      return {};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  unregister_child(pid_);
  pid_ = -1;
  return make_error(ErrorCode::kTimeout, "the server ignored SIGTERM for " +
                                             std::to_string(static_cast<int>(timeout_s)) +
                                             " s and was killed");
}

ServerProcess::~ServerProcess() {
  (void)stop();
}

}  // namespace strata::bench
