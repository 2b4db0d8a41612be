// `strata route --pd` end to end against fake Strata workers on loopback ports (each an
// http::Server answering /server_info, /load and /v1/completions the way the worker side
// of docs/pd-disaggregation.md does): a long prompt goes to the decode worker with
// x-strata-prefill-peer and comes back with x-strata-prefill-worker; short prompts,
// prompts mostly cached on the decode worker, overloaded prefill workers and decode
// workers without a PD channel stay local; prefill workers never get a request; a client's
// own x-strata-prefill-peer is not passed on; a decode worker's 503 is retried elsewhere
// with the prefill decision taken again; the metrics and GET /workers say what happened.
// A PD channel with a transport the router does not know is not used. The same fake
// worker answering a wrongly typed /load is a counted poll error, never an exception on
// the router's I/O thread, and neither is a worker's tree (read when it joins) with nodes
// of the wrong shape.
// Every wait is bounded. Handlers build their Response in a named variable before
// co_await (g++ 12 may destroy a temporary inside a co_await expression twice).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "http/server.h"
#include "router/router.h"
#include "router_test_util.h"

namespace strata::router {
namespace {

using namespace std::chrono_literals;
using boost::asio::awaitable;
using nlohmann::json;

// A Strata worker as the router sees it. Thread-safe: handlers run on its I/O thread.
class FakeWorker {
 public:
  // `pd_id` "": /server_info has "pd": null.
  FakeWorker(std::string role, std::string pd_id, std::string transport = "ucx")
      : role_(std::move(role)), pd_id_(std::move(pd_id)), transport_(std::move(transport)) {
    server_ = fake_http_server();
    server_->route("GET", "/server_info", [this](http::Exchange& ex) -> awaitable<void> {
      json pd = nullptr;
      if (!pd_id_.empty()) {
        pd = {{"worker_id", pd_id_},
              {"endpoint", role_ == "prefill" ? "tcp://127.0.0.1:7100" : ""},
              {"transport", transport_}};
      }
      json events = nullptr;
      // Port 1: nothing publishes there (the subscription connects and waits).
      if (!tree.is_null()) events = {{"endpoint", "tcp://127.0.0.1:1"}};
      json info{{"engine", "strata"}, {"model", "m"},    {"role", role_},
                {"pd", pd},           {"page_size", 16}, {"kv_events", events}};
      http::Response out{.body = info.dump()};
      co_await ex.respond(std::move(out));
    });
    server_->route("GET", "/load", [this](http::Exchange& ex) -> awaitable<void> {
      json load{{"running", 0},
                {"waiting", 0},
                {"device", {{"total_pages", 100}, {"free_pages", 100}, {"evictable_pages", 0}}},
                {"max_running_requests", 32},
                {"queued_prefill_tokens", queued_prefill.load()},
                {"load_fraction", 0.0},
                {"saturated", false},
                {"recommended_pause_ms", 0}};
      // A report the router cannot read: a count as a string, a nested one as a bool.
      if (bad_load.load() == 1) load["running"] = "3";
      if (bad_load.load() == 2) load["device"]["free_pages"] = true;
      if (bad_load.load() == 3) load = json::array({1, 2});
      http::Response out{.body = load.dump()};
      co_await ex.respond(std::move(out));
    });
    server_->route("GET", "/cache/state", [this](http::Exchange& ex) -> awaitable<void> {
      http::Response out{.body = json{{"nodes", tree}}.dump()};
      co_await ex.respond(std::move(out));
    });
    server_->route("POST", "/v1/completions", [this](http::Exchange& ex) -> awaitable<void> {
      const std::string peer(ex.request().header("x-strata-prefill-peer"));
      {
        std::lock_guard lock(mutex_);
        peers_.push_back(peer);
      }
      if (refuse_503.load() > 0) {
        refuse_503.fetch_sub(1);
        http::Response out{.status = 503, .body = R"({"error":{}})"};
        co_await ex.respond(std::move(out));
        co_return;
      }
      const json body = json::parse(ex.request().body, nullptr, false);
      const int64_t prompt =
          body.is_object() && body.contains("prompt") && body["prompt"].is_array()
              ? static_cast<int64_t>(body["prompt"].size())
              : 0;
      json usage{{"prompt_tokens", prompt}, {"completion_tokens", 1}};
      if (!peer.empty()) usage["kv_transfer"] = {{"tokens", prompt}, {"bytes", 1024}, {"ms", 1}};
      if (body.value("stream", false)) {
        if (!co_await ex.begin_stream(200, "text/event-stream")) co_return;
        const std::string first = json{{"choices", {{{"text", "x"}}}}}.dump();
        const std::string last = json{{"choices", json::array()}, {"usage", usage}}.dump();
        ex.send("data: " + first + "\n\n");
        ex.send("data: " + last + "\n\n");
        ex.send("data: [DONE]\n\n");
        co_await ex.end_stream();
        co_return;
      }
      json answer{{"choices", {{{"text", "x"}}}}, {"usage", usage}};
      http::Response out{.body = answer.dump()};
      co_await ex.respond(std::move(out));
    });
    EXPECT_TRUE(server_->bind().has_value());
    server_->start();
  }
  ~FakeWorker() { server_->shutdown(1); }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  // The x-strata-prefill-peer of every generation request received ("" when none).
  std::vector<std::string> peers() {
    std::lock_guard lock(mutex_);
    return peers_;
  }

