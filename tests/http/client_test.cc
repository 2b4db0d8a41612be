// The HTTP client against a small Beast server on a loopback port (in this file, on its own
// io_context thread): whole requests, keep-alive reuse and stale connections, timeouts,
// size bounds, server-sent events event by event, cancellation, many streams on one thread.
// Every wait is bounded: a hang fails the test in seconds instead of blocking it.
#include "http/client.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace strata::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kAsTuple = asio::as_tuple(asio::use_awaitable);

// Polls `done` every millisecond for up to `limit`.
bool eventually(const std::function<bool()>& done, std::chrono::milliseconds limit = 3s) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return done();
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string chunk(const std::string& data) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  return size + data + "\r\n";
}

std::string query_value(std::string_view target, std::string_view name, std::string fallback) {
  const std::string key = std::string(name) + "=";
  const size_t q = target.find('?');
  if (q == std::string_view::npos) return fallback;
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    const size_t amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    if (pair.starts_with(key)) return std::string(pair.substr(key.size()));
    if (amp == std::string_view::npos) break;
    rest.remove_prefix(amp + 1);
  }
  return fallback;
}

// The test server. The path picks the behaviour:
//   /echo           200 "<method> <target> <body>", keep-alive
//   /close          200 "bye", then closes the connection (without "Connection: close")
//   /vanish         reads the request, closes without answering
//   /silent         reads the request, never answers (until the client leaves)
//   /status?code=N  status N with a JSON error body
//   /big            Content-Length: 1 MiB
//   /big-chunked    a chunked body that never ends (until the client leaves)
//   /sse?n=N&gap_ms=G&lockstep=1
//                   N events "event-<i>", chunked, G ms apart; with lockstep, event i+1 is
//                   written only once the test reported event i seen (see seen)
//   /sse-forever    one event, then nothing until the client leaves
//   /sse-long-line  a data line that never ends
class TestServer {
 public:
  TestServer() : acceptor_(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    asio::co_spawn(io_, accept_loop(), asio::detached);
    thread_ = std::thread([this] { io_.run(); });
  }
  ~TestServer() {
    io_.stop();
    thread_.join();
  }

  uint16_t port() const { return port_; }
  std::string url(const std::string& target) const {
    return "http://127.0.0.1:" + std::to_string(port_) + target;
  }

  std::atomic<int> accepted{0};         // connections accepted
  std::atomic<int> client_closed{0};    // connections the client closed (EOF or reset seen)
  std::atomic<int> server_closed{0};    // connections the server closed (/close, /vanish)
  std::atomic<int> vanish_requests{0};  // requests to /vanish
  std::atomic<int> seen{0};             // events the test has seen (for lockstep)
  std::atomic<bool> lockstep_failed{false};

 private:
  asio::awaitable<void> accept_loop() {
    while (true) {
      auto [ec, socket] = co_await acceptor_.async_accept(kAsTuple);
      if (ec) co_return;
      accepted.fetch_add(1);
      socket.set_option(tcp::no_delay(true), ec);  // small writes go out at once
      asio::co_spawn(io_, session(std::move(socket)), asio::detached);
    }
  }

  static bool is_close(const boost::system::error_code& ec) {
    return ec == asio::error::eof || ec == bhttp::error::end_of_stream ||
           ec == asio::error::connection_reset;
  }

  // Waits until the client closes the connection (reads and drops whatever comes).
  asio::awaitable<void> until_client_leaves(tcp::socket& socket) {
    char byte[256];
    while (true) {
      auto [ec, n] = co_await socket.async_read_some(asio::buffer(byte), kAsTuple);
      if (ec) {
        if (is_close(ec)) client_closed.fetch_add(1);
        co_return;
      }
    }
  }

