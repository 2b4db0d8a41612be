// The HTTP server against raw loopback sockets: framing errors answered and closed,
// pipelining in order, timeouts by phase, the connection cap, a client that goes away
// while its handler waits, a slow stream reader cut at its bound, and shutdown that lets
// running requests finish and abandons the rest. Every wait is bounded.
#include "http/server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace strata::http {
namespace {

using namespace std::chrono_literals;
using boost::asio::awaitable;
using Clock = std::chrono::steady_clock;

// A blocking client socket with a receive timeout.
class RawClient {
 public:
  explicit RawClient(int port, double timeout_s = 5) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{
        .tv_sec = static_cast<time_t>(timeout_s),
        .tv_usec = static_cast<suseconds_t>((timeout_s - static_cast<int>(timeout_s)) * 1e6)};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~RawClient() { close(); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connected() const { return connected_; }
  bool send(std::string_view bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // Everything until the peer closes or the receive timeout passes.
  std::string read_all() {
    std::string out;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }
  // Reads until `needle` appears (or close/timeout).
  std::string read_until(std::string_view needle) {
    std::string out;
    char buf[4096];
    while (out.find(needle) == std::string::npos) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }
  // True when the peer closed the connection (EOF or reset) within the receive timeout.
  bool closed_by_peer() {
    char buf[4096];
    for (;;) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;
    }
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

int status_of(const std::string& response) {
  if (response.size() < 12 || response.compare(0, 5, "HTTP/") != 0) return 0;
  return std::stoi(response.substr(9, 3));
}

int count(const std::string& s, std::string_view what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

class ServerTest : public ::testing::Test {
 protected:
  void start(ServerOptions o = {}) {
    o.port = 0;
    o.io_threads = 2;
    o.worker_threads = 2;
    server_ = std::make_unique<Server>(o);
    server_->route("GET", "/hello", [](Exchange& ex) -> awaitable<void> {
      Response r{.body = R"({"hello":"world"})"};
      co_await ex.respond(std::move(r));
    });
    server_->route("POST", "/echo", [](Exchange& ex) -> awaitable<void> {
      Response r{.content_type = "text/plain", .body = ex.request().body};
      co_await ex.respond(std::move(r));
    });
    // One last segment of any name: the handler reads it from the path.
    server_->route("GET", "/items/*", [](Exchange& ex) -> awaitable<void> {
      Response r{.content_type = "text/plain", .body = "item " + ex.request().path};
      co_await ex.respond(std::move(r));
    });
    server_->route("GET", "/items/exact", [](Exchange& ex) -> awaitable<void> {
      Response r{.content_type = "text/plain", .body = "exact"};
      co_await ex.respond(std::move(r));
    });
    server_->route("GET", "/query", [](Exchange& ex) -> awaitable<void> {
      Response r{.content_type = "text/plain", .body = ex.request().query_param("q")};
      co_await ex.respond(std::move(r));
    });
    // Waits until woken by another thread after `delay_ms`, or until abandoned.
    server_->route("GET", "/wait", [this](Exchange& ex) -> awaitable<void> {
      waiting_.fetch_add(1);
      const int delay_ms = std::stoi("0" + ex.request().query_param("ms"));
      std::thread([w = ex.waker(), delay_ms] {
        std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
        w();
      }).detach();
      const bool ok = co_await ex.wait(60s);
      if (!ok) {
        abandoned_.fetch_add(1);
        co_return;
      }
      Response r{.body = R"({"woken":true})"};
      co_await ex.respond(std::move(r));
    });
    // Streams `n` chunks of `size` bytes as fast as it can, then ends.
    server_->route("GET", "/stream", [this](Exchange& ex) -> awaitable<void> {
      const int n = std::stoi("0" + ex.request().query_param("n"));
      const int size = std::stoi("0" + ex.request().query_param("size"));
      if (!co_await ex.begin_stream(200, "text/event-stream")) co_return;
      for (int i = 0; i < n; ++i) {
        if (!ex.send(std::string(static_cast<size_t>(size), 'x') + "\n")) {
          stream_cut_.fetch_add(1);
          co_return;
        }
        if (i % 16 == 0) co_await ex.sleep(1ms);
      }
      co_await ex.end_stream();
    });
    server_->route("GET", "/offload", [](Exchange& ex) -> awaitable<void> {
      const auto here = std::this_thread::get_id();
      const bool elsewhere =
          co_await ex.offload([here] { return std::this_thread::get_id() != here; });
      Response r{.body = elsewhere ? "true" : "false"};
      co_await ex.respond(std::move(r));
    });
    server_->route("GET", "/throws", [](Exchange&) -> awaitable<void> {
      throw std::runtime_error("boom");
      co_return;
    });
    server_->on_response([this](const Request& req, std::string_view route, int status) {
      std::lock_guard lock(answered_mutex_);
      answered_.push_back(req.path + " " + std::string(route) + " " + std::to_string(status));
    });
    ASSERT_TRUE(server_->bind().has_value());
    server_->start();
    port_ = server_->port();
  }
  std::vector<std::string> answered() {
    std::lock_guard lock(answered_mutex_);
    return answered_;
  }
  void TearDown() override {
    if (server_) server_->shutdown(1);
  }
  std::string get(std::string_view target) {
    RawClient c(port_);
    c.send("GET " + std::string(target) + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    return c.read_all();
  }
  template <typename F>
  static bool eventually(F f, std::chrono::milliseconds within = 5000ms) {
    const auto deadline = Clock::now() + within;
    while (Clock::now() < deadline) {
      if (f()) return true;
      std::this_thread::sleep_for(5ms);
    }
    return f();
  }

  std::unique_ptr<Server> server_;
  int port_ = 0;
  std::atomic<int> waiting_{0};
  std::atomic<int> abandoned_{0};
  std::atomic<int> stream_cut_{0};
  std::mutex answered_mutex_;
  std::vector<std::string> answered_;  // "path route status" from the response hook
};

TEST_F(ServerTest, RoutesAnswerAndUnknownOnesAreJson404And405) {
  start();
  const std::string ok = get("/hello");
  EXPECT_EQ(status_of(ok), 200);
  EXPECT_NE(ok.find(R"({"hello":"world"})"), std::string::npos);
  const std::string missing = get("/nothing");
  EXPECT_EQ(status_of(missing), 404);
  EXPECT_NE(missing.find(R"("code":"not_found")"), std::string::npos);
  RawClient c(port_);
  c.send("POST /hello HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  const std::string wrong = c.read_all();
  EXPECT_EQ(status_of(wrong), 405);
  EXPECT_NE(wrong.find("Allow: GET"), std::string::npos);
  EXPECT_EQ(get("/query?q=a%20b+c").substr(get("/query?q=a%20b+c").size() - 5), "a b c");
}

TEST_F(ServerTest, AWildcardRouteTakesOneLastSegmentAndAnExactRouteWins) {
  start();
  const std::string item = get("/items/abc");
  EXPECT_EQ(status_of(item), 200);
  EXPECT_NE(item.find("item /items/abc"), std::string::npos);
  EXPECT_NE(get("/items/exact").find("\r\n\r\nexact"), std::string::npos);
  EXPECT_EQ(status_of(get("/items/")), 404) << "an empty segment is no segment";
  EXPECT_EQ(status_of(get("/items/a/b")), 404) << "one segment only";
  RawClient c(port_);
  c.send("POST /items/abc HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(status_of(c.read_all()), 405);
}

TEST_F(ServerTest, TheResponseHookNamesTheRouteAsRegisteredAndNoneForA404) {
  start();
  EXPECT_EQ(status_of(get("/hello")), 200);
  EXPECT_EQ(status_of(get("/items/abc")), 200);
  EXPECT_EQ(status_of(get("/made-up-path-1")), 404);
  RawClient c(port_);
  c.send("POST /items/xyz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(status_of(c.read_all()), 405);
  // The hook runs after the answer is written: wait for all four.
  ASSERT_TRUE(eventually([&] { return answered().size() == 4; }));
  EXPECT_EQ(answered(),
            (std::vector<std::string>{"/hello /hello 200", "/items/abc /items/* 200",
                                      "/made-up-path-1  404", "/items/xyz /items/* 405"}));
}

TEST_F(ServerTest, FramingErrorsAreAnsweredAndTheConnectionClosed) {
  ServerOptions o;
  o.max_body_bytes = 1000;
  o.max_header_bytes = 2048;
  start(o);
  struct Case {
    std::string request;
    int status;
  };
  const std::vector<Case> cases = {
      {"GARBAGE\r\n\r\n", 400},
      {"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\nabc", 400},
      {"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\nabc", 413},
      {"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n", 413},
      {"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nnot chunked\r\n\r\n",
       400},
      {"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nabc", 501},
      {"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501},
      {"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
       400},
      {"GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(4096, 'a') + "\r\n\r\n", 431},
  };
  for (const Case& k : cases) {
    RawClient c(port_, 3);
    ASSERT_TRUE(c.connected());
    c.send(k.request);
    const auto t0 = Clock::now();
    const std::string answer = c.read_all();  // until the server closes
    EXPECT_EQ(status_of(answer), k.status) << k.request.substr(0, 60);
    EXPECT_NE(answer.find(R"({"error":{)"), std::string::npos) << answer;
    EXPECT_NE(answer.find("Connection: close"), std::string::npos) << answer;
    EXPECT_LT(Clock::now() - t0, 2500ms) << "closed only by the client's timeout";
  }
  EXPECT_EQ(status_of(get("/hello")), 200);
  EXPECT_GE(server_->stats().bad_requests, cases.size());
}

TEST_F(ServerTest, AHeadAnswerHasNoBodySoTheConnectionStaysInStep) {
  start();
  RawClient c(port_);
  c.send(
      "HEAD /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/1.1\r\nHost: x\r\nConnection: "
      "close\r\n\r\n");
  const std::string all = c.read_all();
  EXPECT_EQ(count(all, "HTTP/1.1 200"), 2) << all;          // HEAD runs the GET route
  EXPECT_EQ(count(all, R"({"hello":"world"})"), 1) << all;  // only the GET's body
}

TEST_F(ServerTest, ChunkedBodiesAndExpectContinueWork) {
  start();
  RawClient c(port_);
  c.send(
      "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
      "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
  const std::string answer = c.read_all();
  EXPECT_EQ(status_of(answer), 200);
  EXPECT_EQ(answer.substr(answer.size() - 11), "hello world");

  RawClient d(port_);
  d.send(
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n"
      "Connection: close\r\n\r\n");
  EXPECT_EQ(status_of(d.read_until("\r\n\r\n")), 100);
  d.send("ping");
  const std::string rest = d.read_all();
  EXPECT_NE(rest.find("200 OK"), std::string::npos);
  EXPECT_EQ(rest.substr(rest.size() - 4), "ping");
}

TEST_F(ServerTest, PipelinedRequestsAreAnsweredInOrder) {
  start();
  RawClient c(port_);
  c.send(
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nfirst"
      "GET /wait?ms=100 HTTP/1.1\r\nHost: x\r\n\r\n"
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nthird");
  const std::string all = c.read_all();
  EXPECT_EQ(count(all, "HTTP/1.1 200"), 3) << all;
  const size_t a = all.find("first"), b = all.find("woken"), d = all.find("third");
  ASSERT_NE(a, std::string::npos);
  ASSERT_NE(b, std::string::npos);
  ASSERT_NE(d, std::string::npos);
  EXPECT_LT(a, b);
  EXPECT_LT(b, d);
}

TEST_F(ServerTest, SlowHeadersAndIdleConnectionsAreClosedByTheirTimeouts) {
  ServerOptions o;
  o.header_timeout_s = 0.3;
  o.idle_timeout_s = 0.3;
  start(o);
  std::vector<std::unique_ptr<RawClient>> slow, idle;
  for (int i = 0; i < 50; ++i) {
    slow.push_back(std::make_unique<RawClient>(port_, 5));
    slow.back()->send("GET /hello HTTP/1.1\r\nHost: x\r\n");
    idle.push_back(std::make_unique<RawClient>(port_, 5));
    idle.back()->send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
    idle.back()->read_until(R"("world"})");
  }
  // The server answers others meanwhile.
  EXPECT_EQ(status_of(get("/hello")), 200);
  for (auto& c : slow) EXPECT_TRUE(c->closed_by_peer());
  for (auto& c : idle) EXPECT_TRUE(c->closed_by_peer());
  // (The counters move just after the close the clients saw.)
  EXPECT_TRUE(eventually([&] { return server_->stats().header_timeouts >= 50; }));
  EXPECT_TRUE(eventually([&] { return server_->stats().idle_timeouts >= 50; }));
}

TEST_F(ServerTest, ABodyThatStallsIsClosedByTheBodyTimeout) {
  ServerOptions o;
  o.body_timeout_s = 0.3;
  start(o);
  RawClient c(port_);
  c.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly a part");
  EXPECT_TRUE(c.closed_by_peer());
  EXPECT_TRUE(eventually([&] { return server_->stats().body_timeouts >= 1; }));
}

TEST_F(ServerTest, ConnectionsOverTheCapAreRefusedAtOnce) {
  ServerOptions o;
  o.max_connections = 8;
  start(o);
  std::vector<std::unique_ptr<RawClient>> held;
  for (int i = 0; i < 8; ++i) {
    held.push_back(std::make_unique<RawClient>(port_));
    held.back()->send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
    held.back()->read_until(R"("world"})");
  }
  RawClient extra(port_, 3);
  const std::string refused = extra.read_all();
  EXPECT_TRUE(refused.empty() || status_of(refused) == 503) << refused;
  EXPECT_TRUE(eventually([&] { return server_->stats().connections_refused >= 1; }));
  // The held ones still work; closing one makes room.
  held[0]->send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(held[0]->read_until(R"("world"})").find("200 OK"), std::string::npos);
  held.pop_back();
  EXPECT_TRUE(eventually([&] { return server_->stats().open_connections <= 7; }));
  EXPECT_EQ(status_of(get("/hello")), 200);
}

TEST_F(ServerTest, AClientThatLeavesAbandonsItsRequest) {
  start();
  {
    RawClient c(port_);
    c.send("GET /wait?ms=30000 HTTP/1.1\r\nHost: x\r\n\r\n");
    ASSERT_TRUE(eventually([&] { return waiting_.load() == 1; }));
  }  // closed while its handler waits
  EXPECT_TRUE(eventually([&] { return abandoned_.load() == 1; }, 2000ms));
  EXPECT_EQ(server_->stats().client_disconnects, 1U);
}

TEST_F(ServerTest, ASlowStreamReaderIsCutAtTheBound) {
  ServerOptions o;
  o.max_stream_buffer_bytes = 64 << 10;
  start(o);
  RawClient c(port_, 5);
  // 64 MiB of stream to a client that reads nothing: the socket buffers fill, the queue
  // reaches its bound and the stream is cut instead of growing.
  c.send("GET /stream?n=65536&size=1024 HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(eventually([&] { return stream_cut_.load() == 1; }, 10000ms));
  EXPECT_EQ(server_->stats().slow_streams_cancelled, 1U);
}

TEST_F(ServerTest, StreamsArriveWhole) {
  start();
  RawClient c(port_);
  c.send("GET /stream?n=100&size=10 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string all = c.read_all();
  EXPECT_NE(all.find("Transfer-Encoding: chunked"), std::string::npos);
  EXPECT_EQ(count(all, "xxxxxxxxxx\n"), 100);
  EXPECT_NE(all.find("\r\n0\r\n\r\n"), std::string::npos);  // the last chunk
}

TEST_F(ServerTest, OffloadRunsElsewhereAndFaultsAre500) {
  start();
  const std::string off = get("/offload");
  EXPECT_EQ(off.substr(off.size() - 4), "true");
  const std::string fault = get("/throws");
  EXPECT_EQ(status_of(fault), 500);
  EXPECT_NE(fault.find("boom"), std::string::npos);
  EXPECT_EQ(server_->stats().handler_faults, 1U);
}

TEST_F(ServerTest, ShutdownLetsRunningRequestsFinishThenAbandonsTheRest) {
  start();
  RawClient quick(port_), slow(port_);
  quick.send("GET /wait?ms=200 HTTP/1.1\r\nHost: x\r\n\r\n");
  slow.send("GET /wait?ms=60000 HTTP/1.1\r\nHost: x\r\n\r\n");
  RawClient idle(port_);
  idle.send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n");
  idle.read_until(R"("world"})");
  ASSERT_TRUE(eventually([&] { return waiting_.load() == 2; }));
  const auto t0 = Clock::now();
  server_->shutdown(1.0);
  const auto took = Clock::now() - t0;
  EXPECT_GE(took, 900ms);
  EXPECT_LT(took, 8000ms);
  EXPECT_NE(quick.read_all().find("woken"), std::string::npos);
  EXPECT_EQ(abandoned_.load(), 1);
  EXPECT_TRUE(idle.closed_by_peer());
  RawClient late(port_, 1);
  EXPECT_FALSE(late.connected() && late.send("GET /hello HTTP/1.1\r\n\r\n") &&
               !late.read_all().empty());
  server_.reset();
}

TEST(ServerOptionsTest, BadOptionsAreRefused) {
  ServerOptions o;
  o.header_timeout_s = 0;
  EXPECT_FALSE(validate(o).has_value());
  o = {};
  o.max_header_bytes = 10;
  EXPECT_FALSE(validate(o).has_value());
  o = {};
  o.max_connections = 0;
  EXPECT_FALSE(validate(o).has_value());
  EXPECT_TRUE(validate(ServerOptions{}).has_value());
  ServerOptions taken;
  taken.port = 0;
  Server a(taken);
  ASSERT_TRUE(a.bind().has_value());
  taken.port = a.port();
  Server b(taken);
  EXPECT_FALSE(b.bind().has_value());
}

}  // namespace
}  // namespace strata::http