  std::atomic<int64_t> queued_prefill{0};
  std::atomic<int> refuse_503{0};  // answer this many generation requests with 503
  std::atomic<int> bad_load{0};    // 0: a good /load; 1, 2, 3: wrongly typed ones
  // Set before the router starts: /server_info names a KV events endpoint and GET
  // /cache/state answers these nodes, which the router reads as the worker's tree when it
  // joins.
  json tree = nullptr;

 private:
  const std::string role_;
  const std::string pd_id_;
  const std::string transport_;
  std::unique_ptr<http::Server> server_;
  std::mutex mutex_;
  std::vector<std::string> peers_;
};

class PdRouteTest : public ::testing::Test {
 protected:
  void start_router(const std::vector<FakeWorker*>& workers, bool pd) {
    tokenizer_ = tiny_tokenizer();
    ASSERT_NE(tokenizer_, nullptr);
    RouterOptions o;
    o.http.port = 0;
    o.http.io_threads = 1;
    o.http.worker_threads = 1;
    o.io_threads = 1;
    o.load_poll_ms = 10;
    o.pd.enabled = pd;
    o.pd.min_prefill_tokens = 32;
    o.pd.max_prefill_queue_tokens = 10'000;
    for (FakeWorker* w : workers) o.workers.push_back(w->url());
    auto r = Router::create(o, *tokenizer_, nullptr, "m");
    ASSERT_TRUE(r.has_value()) << r.error().message;
    router_ = std::move(*r);
    ASSERT_TRUE(router_->bind().has_value());
    router_->start();
    port_ = router_->port();
    const size_t n = workers.size();
    ASSERT_TRUE(eventually([&] {
      const HttpAnswer a = http_call(port_, "GET", "/workers");
      const json j = json::parse(a.body, nullptr, false);
      if (!j.is_object()) return false;
      size_t joined = 0;
      for (const json& w : j["workers"]) joined += w.value("joined", false) ? 1 : 0;
      return joined == n;
    }));
  }
  void TearDown() override {
    if (router_) router_->shutdown(1);
  }