  // Arguments by value and named temporaries at every co_await: g++ 12 destroys some
  // temporaries of a co_await full-expression twice (seen with a conditional operator).
  asio::awaitable<bool> write(tcp::socket& socket, std::string bytes) {
    auto [ec, n] = co_await asio::async_write(socket, asio::buffer(bytes), kAsTuple);
    if (ec && is_close(ec)) client_closed.fetch_add(1);
    co_return !ec;
  }

  asio::awaitable<void> sleep(std::chrono::milliseconds d) {
    asio::steady_timer t(io_, d);
    co_await t.async_wait(kAsTuple);
  }

  // Writes a chunk; false when the client is gone.
  asio::awaitable<bool> write_chunk(tcp::socket& socket, std::string data) {
    std::string framed = chunk(data);
    co_return co_await write(socket, std::move(framed));
  }

  asio::awaitable<void> session(tcp::socket socket) {
    beast::flat_buffer buffer;
    while (true) {
      bhttp::request<bhttp::string_body> req;
      auto [ec, n] = co_await bhttp::async_read(socket, buffer, req, kAsTuple);
      if (ec) {
        if (is_close(ec)) client_closed.fetch_add(1);
        co_return;
      }
      const std::string target(req.target());
      const std::string path = target.substr(0, target.find('?'));
      const std::string head_sse =
          "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: "
          "chunked\r\n\r\n";
      if (path == "/echo" || path == "/close") {
        const std::string body =
            path == "/close" ? std::string("bye")
                             : std::string(req.method_string()) + " " + target + " " + req.body();
        const std::string head =
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Test: 1\r\n"
            "Content-Length: " +
            std::to_string(body.size()) + "\r\n\r\n";
        std::string out = head;
        if (req.method() != bhttp::verb::head) out += body;
        if (!co_await write(socket, std::move(out))) co_return;
        if (path == "/close") {
          boost::system::error_code ignored;
          socket.shutdown(tcp::socket::shutdown_both, ignored);
          socket.close(ignored);
          server_closed.fetch_add(1);
          co_return;
        }
      } else if (path == "/vanish") {
        vanish_requests.fetch_add(1);
        boost::system::error_code ignored;
        socket.shutdown(tcp::socket::shutdown_both, ignored);
        socket.close(ignored);
        server_closed.fetch_add(1);
        co_return;
      } else if (path == "/silent") {
        co_await until_client_leaves(socket);
        co_return;
      } else if (path == "/status") {
        const std::string code = query_value(target, "code", "404");
        const std::string body = R"({"error":{"message":"no such thing"}})";
        std::string out = "HTTP/1.1 " + code +
                          " Whatever\r\nContent-Type: application/json\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
        if (!co_await write(socket, std::move(out))) co_return;
      } else if (path == "/big") {
        const std::string body(1 << 20, 'x');
        std::string out =
            "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
        if (!co_await write(socket, std::move(out))) co_return;
      } else if (path == "/big-chunked") {
        std::string head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
        if (!co_await write(socket, std::move(head))) co_return;
        const std::string piece(64 * 1024, 'x');
        for (int i = 0; i < 1024; ++i) {
          if (!co_await write_chunk(socket, piece)) co_return;
        }
        co_return;
      } else if (path == "/sse") {
        const int n = std::stoi(query_value(target, "n", "3"));
        const int gap_ms = std::stoi(query_value(target, "gap_ms", "0"));
        const bool lockstep = query_value(target, "lockstep", "0") == "1";
        if (!co_await write(socket, head_sse)) co_return;
        for (int i = 0; i < n; ++i) {
          if (i > 0 && gap_ms > 0) co_await sleep(std::chrono::milliseconds(gap_ms));
          // Two lines per event, split over two chunks: events are reassembled.
          std::string first_half = ": comment\ndata: event-";
          std::string second_half = std::to_string(i) + "\n\n";
          if (!co_await write_chunk(socket, std::move(first_half))) co_return;
          if (!co_await write_chunk(socket, std::move(second_half))) co_return;
          if (lockstep) {
            const auto deadline = Clock::now() + 3s;
            while (seen.load() < i + 1 && Clock::now() < deadline) co_await sleep(1ms);
            if (seen.load() < i + 1) lockstep_failed.store(true);
          }
        }
        std::string last = "0\r\n\r\n";
        if (!co_await write(socket, std::move(last))) co_return;
      } else if (path == "/sse-forever") {
        std::string out = head_sse + chunk("data: first\n\n");
        if (!co_await write(socket, std::move(out))) co_return;
        co_await until_client_leaves(socket);
        co_return;
      } else if (path == "/sse-long-line") {
        std::string out = head_sse + chunk("data: ");
        if (!co_await write(socket, std::move(out))) co_return;
        const std::string piece(16 * 1024, 'y');
        for (int i = 0; i < 1024; ++i) {
          if (!co_await write_chunk(socket, piece)) co_return;
        }
        co_return;
      } else {
        std::string out = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
        if (!co_await write(socket, std::move(out))) co_return;
      }
    }
  }

