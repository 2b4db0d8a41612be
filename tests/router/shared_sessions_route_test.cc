// Router replicas sharing session bindings through Redis (--session-store,
// router/shared_sessions.h): two routers in front of the same three OpenAI-compatible fake
// workers and one private redis-server. A session's turns stick to one worker whichever
// replica receives them, its tool calls reach that worker through either replica, and a
// dead store leaves each replica routing on its own bindings. Every wait is bounded;
// nothing asserts a time. Handlers build their Response in a named variable before
// co_await (g++ 12 may destroy a temporary inside a co_await expression twice).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "http/server.h"
#include "router/router.h"
#include "router_test_util.h"
#include "testing/redis_test_server.h"

namespace strata::router {
namespace {

using boost::asio::awaitable;
using nlohmann::json;
using test_support::redis_command;
using test_support::RedisTestServer;

// An OpenAI-compatible worker that also answers POST /session/tool_start (as a Strata
// worker would) with the session id it got.
class ReplicaFakeWorker {
 public:
  ReplicaFakeWorker() {
    server_ = fake_http_server();
    server_->route("GET", "/v1/models", [](http::Exchange& ex) -> awaitable<void> {
      http::Response out{.body = R"({"object":"list","data":[{"id":"m","object":"model"}]})"};
      co_await ex.respond(std::move(out));
    });
    server_->route("POST", "/v1/completions", [this](http::Exchange& ex) -> awaitable<void> {
      if (refuse_next.load() > 0) {
        --refuse_next;
        http::Response busy{.status = 429,
                            .body = R"({"error":{"message":"busy"}})",
                            .headers = {{"Retry-After", "1"}}};
        co_await ex.respond(std::move(busy));
        co_return;
      }
      ++completions;
      http::Response out{.body = R"({"choices":[{"text":"x"}],"usage":{"prompt_tokens":1,)"
                                 R"("completion_tokens":1}})"};
      co_await ex.respond(std::move(out));
    });
    server_->route("POST", "/session/tool_start", [this](http::Exchange& ex) -> awaitable<void> {
      ++tool_calls;
      const json body = json::parse(ex.request().body, nullptr, false);
      http::Response out{.body = json{{"session_id", body.value("session_id", "")}}.dump()};
      co_await ex.respond(std::move(out));
    });
    EXPECT_TRUE(server_->bind().has_value());
    server_->start();
  }
  ~ReplicaFakeWorker() { server_->shutdown(1); }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }

  std::atomic<int> completions{0}, tool_calls{0};
  std::atomic<int> refuse_next{0};  // completions answered 429 before the next 200

 private:
  std::unique_ptr<http::Server> server_;
};

class SharedSessionsRouteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokenizer_ = tiny_tokenizer();
    ASSERT_NE(tokenizer_, nullptr);
    ASSERT_EQ(redis_.start(), "");
    for (int i = 0; i < 3; ++i) workers_.push_back(std::make_unique<ReplicaFakeWorker>());
  }
  void TearDown() override {
    for (auto& r : routers_) r->shutdown(1);
  }

  // A replica in front of every worker, sharing bindings through the test's Redis.
  int start_replica() {
    RouterOptions o;
    o.http.port = 0;
    o.http.io_threads = 1;
    o.http.worker_threads = 2;
    o.io_threads = 1;
    o.load_poll_ms = 10;
    o.admin_api_key = "k";
    o.shared_sessions = {.url = "redis://127.0.0.1:" + std::to_string(redis_.port()),
                         .name_space = "test-cluster",
                         .timeout_ms = 500};
    // OpenAI-compatible workers (--worker means a Strata worker): added through POST /workers.
    auto r = Router::create(o, *tokenizer_, nullptr, "m");
    EXPECT_TRUE(r.has_value()) << r.error().message;
    if (!r) return 0;
    EXPECT_TRUE((*r)->bind().has_value());
    (*r)->start();
    const int port = (*r)->port();
    routers_.push_back(std::move(*r));
    for (const auto& w : workers_) {
      const HttpAnswer a =
          http_call(port, "POST", "/workers", json{{"url", w->url()}, {"kind", "openai"}}.dump(),
                    "Authorization: Bearer k\r\nContent-Type: application/json\r\n");
      EXPECT_EQ(a.status, 201) << a.body;
    }
    EXPECT_TRUE(eventually([&] {
      const json j = json::parse(http_call(port, "GET", "/workers").body, nullptr, false);
      if (!j.is_object()) return false;
      size_t up = 0;
      for (const json& w : j["workers"]) {
        up += w.value("joined", false) && w.value("reachable", false) ? 1 : 0;
      }
      return up == workers_.size();
    }));
    return port;
  }

  static HttpAnswer turn(int port, const std::string& session, int first_token) {
    nlohmann::json ids = nlohmann::json::array();
    for (int i = 0; i < 40; ++i) ids.push_back(first_token + i);
    const json body{{"prompt", ids}, {"max_tokens", 1}, {"session_id", session}};
    return http_call(port, "POST", "/v1/completions", body.dump(),
                     "Content-Type: application/json\r\n");
  }

  static double metric(int port, const std::string& what) {
    const std::string text = http_call(port, "GET", "/metrics").body;
    const std::string key = "strata_router_session_store_total{what=\"" + what + "\"} ";
    const size_t at = text.find(key);
    return at == std::string::npos ? -1 : std::stod(text.substr(at + key.size()));
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  RedisTestServer redis_;
  std::vector<std::unique_ptr<ReplicaFakeWorker>> workers_;
  std::vector<std::unique_ptr<Router>> routers_;
};