  HttpAnswer complete(const std::string& body, const std::string& headers = "") {
    return http_call(port_, "POST", "/v1/completions", body,
                     "Content-Type: application/json\r\n" + headers);
  }
  // The value of one sample of the router's /metrics ("name{labels}"), -1 when absent.
  double metric(const std::string& sample) {
    const HttpAnswer a = http_call(port_, "GET", "/metrics");
    const size_t p = a.body.find("\n" + sample + " ");
    if (p == std::string::npos) return -1;
    return std::stod(a.body.substr(p + sample.size() + 2));
  }
  json worker_entry(const std::string& url) {
    const json j = json::parse(http_call(port_, "GET", "/workers").body, nullptr, false);
    for (const json& w : j["workers"]) {
      if (w["url"] == url) return w;
    }
    return nullptr;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Router> router_;
  int port_ = 0;
};

TEST_F(PdRouteTest, LongPromptsArePrefilledRemotelyShortAndCachedOnesLocally) {
  FakeWorker decode("decode", "d1");
  FakeWorker prefill("prefill", "p1");
  start_router({&decode, &prefill}, true);

  // 200 tokens, none cached anywhere: remote.
  HttpAnswer a = complete(prompt_body(200, 1'000));
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.header("x-strata-worker"), decode.url());
  EXPECT_EQ(a.header("x-strata-prefill-worker"), prefill.url());
  ASSERT_EQ(decode.peers().size(), 1u);
  EXPECT_EQ(decode.peers()[0], "p1");
  // The decode worker's usage passes through.
  EXPECT_EQ(json::parse(a.body)["usage"]["kv_transfer"]["tokens"], 200);

  // 20 tokens: local, no header either way.
  a = complete(prompt_body(20, 5'000));
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.header("x-strata-prefill-worker"), "");
  EXPECT_EQ(decode.peers().back(), "");

  // The first prompt again plus 20 tokens: predict-on-route says the decode worker holds
  // its first 192 tokens, so only 28 are missing there: local.
  json ids = json::array();
  for (int i = 0; i < 220; ++i) ids.push_back(i < 200 ? 1'000 + i : 9'000 + i);
  a = complete(json{{"prompt", ids}, {"max_tokens", 1}}.dump());
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.header("x-strata-prefill-worker"), "");
  EXPECT_EQ(decode.peers().back(), "");

  // A client's own header never reaches a worker.
  a = complete(prompt_body(20, 6'000), "x-strata-prefill-peer: p1\r\n");
  ASSERT_EQ(a.status, 200);
  EXPECT_EQ(decode.peers().back(), "");

  // Streaming: the header comes with the stream's head, the usage chunk's kv_transfer is
  // counted.
  a = complete(prompt_body(100, 20'000, true));
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.header("x-strata-prefill-worker"), prefill.url());
  EXPECT_NE(a.body.find("kv_transfer"), std::string::npos);
  EXPECT_EQ(decode.peers().back(), "p1");

  // The prefill worker never got a request of its own.
  EXPECT_TRUE(prefill.peers().empty());
  EXPECT_EQ(metric(R"(strata_router_pd_decisions_total{decision="remote"})"), 2);
  EXPECT_EQ(metric(R"(strata_router_pd_decisions_total{decision="local_short"})"), 3);
  EXPECT_EQ(metric("strata_router_pd_kv_transfer_tokens_total"), 300);
  EXPECT_EQ(metric("strata_router_pd_remote_without_transfer_total"), 0);

  const json p = worker_entry(prefill.url());
  EXPECT_EQ(p["role"], "prefill");
  EXPECT_EQ(p["pd"]["worker_id"], "p1");
  EXPECT_EQ(p["pd"]["prefill_usable"], true);
  EXPECT_EQ(p["router"]["prefill_orders"], 2);
  // Every charge was released with the answers.
  EXPECT_EQ(p["router"]["inflight_prefill_tokens"], 0);
  EXPECT_EQ(worker_entry(decode.url())["router"]["inflight_prefill_tokens"], 0);
  EXPECT_EQ(worker_entry(decode.url())["pd"]["worker_id"], "d1");
}

TEST_F(PdRouteTest, AnOverloadedPrefillWorkerLeavesThePrefillLocal) {
  FakeWorker decode("decode", "d1");
  FakeWorker prefill("prefill", "p1");
  prefill.queued_prefill = 50'000;  // above --pd-max-prefill-queue-tokens (10,000 here)
  start_router({&decode, &prefill}, true);
  ASSERT_TRUE(eventually(
      [&] { return worker_entry(prefill.url())["load"]["queued_prefill_tokens"] == 50'000; }));
  HttpAnswer a = complete(prompt_body(200, 1'000));
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.header("x-strata-prefill-worker"), "");
  EXPECT_EQ(decode.peers().back(), "");
  EXPECT_EQ(metric(R"(strata_router_pd_decisions_total{decision="local_overloaded"})"), 1);
  // Its queue drains: remote again.
  prefill.queued_prefill = 0;
  ASSERT_TRUE(eventually(
      [&] { return worker_entry(prefill.url())["load"]["queued_prefill_tokens"] == 0; }));
  a = complete(prompt_body(200, 3'000));
  EXPECT_EQ(a.header("x-strata-prefill-worker"), prefill.url());
  EXPECT_EQ(decode.peers().back(), "p1");
}

TEST_F(PdRouteTest, WithoutAChannelOrAPrefillWorkerThePrefillIsLocal) {
  FakeWorker mixed("mixed", "");            // no PD channel
  FakeWorker prefill_no_id("prefill", "");  // a prefill worker that reports none
  start_router({&mixed, &prefill_no_id}, true);
  HttpAnswer a = complete(prompt_body(200, 1'000));
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.header("x-strata-worker"), mixed.url());
  EXPECT_EQ(a.header("x-strata-prefill-worker"), "");
  EXPECT_EQ(mixed.peers().back(), "");
  EXPECT_TRUE(prefill_no_id.peers().empty());
  EXPECT_EQ(metric(R"(strata_router_pd_decisions_total{decision="local_no_prefill_worker"})"), 1);
  EXPECT_EQ(worker_entry(mixed.url())["pd"], nullptr);
}

TEST_F(PdRouteTest, PrefillWorkersGetNoRequestsWithoutPdEither) {
  FakeWorker decode("decode", "d1");
  FakeWorker prefill("prefill", "p1");
  start_router({&decode, &prefill}, false);
  for (int i = 0; i < 6; ++i) {
    const HttpAnswer a = complete(prompt_body(200, 1'000 * (i + 1)));
    ASSERT_EQ(a.status, 200) << a.body;
    EXPECT_EQ(a.header("x-strata-worker"), decode.url());
    EXPECT_EQ(a.header("x-strata-prefill-worker"), "");
  }
  EXPECT_TRUE(prefill.peers().empty());
  for (const std::string& p : decode.peers()) EXPECT_EQ(p, "");
  EXPECT_LE(metric(R"(strata_router_pd_decisions_total{decision="remote"})"), 0);
}

TEST_F(PdRouteTest, OnlyPrefillWorkersMeansNoWorkerForTheRequest) {
  FakeWorker prefill("prefill", "p1");
  start_router({&prefill}, true);
  const HttpAnswer a = complete(prompt_body(200, 1'000));
  EXPECT_EQ(a.status, 503) << a.body;
  EXPECT_TRUE(prefill.peers().empty());
  EXPECT_EQ(http_call(port_, "GET", "/health").status, 503);
}

TEST_F(PdRouteTest, ADecodeWorkers503IsRetriedOnAnotherWithThePrefillDecidedAgain) {
  FakeWorker d1("decode", "d1");
  FakeWorker d2("decode", "d2");
  FakeWorker prefill("prefill", "p1");
  d1.refuse_503 = 1;  // the first tried (equal costs: the lowest id) refuses once
  start_router({&d1, &d2, &prefill}, true);
  const HttpAnswer a = complete(prompt_body(200, 1'000));
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.header("x-strata-attempts"), "2");
  EXPECT_EQ(a.header("x-strata-worker"), d2.url());
  EXPECT_EQ(a.header("x-strata-prefill-worker"), prefill.url());
  EXPECT_EQ(d1.peers(), std::vector<std::string>{"p1"});
  EXPECT_EQ(d2.peers(), std::vector<std::string>{"p1"});
  EXPECT_EQ(metric(R"(strata_router_pd_decisions_total{decision="remote"})"), 2);
  EXPECT_EQ(worker_entry(prefill.url())["router"]["inflight_prefill_tokens"], 0);
  EXPECT_TRUE(prefill.peers().empty());
}

TEST_F(PdRouteTest, AChannelWithAnUnknownTransportIsNotUsed) {
  FakeWorker decode("decode", "d1");
  FakeWorker prefill("prefill", "p1", "carrier-pigeon");
  FakeWorker storage_decode("decode", "d2", "storage");
  start_router({&decode, &prefill, &storage_decode}, true);
  EXPECT_EQ(worker_entry(prefill.url())["pd"], nullptr);
  EXPECT_EQ(worker_entry(decode.url())["pd"]["transport"], "ucx");
  EXPECT_EQ(worker_entry(storage_decode.url())["pd"]["transport"], "storage");
  // Long prompts would go remote with a usable prefill worker: they stay local.
  for (int i = 0; i < 4; ++i) {
    const HttpAnswer a = complete(prompt_body(200, 1'000 * (i + 1)));
    ASSERT_EQ(a.status, 200) << a.body;
    EXPECT_EQ(a.header("x-strata-prefill-worker"), "");
  }
  EXPECT_TRUE(prefill.peers().empty());
  EXPECT_LE(metric(R"(strata_router_pd_decisions_total{decision="remote"})"), 0);
}

TEST_F(PdRouteTest, AWronglyTypedLoadReportIsACountedPollErrorNamingTheField) {
  FakeWorker good("mixed", "");
  FakeWorker bad("mixed", "");
  start_router({&good, &bad}, false);
  ASSERT_TRUE(eventually([&] { return worker_entry(bad.url())["load"]["total_pages"] == 100; }));
  const std::pair<int, std::string> cases[] = {
      {1, "'running' must be an integer"},
      {2, "'free_pages' must be an integer"},
      {3, "not a JSON object"},
  };
  for (const auto& [shape, field] : cases) {
    bad.bad_load = shape;
    ASSERT_TRUE(eventually([&, field = field] {
      const json w = worker_entry(bad.url());
      return w["reachable"] == false && w["poll_failures"].get<int>() >= 3 &&
             w["last_error"].get<std::string>().find(field) != std::string::npos;
    })) << worker_entry(bad.url()).dump();
    const json w = worker_entry(bad.url());
    EXPECT_EQ(
        w["last_error"].get<std::string>().rfind("load poll: GET /load: unreadable report: ", 0),
        0u)
        << w["last_error"];
    EXPECT_GE(w["unreadable_load_reports"].get<int>(), 3);
    EXPECT_EQ(w["eligible"], false);
    // The router goes on serving, on the other worker.
    const HttpAnswer a = complete(prompt_body(20, 100 * shape));
    ASSERT_EQ(a.status, 200) << a.body;
    EXPECT_EQ(a.header("x-strata-worker"), good.url());
    EXPECT_EQ(worker_entry(good.url())["unreadable_load_reports"], 0);
    // A readable report again: reachable, its count kept.
    bad.bad_load = 0;
    ASSERT_TRUE(eventually([&] { return worker_entry(bad.url())["reachable"] == true; }));
    EXPECT_GE(worker_entry(bad.url())["unreadable_load_reports"].get<int>(), 3);
  }
}

// A worker's tree with nodes of the wrong shape (a number, fields of the wrong type) is read
// field by field: the well-formed blocks are indexed, the rest skipped, and nothing throws
// on the router's I/O thread.
TEST_F(PdRouteTest, AWronglyShapedTreeIsIndexedAsFarAsItIsReadable) {
  FakeWorker w("mixed", "");
  w.tree = json::array({
      5,
      {{"tiers", "device"}, {"block_hashes", {1, 2}}, {"loading", "no"}},
      {{"tiers", {"device"}}, {"block_hashes", "3"}},
      {{"tiers", {"device", "host"}}, {"block_hashes", {10, "x", 11}}, {"pin_counts", {1, 0, 2}}},
      {{"tiers", {"host"}}, {"block_hashes", {20}}, {"pin_counts", "1"}, {"loading", true}},
  });
  start_router({&w}, false);
  auto index_entry = [&] {
    const json s = json::parse(http_call(port_, "GET", "/cache/state").body, nullptr, false);
    return s.is_object() ? s["index"]["workers"][0] : json(nullptr);
  };
  // 10 and 11 (pinned: 10, and 11 by its count) and 20 on the host; 1 and 2 name no tier
  // (their tiers are not a list), so they are held nowhere.
  ASSERT_TRUE(eventually([&] { return index_entry().value("blocks", 0) == 3; }))
      << index_entry().dump();
  EXPECT_EQ(index_entry()["pinned_blocks"], 2);
  EXPECT_EQ(index_entry()["host_blocks"], 3);
  EXPECT_EQ(index_entry()["device_blocks"], 2);
  // The router goes on serving.
  const HttpAnswer a = complete(prompt_body(20, 7));
  EXPECT_EQ(a.status, 200) << a.body;
}

}  // namespace
}  // namespace strata::router