  asio::io_context io_{1};
  tcp::acceptor acceptor_;
  const uint16_t port_ = acceptor_.local_endpoint().port();
  std::thread thread_;
};

ClientRequest req(const TestServer& server, const std::string& target,
                  const std::string& method = "GET", std::string body = {}) {
  auto r = make_request(method, server.url(target), std::move(body));
  EXPECT_TRUE(r) << r.error().message;
  return *r;
}

ClientOptions quick_options() {
  ClientOptions o;
  o.connect_timeout_ms = 2'000;
  o.read_timeout_ms = 2'000;
  o.write_timeout_ms = 2'000;
  return o;
}

// ---- URLs and options ----

TEST(UrlTest, ParsesHostPortAndTarget) {
  auto u = parse_url("http://127.0.0.1:8000/v1/models?x=1");
  ASSERT_TRUE(u) << u.error().message;
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, 8000);
  EXPECT_EQ(u->target, "/v1/models?x=1");

  u = parse_url("localhost");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->host, "localhost");
  EXPECT_EQ(u->port, 80);
  EXPECT_EQ(u->target, "/");

  u = parse_url("HTTP://[::1]:9/?q#frag");
  ASSERT_TRUE(u);
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, 9);
  EXPECT_EQ(u->target, "/?q");
}

TEST(UrlTest, RefusesWhatItCannotServe) {
  EXPECT_EQ(parse_url("https://example.com").error().code, ErrorCode::kUnsupported);
  for (const char* bad : {"http://", "http://:80", "http://h:0", "http://h:65536", "http://h:x",
                          "http://u@h/", "http://[::1/", "http://h/a b"}) {
    auto u = parse_url(bad);
    ASSERT_FALSE(u) << bad;
    EXPECT_EQ(u.error().code, ErrorCode::kInvalidArgument) << bad;
  }
}

TEST(ClientOptionsTest, ValidateNamesTheField) {
  EXPECT_TRUE(validate(ClientOptions{}));
  ClientOptions o;
  o.read_timeout_ms = 0;
  auto st = validate(o);
  ASSERT_FALSE(st);
  EXPECT_NE(st.error().message.find("read_timeout_ms"), std::string::npos);
  o = {};
  o.max_header_bytes = 10;
  EXPECT_FALSE(validate(o));
}

// ---- whole requests ----

TEST(ClientTest, PlainRequestsReturnStatusHeadersAndBody) {
  TestServer server;
  BlockingClient client(quick_options());
  auto r = client.request(req(server, "/echo?a=1", "POST", "hello"));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "POST /echo?a=1 hello");
  EXPECT_EQ(r->header("x-test"), "1");
  EXPECT_EQ(r->header("content-type"), "text/plain");

  auto head = client.request(req(server, "/echo", "HEAD"));
  ASSERT_TRUE(head) << head.error().message;
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->body, "");

  auto missing = client.request(req(server, "/status?code=404"));
  ASSERT_TRUE(missing) << missing.error().message;  // any status is a value
  EXPECT_EQ(missing->status, 404);
  EXPECT_NE(missing->body.find("no such thing"), std::string::npos);

  ClientRequest bad = req(server, "/echo");
  bad.headers.emplace_back("X-Evil", "a\r\nInjected: 1");
  auto refused = client.request(bad);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code, ErrorCode::kInvalidArgument);
}

