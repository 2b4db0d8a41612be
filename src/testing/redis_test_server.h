// A private redis-server for tests and benchmarks: started on a free loopback port with
// no persistence, waited for until it answers PING, killed by pid. The child dies with
// its parent (PR_SET_PDEATHSIG), so a crashed test leaves no server behind.
// Not thread-safe; one owner.
#pragma once

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace strata::test_support {

inline constexpr const char* kRedisServerPath = "/usr/bin/redis-server";

// A TCP port on 127.0.0.1 that was free a moment ago (0 on failure).
inline int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// Sends one command over a fresh connection; the reply's text (status, string, error or
// integer), or "" when the server does not answer.
inline std::string redis_command(int port, const std::vector<std::string>& args) {
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, timeval{1, 0});
  if (c == nullptr || c->err != 0) {
    if (c != nullptr) redisFree(c);
    return "";
  }
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* r = static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
  std::string text;
  if (r != nullptr) {
    if (r->type == REDIS_REPLY_INTEGER) {
      text = std::to_string(r->integer);
    } else if (r->str != nullptr) {
      text.assign(r->str, r->len);
    } else if (r->type == REDIS_REPLY_NIL) {
      text = "(nil)";
    }
    freeReplyObject(r);
  }
  redisFree(c);
  return text;
}

class RedisTestServer {
 public:
  RedisTestServer() = default;
  ~RedisTestServer() { kill(); }
  RedisTestServer(const RedisTestServer&) = delete;
  RedisTestServer& operator=(const RedisTestServer&) = delete;

  // Starts the server on `port` (0: a free one) with `extra_args` appended. Returns an
  // empty string, or what went wrong (a missing redis-server is an error, never a skip).
  std::string start(int port = 0, const std::vector<std::string>& extra_args = {}) {
    if (::access(kRedisServerPath, X_OK) != 0) {
      return std::string(kRedisServerPath) + " is missing; run scripts/install-deps.sh";
    }
    port_ = port != 0 ? port : free_loopback_port();
    if (port_ == 0) return "no free port";
    std::vector<std::string> args = {
        kRedisServerPath, "--port", std::to_string(port_), "--bind", "127.0.0.1",
        "--save",         "",       "--appendonly",        "no"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) return std::string("fork: ") + std::strerror(errno);
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      const int null_fd = ::open("/dev/null", O_RDWR);
      ::dup2(null_fd, STDOUT_FILENO);
      ::dup2(null_fd, STDERR_FILENO);
      ::execv(kRedisServerPath, argv.data());
      ::_exit(127);
    }
    // Waiting for start-up is bounded so that a broken server fails the test rather
    // than hanging it; nothing asserts on how long it took.
    for (int attempt = 0; attempt < 500; ++attempt) {
      // With --requirepass an unauthenticated PING is refused, which also shows it is up.
      const std::string pong = redis_command(port_, {"PING"});
      if (pong == "PONG" || pong.starts_with("NOAUTH")) return "";
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return "redis-server exited during start-up (port " + std::to_string(port_) + ")";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill();
    return "redis-server did not answer PING";
  }

  // Kills the server (SIGKILL: it vanishes as a crashed server would) and reaps it.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  // Freezes (SIGSTOP) and thaws (SIGCONT) the server: a hung server, not a dead one.
  void pause() {
    if (pid_ > 0) ::kill(pid_, SIGSTOP);
  }
  void resume() {
    if (pid_ > 0) ::kill(pid_, SIGCONT);
  }

  int port() const { return port_; }
  bool running() const { return pid_ > 0; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace strata::test_support