TEST_F(SharedSessionsRouteTest, ASessionsTurnsStickToOneWorkerThroughEitherReplica) {
  const int a = start_replica();
  const int b = start_replica();
  ASSERT_TRUE(a && b);
  // Sessions opened on replica a, continued on b (and back): each keeps its worker.
  for (int s = 0; s < 6; ++s) {
    const std::string session = "conv-" + std::to_string(s);
    const HttpAnswer first = turn(a, session, 1000 * s);
    ASSERT_EQ(first.status, 200) << first.body;
    const std::string worker = first.header("x-strata-worker");
    ASSERT_FALSE(worker.empty());
    EXPECT_EQ(
        redis_command(redis_.port(), {"GET", "strata:router:test-cluster:session:" + session}),
        worker);
    for (int t = 1; t <= 4; ++t) {
      const HttpAnswer next = turn(t % 2 == 1 ? b : a, session, 1000 * s + 100 * t);
      ASSERT_EQ(next.status, 200) << next.body;
      EXPECT_EQ(next.header("x-strata-worker"), worker) << session << " turn " << t;
      EXPECT_EQ(next.header("x-strata-route"), "sticky") << session << " turn " << t;
    }
  }
  EXPECT_GE(metric(b, "found"), 12);
  EXPECT_EQ(metric(b, "errors"), 0);
  EXPECT_EQ(metric(a, "races_lost"), 0);
}

TEST_F(SharedSessionsRouteTest, AToolCallThroughTheOtherReplicaReachesTheSessionsWorker) {
  const int a = start_replica();
  const int b = start_replica();
  ASSERT_TRUE(a && b);
  const HttpAnswer first = turn(a, "agent-1", 0);
  ASSERT_EQ(first.status, 200) << first.body;
  const HttpAnswer tool =
      http_call(b, "POST", "/session/tool_start", R"({"session_id":"agent-1"})",
                "Authorization: Bearer k\r\nContent-Type: application/json\r\n");
  EXPECT_EQ(tool.status, 200) << tool.body;
  EXPECT_EQ(tool.header("x-strata-worker"), first.header("x-strata-worker"));
  // A session no replica bound is still refused, naming it.
  const HttpAnswer unknown =
      http_call(b, "POST", "/session/tool_start", R"({"session_id":"nobody"})",
                "Authorization: Bearer k\r\nContent-Type: application/json\r\n");
  EXPECT_EQ(unknown.status, 404) << unknown.body;
}

// One 429 from the session's worker moves only that request (session_table.h, Migration):
// the next turn goes back to the worker, and the shared binding is not overwritten. A
// second refusal within the window migrates the session, in the store too.
TEST_F(SharedSessionsRouteTest, OneRefusalMovesTheRequestAndTwoMoveTheSession) {
  const int a = start_replica();
  const int b = start_replica();
  ASSERT_TRUE(a && b);
  const std::string key = "strata:router:test-cluster:session:agent-9";
  const HttpAnswer first = turn(a, "agent-9", 0);
  ASSERT_EQ(first.status, 200) << first.body;
  const std::string home = first.header("x-strata-worker");
  ReplicaFakeWorker* home_worker = nullptr;
  for (auto& w : workers_) {
    if (w->url() == home) home_worker = w.get();
  }
  ASSERT_NE(home_worker, nullptr) << home;

  home_worker->refuse_next = 1;
  const HttpAnswer detour = turn(a, "agent-9", 100);
  ASSERT_EQ(detour.status, 200) << detour.body;
  EXPECT_NE(detour.header("x-strata-worker"), home);
  EXPECT_EQ(detour.header("x-strata-attempts"), "2");
  EXPECT_EQ(redis_command(redis_.port(), {"GET", key}), home);
  for (int port : {a, b}) {
    const HttpAnswer back = turn(port, "agent-9", 200);
    ASSERT_EQ(back.status, 200) << back.body;
    EXPECT_EQ(back.header("x-strata-worker"), home) << "through replica " << port;
    EXPECT_EQ(back.header("x-strata-route"), "sticky");
  }

  // A second refusal to replica a within its 30 s window: the session moves.
  home_worker->refuse_next = 1;
  const HttpAnswer moved = turn(a, "agent-9", 300);
  ASSERT_EQ(moved.status, 200) << moved.body;
  const std::string new_home = moved.header("x-strata-worker");
  EXPECT_NE(new_home, home);
  EXPECT_EQ(redis_command(redis_.port(), {"GET", key}), new_home);
  const HttpAnswer after = turn(b, "agent-9", 400);
  ASSERT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(after.header("x-strata-worker"), new_home);
}

TEST_F(SharedSessionsRouteTest, ADeadStoreLeavesEachReplicaRoutingOnItsOwnBindings) {
  const int a = start_replica();
  ASSERT_TRUE(a);
  const HttpAnswer first = turn(a, "s", 0);
  ASSERT_EQ(first.status, 200) << first.body;
  redis_.kill();
  // Every request is still answered; the session keeps its worker from a's own table.
  for (int t = 1; t <= 3; ++t) {
    const HttpAnswer next = turn(a, "s", 100 * t);
    ASSERT_EQ(next.status, 200) << next.body;
    EXPECT_EQ(next.header("x-strata-worker"), first.header("x-strata-worker"));
  }
  const HttpAnswer fresh = turn(a, "new-session", 5000);
  EXPECT_EQ(fresh.status, 200) << fresh.body;
  EXPECT_GE(metric(a, "errors"), 1);
}

TEST_F(SharedSessionsRouteTest, ABadStoreUrlStopsTheRouterAtStart) {
  RouterOptions o;
  o.http.port = 0;
  o.shared_sessions.url = "redis:/nowhere";
  auto r = Router::create(o, *tokenizer_, nullptr, "m");
  ASSERT_FALSE(r.has_value());
  EXPECT_NE(r.error().message.find("--session-store"), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace strata::router