TEST(ClientTest, ConnectionRefusedIsAnIoError) {
  // A port that was just free: bind, note, close.
  uint16_t port = 0;
  {
    asio::io_context io;
    tcp::acceptor a(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    port = a.local_endpoint().port();
  }
  BlockingClient client(quick_options());
  auto r = client.request(*make_request("GET", "127.0.0.1:" + std::to_string(port)));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kIoError);
  EXPECT_NE(r.error().message.find("cannot connect"), std::string::npos) << r.error().message;
}

TEST(ClientTest, SequentialRequestsReuseOneConnection) {
  TestServer server;
  BlockingClient client(quick_options());
  constexpr int kRequests = 10;
  for (int i = 0; i < kRequests; ++i) {
    auto r = client.request(req(server, "/echo", "POST", std::to_string(i)));
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(r->body, "POST /echo " + std::to_string(i));
  }
  EXPECT_EQ(server.accepted.load(), 1);
  const ClientStats s = client.stats();
  EXPECT_EQ(s.connections_opened, 1u);
  EXPECT_EQ(s.connections_reused, static_cast<uint64_t>(kRequests - 1));
  EXPECT_EQ(s.idle_connections, 1);
}

TEST(ClientTest, AServerClosedPooledConnectionIsReplaced) {
  TestServer server;
  BlockingClient client(quick_options());
  // The server answers, then closes: the connection went to the pool (nothing said close).
  auto r = client.request(req(server, "/close"));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->body, "bye");
  ASSERT_TRUE(eventually([&] { return server.server_closed.load() == 1; }));
  // A POST may not be sent twice, so the close must be seen before sending: it is.
  auto post = client.request(req(server, "/echo", "POST", "after"));
  ASSERT_TRUE(post) << post.error().message;
  EXPECT_EQ(post->body, "POST /echo after");
  EXPECT_EQ(server.accepted.load(), 2);
  EXPECT_EQ(client.stats().stale_dropped, 1u);

  // And straight after a close, without waiting: seen before sending, or retried (GET).
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(client.request(req(server, "/close")));
    auto get = client.request(req(server, "/echo"));
    ASSERT_TRUE(get) << get.error().message;
  }
}

TEST(ClientTest, ALostResponseIsRetriedOnlyWhenIdempotent) {
  TestServer server;
  BlockingClient client(quick_options());
  // A pooled connection, then a request the server reads and drops without a byte: the
  // connection looked alive, so this is the race the retry rule is for.
  ASSERT_TRUE(client.request(req(server, "/echo")));
  auto get = client.request(req(server, "/vanish"));
  ASSERT_FALSE(get);  // the fresh connection fails the same way; no third try
  EXPECT_EQ(server.vanish_requests.load(), 2);
  EXPECT_EQ(client.stats().retries, 1u);

  ASSERT_TRUE(client.request(req(server, "/echo")));
  auto post = client.request(req(server, "/vanish", "POST", "x"));
  ASSERT_FALSE(post);
  EXPECT_EQ(post.error().code, ErrorCode::kIoError);
  EXPECT_EQ(server.vanish_requests.load(), 3);  // sent once: it may have been acted on
  EXPECT_EQ(client.stats().retries, 1u);
}

TEST(ClientTest, IdleConnectionsExpire) {
  TestServer server;
  ClientOptions o = quick_options();
  o.idle_timeout_ms = 50;
  BlockingClient client(o);
  ASSERT_TRUE(client.request(req(server, "/echo")));
  EXPECT_EQ(client.stats().idle_connections, 1);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(client.async_client().close_expired(), 1);
  EXPECT_EQ(client.stats().idle_connections, 0);
  ASSERT_TRUE(eventually([&] { return server.client_closed.load() == 1; }));
  ASSERT_TRUE(client.request(req(server, "/echo")));
  EXPECT_EQ(server.accepted.load(), 2);
}

TEST(ClientTest, NoPoolingWhenMaxIdleIsZero) {
  TestServer server;
  ClientOptions o = quick_options();
  o.max_idle_per_host = 0;
  BlockingClient client(o);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(client.request(req(server, "/echo")));
  EXPECT_EQ(server.accepted.load(), 3);
  EXPECT_EQ(client.stats().idle_connections, 0);
}

// ---- timeouts ----

// A listening socket that never accepts, its one-slot backlog filled: a further connect gets
// no answer to its SYN and hangs. Skips the test where the kernel answers anyway.
class BlackHole {
 public:
  BlackHole() {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return;
    if (::listen(listener_, 0) != 0) return;
    socklen_t len = sizeof addr;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    for (int i = 0; i < 16 && !full_; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      fillers_.push_back(fd);
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
      pollfd p{fd, POLLOUT, 0};
      full_ = ::poll(&p, 1, 200) == 0;  // this one hangs: the backlog is full
    }
  }
  ~BlackHole() {
    for (int fd : fillers_) ::close(fd);
    ::close(listener_);
  }
  bool full() const { return full_; }
  uint16_t port() const { return port_; }

 private:
  int listener_ = -1;
  uint16_t port_ = 0;
  bool full_ = false;
  std::vector<int> fillers_;
};

TEST(ClientTest, ConnectTimesOut) {
  BlackHole hole;
  if (!hole.full()) GTEST_SKIP() << "this kernel completes connects past a full backlog";
  ClientOptions o = quick_options();
  o.connect_timeout_ms = 200;
  BlockingClient client(o);
  const auto start = Clock::now();
  auto r = client.request(*make_request("GET", "127.0.0.1:" + std::to_string(hole.port())));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kTimeout) << r.error().message;
  EXPECT_LT(seconds_since(start), 3.0);  // did not hang
}

TEST(ClientTest, ReadTimesOutWhenTheServerNeverAnswers) {
  TestServer server;
  ClientOptions o = quick_options();
  o.read_timeout_ms = 200;
  BlockingClient client(o);
  const auto start = Clock::now();
  auto r = client.request(req(server, "/silent"));
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kTimeout) << r.error().message;
  EXPECT_LT(seconds_since(start), 3.0);
  EXPECT_TRUE(eventually([&] { return server.client_closed.load() == 1; }));

  // A per-request read timeout overrides the client's.
  ClientRequest quick = req(server, "/silent");
  quick.read_timeout_ms = 50;
  auto q = client.request(quick);
  ASSERT_FALSE(q);
  EXPECT_NE(q.error().message.find("50 ms"), std::string::npos) << q.error().message;
}

TEST(ClientTest, StreamReadTimesOutBetweenEvents) {
  TestServer server;
  ClientOptions o = quick_options();
  o.read_timeout_ms = 200;
  BlockingClient client(o);
  int events = 0;
  const auto start = Clock::now();
  auto r = client.stream(req(server, "/sse-forever"), [&](std::string_view) { ++events; });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kTimeout) << r.error().message;
  EXPECT_EQ(events, 1);
  EXPECT_LT(seconds_since(start), 3.0);
}

// ---- bounds ----

TEST(ClientTest, OversizedBodiesAreRefused) {
  TestServer server;
  ClientOptions o = quick_options();
  o.max_body_bytes = 64 * 1024;
  BlockingClient client(o);
  auto big = client.request(req(server, "/big"));  // refused from its Content-Length
  ASSERT_FALSE(big);
  EXPECT_EQ(big.error().code, ErrorCode::kResourceExhausted) << big.error().message;
  auto chunked = client.request(req(server, "/big-chunked"));  // refused as it grows
  ASSERT_FALSE(chunked);
  EXPECT_EQ(chunked.error().code, ErrorCode::kResourceExhausted) << chunked.error().message;
  EXPECT_EQ(client.stats().idle_connections, 0);
  // The client stays usable.
  ASSERT_TRUE(client.request(req(server, "/echo")));
}

TEST(ClientTest, AnEndlessEventIsRefused) {
  TestServer server;
  ClientOptions o = quick_options();
  o.max_event_bytes = 64 * 1024;
  BlockingClient client(o);
  auto r = client.stream(req(server, "/sse-long-line"), [](std::string_view) {});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kResourceExhausted) << r.error().message;
}

// ---- server-sent events ----

TEST(ClientTest, EventsArriveOneByOneAsTheServerWritesThem) {
  TestServer server;
  BlockingClient client(quick_options());
  // Lockstep: the server writes event i+1 only after this callback saw event i, so a client
  // that held events back until the end of the stream would stall it (lockstep_failed).
  std::vector<std::string> events;
  auto r =
      client.stream(req(server, "/sse?n=5&lockstep=1", "POST", "{}"), [&](std::string_view data) {
        events.emplace_back(data);
        server.seen.store(static_cast<int>(events.size()));
      });
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_FALSE(server.lockstep_failed.load());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->num_events, 5);
  EXPECT_EQ(events,
            (std::vector<std::string>{"event-0", "event-1", "event-2", "event-3", "event-4"}));
  // The stream ended cleanly: its connection is reused.
  ASSERT_TRUE(client.request(req(server, "/echo")));
  EXPECT_EQ(server.accepted.load(), 1);
}

TEST(ClientTest, EventStreamPullsEventsAsTheyCome) {
  TestServer server;
  asio::io_context io{1};
  Client client(io.get_executor(), quick_options());
  std::vector<std::string> events;
  bool ended = false;
  std::string failure;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        auto s = co_await client.open_stream(req(server, "/sse?n=3&gap_ms=30&lockstep=1"));
        if (!s) {
          failure = s.error().message;
          co_return;
        }
        while (true) {
          auto e = co_await s->next();
          if (!e) {
            failure = e.error().message;
            co_return;
          }
          if (!*e) break;
          events.push_back(**e);
          server.seen.store(static_cast<int>(events.size()));
        }
        ended = true;
      },
      asio::detached);
  io.run_for(5s);
  EXPECT_EQ(failure, "");
  EXPECT_TRUE(ended);
  EXPECT_FALSE(server.lockstep_failed.load());
  EXPECT_EQ(events, (std::vector<std::string>{"event-0", "event-1", "event-2"}));
}

TEST(ClientTest, ANon2xxStreamAnswerKeepsItsBody) {
  TestServer server;
  BlockingClient client(quick_options());
  int events = 0;
  auto r = client.stream(req(server, "/status?code=429"), [&](std::string_view) { ++events; });
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->status, 429);
  EXPECT_EQ(events, 0);
  EXPECT_NE(r->body.find("no such thing"), std::string::npos);
}

// ---- cancellation ----

TEST(ClientTest, ACancelHandleEndsAStreamFromAnotherThread) {
  TestServer server;
  BlockingClient client(quick_options());
  CancelHandle cancel;
  std::atomic<int> events{0};
  std::thread canceller([&] {
    eventually([&] { return events.load() > 0; });
    cancel.cancel();
  });
  const auto start = Clock::now();
  auto r = client.stream(
      req(server, "/sse-forever"), [&](std::string_view) { events.fetch_add(1); }, cancel);
  canceller.join();
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().message.rfind("cancelled", 0), 0u) << r.error().message;
  EXPECT_EQ(events.load(), 1);
  EXPECT_LT(seconds_since(start), 3.0);  // well before the 2 s read timeout fired twice
  EXPECT_TRUE(eventually([&] { return server.client_closed.load() == 1; }));
  EXPECT_EQ(client.stats().idle_connections, 0);  // not pooled

  // An already-cancelled handle fails at once, without connecting.
  auto again = client.request(req(server, "/echo"), cancel);
  ASSERT_FALSE(again);
  EXPECT_EQ(server.accepted.load(), 1);
}

TEST(ClientTest, AsioCancellationEndsAStream) {
  using namespace asio::experimental::awaitable_operators;
  TestServer server;
  asio::io_context io{1};
  Client client(io.get_executor(), quick_options());
  int events = 0;
  int winner = -1;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        asio::steady_timer timer(io, 200ms);
        auto r = co_await (client.stream(req(server, "/sse-forever"), [&](std::string_view) {
          ++events;
        }) || timer.async_wait(asio::use_awaitable));
        winner = static_cast<int>(r.index());
      },
      asio::detached);
  const auto start = Clock::now();
  io.run_for(5s);
  EXPECT_EQ(winner, 1);  // the timer
  EXPECT_EQ(events, 1);
  EXPECT_LT(seconds_since(start), 3.0);
  EXPECT_TRUE(eventually([&] { return server.client_closed.load() == 1; }));
  EXPECT_EQ(client.stats().idle_connections, 0);
}

TEST(ClientTest, ClosingAnEventStreamClosesTheConnection) {
  TestServer server;
  asio::io_context io{1};
  Client client(io.get_executor(), quick_options());
  std::string first;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        auto s = co_await client.open_stream(req(server, "/sse-forever"));
        if (!s) co_return;
        auto e = co_await s->next();
        if (e && *e) first = **e;
        s->close();
        auto after = co_await s->next();
        if (after) first += " (next() after close() succeeded)";
      },
      asio::detached);
  io.run_for(5s);
  EXPECT_EQ(first, "first");
  EXPECT_TRUE(eventually([&] { return server.client_closed.load() == 1; }));
}

// ---- scale and threads ----

TEST(ClientTest, ManyConcurrentStreamsOnOneThread) {
  TestServer server;
  asio::io_context io{1};
  Client client(io.get_executor(), quick_options());
  constexpr int kStreams = 200;
  constexpr int kEvents = 5;
  int done = 0;
  int failures = 0;
  std::string first_error;
  for (int i = 0; i < kStreams; ++i) {
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          int events = 0;
          auto r = co_await client.stream(
              req(server, "/sse?n=" + std::to_string(kEvents) + "&gap_ms=10", "POST", "{}"),
              [&](std::string_view) { ++events; });
          if (!r || events != kEvents) {
            ++failures;
            if (first_error.empty()) first_error = r ? "wrong event count" : r.error().message;
          }
          ++done;
        },
        asio::detached);
  }
  io.run_for(10s);  // one thread runs all the client's streams
  EXPECT_EQ(done, kStreams);
  EXPECT_EQ(failures, 0) << first_error;
  EXPECT_LE(server.accepted.load(), kStreams);
  EXPECT_EQ(client.stats().idle_connections, 32);  // max_idle_per_host kept for reuse
}

TEST(ClientTest, BlockingClientServesManyThreads) {
  TestServer server;
  BlockingClient client(quick_options());
  constexpr int kThreads = 8;
  constexpr int kRequests = 20;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRequests; ++i) {
        const std::string body = std::to_string(t) + "/" + std::to_string(i);
        if (i % 2 == 0) {
          auto r = client.request(req(server, "/echo", "POST", body));
          if (r && r->body == "POST /echo " + body) ok.fetch_add(1);
        } else {
          auto r = client.stream(req(server, "/sse?n=2"), [](std::string_view) {});
          if (r && r->num_events == 2) ok.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kThreads * kRequests);
  EXPECT_LE(server.accepted.load(), kThreads);
}

}  // namespace
}  // namespace strata::http
