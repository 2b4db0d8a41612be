// `strata route` in front of workers that are not Strata, as a --workers-file lists them:
// fake llama.cpp servers (llama-server's GET /slots and GET /metrics, in its own shapes
// and names) and fake OpenAI-compatible servers (GET /v1/models only), each an
// http::Server on a loopback port. The router reads a llama.cpp server's load from its
// slots and metrics (and does without either when llama-server does not serve it), keeps
// new requests off a server whose slots are all busy, waits for one that is loading,
// forgets what it predicted on one that restarted; an OpenAI-compatible server's load is
// the router's own accounting; a kind it does not know is an error at start, and a bad
// entry in a changed file is skipped. Every wait is bounded; nothing asserts a time.
// Handlers build their Response in a named variable before co_await (g++ 12 may destroy
// a temporary inside a co_await expression twice).
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "http/server.h"
#include "router/router.h"
#include "router_test_util.h"

namespace strata::router {
namespace {

using namespace std::chrono_literals;
using boost::asio::awaitable;
using nlohmann::json;

// A server that is not Strata. kLlamaCpp answers GET /slots and GET /metrics as
// llama-server does (501 when "started without" them, 503 everywhere while "loading its
// model"); kOpenAi answers neither (404), only GET /v1/models. Both answer POST
// /v1/completions, holding each answer while `hold` is set. Thread-safe: the test sets the
// atomics, the server's threads read them.
class FakeEngine {
 public:
  enum class Shape { kLlamaCpp, kOpenAi };

  explicit FakeEngine(Shape shape) : shape_(shape) {
    server_ = fake_http_server();
    server_->route("GET", "/slots", [this](http::Exchange& ex) -> awaitable<void> {
      http::Response out = unavailable("slots", slots_on.load());
      if (out.status == 200) out.body = slots_json().dump();
      co_await ex.respond(std::move(out));
    });
    server_->route("GET", "/metrics", [this](http::Exchange& ex) -> awaitable<void> {
      http::Response out = unavailable("metrics", metrics_on.load());
      if (out.status == 200) {
        out.content_type = "text/plain; version=0.0.4";
        out.body = metrics_text();
      }
      co_await ex.respond(std::move(out));
    });
    server_->route("GET", "/v1/models", [this](http::Exchange& ex) -> awaitable<void> {
      http::Response out{.body = R"({"object":"list","data":[{"id":"m","object":"model"}]})"};
      if (loading) out = http::Response{.status = 503, .body = loading_error()};
      co_await ex.respond(std::move(out));
    });
    server_->route("POST", "/v1/completions", [this](http::Exchange& ex) -> awaitable<void> {
      ++received;
      while (hold.load()) co_await ex.sleep(2ms);
      http::Response out{.body = R"({"choices":[{"text":"x"}],"usage":{"prompt_tokens":1,)"
                                 R"("completion_tokens":1}})"};
      co_await ex.respond(std::move(out));
    });
    EXPECT_TRUE(server_->bind().has_value());
    server_->start();
  }
  ~FakeEngine() {
    hold = false;
    server_->shutdown(1);
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }

  // llama-server's state: slots (-np), those processing, requests deferred (all busy),
  // llamacpp:prompt_tokens_total, a slot's context; --metrics and /slots on or off.
  std::atomic<int> slots{4}, busy{0}, deferred{0}, n_ctx{4096};
  std::atomic<int64_t> prompt_tokens_total{0};
  std::atomic<bool> metrics_on{true}, slots_on{true}, loading{false};
  std::atomic<bool> hold{false};  // answer no completion until cleared
  std::atomic<int> received{0};   // completion requests received

 private:
  static std::string loading_error() {
    return R"({"error":{"code":503,"message":"Loading model","type":"unavailable_error"}})";
  }

  // 200, or the error llama-server answers for `what`: 404 for an OpenAI-compatible
  // server, 503 while loading, 501 when the endpoint is off.
  http::Response unavailable(const std::string& what, bool on) const {
    if (shape_ == Shape::kOpenAi) return http::Response{.status = 404, .body = "Not Found"};
    if (loading) return http::Response{.status = 503, .body = loading_error()};
    if (!on) {
      const json e{{"error",
                    {{"code", 501},
                     {"message", "This server does not support " + what + " endpoint."},
                     {"type", "not_supported_error"}}}};
      return http::Response{.status = 501, .body = e.dump()};
    }
    return http::Response{};
  }

  json slots_json() const {
    json out = json::array();
    for (int i = 0; i < slots; ++i) {
      out.push_back({{"id", i},
                     {"id_task", i < busy ? 100 + i : -1},
                     {"n_ctx", n_ctx.load()},
                     {"speculative", false},
                     {"is_processing", i < busy},
                     {"params", {{"n_predict", -1}, {"temperature", 0.8}}},
                     {"next_token", {{"has_next_token", true}, {"n_decoded", 0}}}});
    }
    return out;
  }

  std::string metrics_text() const {
    auto metric = [](const std::string& name, const std::string& type, const std::string& help,
                     const std::string& value) {
      return "# HELP llamacpp:" + name + " " + help + "\n# TYPE llamacpp:" + name + " " + type +
             "\nllamacpp:" + name + " " + value + "\n";
    };
    return metric("prompt_tokens_total", "counter", "Number of prompt tokens processed.",
                  std::to_string(prompt_tokens_total.load())) +
           metric("prompt_seconds_total", "counter", "Prompt process time", "1.25") +
           metric("tokens_predicted_total", "counter", "Number of generation tokens processed.",
                  "42") +
           metric("requests_processing", "gauge", "Number of requests processing.",
                  std::to_string(busy.load())) +
           metric("requests_deferred", "gauge", "Number of requests deferred.",
                  std::to_string(deferred.load())) +
           metric("n_decode_total", "counter", "Total number of llama_decode() calls", "17");
  }

  const Shape shape_;
  std::unique_ptr<http::Server> server_;
};

using Shape = FakeEngine::Shape;

class WorkerKindsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokenizer_ = tiny_tokenizer();
    ASSERT_NE(tokenizer_, nullptr);
    static std::atomic<int> n{0};
    file_ = std::filesystem::temp_directory_path() /
            ("strata-workers-" + std::to_string(::getpid()) + "-" + std::to_string(++n) + ".json");
  }
  void TearDown() override {
    if (router_) router_->shutdown(1);
    std::error_code ec;
    std::filesystem::remove(file_, ec);
  }

  void write_file(const json& entries) {
    // A new name then a rename: the router never reads half a file.
    const auto tmp = file_.string() + ".tmp";
    std::ofstream(tmp) << entries.dump();
    std::filesystem::rename(tmp, file_);
  }

  Result<std::unique_ptr<Router>> create(const json& entries) {
    write_file(entries);
    RouterOptions o;
    o.http.port = 0;
    o.http.io_threads = 1;
    o.http.worker_threads = 1;
    o.io_threads = 1;
    o.load_poll_ms = 10;
    o.files_poll_ms = 10;
    o.workers_file = file_.string();
    return Router::create(o, *tokenizer_, nullptr, "m");
  }

  // Starts a router over `entries`; waits until `reachable` of them (all by default) are
  // joined and reachable.
  void start_router(const json& entries, int reachable = -1) {
    auto r = create(entries);
    ASSERT_TRUE(r.has_value()) << r.error().message;
    router_ = std::move(*r);
    ASSERT_TRUE(router_->bind().has_value());
    router_->start();
    port_ = router_->port();
    const size_t n = reachable < 0 ? entries.size() : static_cast<size_t>(reachable);
    ASSERT_TRUE(eventually([&] {
      const json j = json::parse(http_call(port_, "GET", "/workers").body, nullptr, false);
      if (!j.is_object()) return false;
      size_t up = 0;
      for (const json& w : j["workers"]) {
        up += w.value("joined", false) && w.value("reachable", false) ? 1 : 0;
      }
      return up >= n;
    }));
  }

  HttpAnswer complete(const std::string& body) {
    return http_call(port_, "POST", "/v1/completions", body, "Content-Type: application/json\r\n");
  }
  json worker_entry(const std::string& url) {
    const json j = json::parse(http_call(port_, "GET", "/workers").body, nullptr, false);
    if (!j.is_object()) return nullptr;
    for (const json& w : j["workers"]) {
      if (w["url"] == url) return w;
    }
    return nullptr;
  }
  // Waits until the worker's GET /workers entry satisfies `pred`; its last entry.
  template <typename P>
  json entry_when(const std::string& url, P pred) {
    json w;
    const bool ok = eventually([&] {
      w = worker_entry(url);
      return w.is_object() && pred(w);
    });
    EXPECT_TRUE(ok) << "last entry: " << w.dump();
    return w;
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  std::filesystem::path file_;
  std::unique_ptr<Router> router_;
  int port_ = 0;
};

json entry(const FakeEngine& e, const std::string& kind) {
  return json{{"url", e.url()}, {"kind", kind}};
}

TEST_F(WorkerKindsTest, ALlamaCppServersLoadIsReadFromItsSlotsAndMetrics) {
  FakeEngine a(Shape::kLlamaCpp);
  a.busy = 1;
  a.prompt_tokens_total = 120;
  a.n_ctx = 8192;
  start_router(json::array({entry(a, "llamacpp")}));
  json w = entry_when(a.url(), [](const json& w) {
    return w["load"]["source"] == "slots+metrics" && w["load"]["running"] == 1;
  });
  EXPECT_EQ(w["kind"], "llamacpp");
  EXPECT_EQ(w["role"], "mixed");
  EXPECT_EQ(w["block_size"], 16);  // the router's approximate granularity
  EXPECT_EQ(w["kv_events"], nullptr);
  EXPECT_EQ(w["load"]["max_running_requests"], 4);
  EXPECT_DOUBLE_EQ(w["load"]["load_fraction"].get<double>(), 0.25);
  EXPECT_EQ(w["load"]["waiting"], 0);
  EXPECT_EQ(w["load"]["prompt_tokens_total"], 120);
  EXPECT_EQ(w["max_prompt_tokens"], 8192);
  EXPECT_EQ(w["eligible"], true);

  // Every slot busy and two requests deferred: (4 + 2) / 4. A poll reads /slots and /metrics
  // one after the other, so one that straddles the two changes shows waiting 2 with the old
  // running 1 (seen under ThreadSanitizer): wait for both.
  a.busy = 4;
  a.deferred = 2;
  w = entry_when(a.url(), [](const json& w) {
    return w["load"]["waiting"] == 2 && w["load"]["running"] == 4;
  });
  EXPECT_EQ(w["load"]["running"], 4);
  EXPECT_DOUBLE_EQ(w["load"]["load_fraction"].get<double>(), 1.5);
}

TEST_F(WorkerKindsTest, ALlamaCppServerWithEverySlotBusyGetsNoNewRequests) {
  FakeEngine a(Shape::kLlamaCpp);
  FakeEngine b(Shape::kLlamaCpp);
  a.busy = 4;  // all of its 4 slots: load_fraction 1 > --busy-threshold 0.9
  start_router(json::array({entry(a, "llamacpp"), entry(b, "llamacpp")}));
  entry_when(a.url(), [](const json& w) { return w["load"]["load_fraction"] == 1.0; });
  for (int i = 0; i < 4; ++i) {
    const HttpAnswer r = complete(prompt_body(40, 1'000 * (i + 1)));
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.header("x-strata-worker"), b.url());
  }
  EXPECT_EQ(a.received, 0);
  // Its slots free: at equal costs the lowest id (a) is chosen again.
  a.busy = 0;
  entry_when(a.url(), [](const json& w) { return w["load"]["load_fraction"] == 0.0; });
  const HttpAnswer r = complete(prompt_body(40, 50'000));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.header("x-strata-worker"), a.url());
}

TEST_F(WorkerKindsTest, WhatALlamaCppServerDoesNotServeIsDoneWithout) {
  FakeEngine slots_only(Shape::kLlamaCpp);
  slots_only.metrics_on = false;  // llama-server without --metrics
  FakeEngine metrics_only(Shape::kLlamaCpp);
  metrics_only.slots_on = false;  // with --no-slots
  FakeEngine neither(Shape::kLlamaCpp);
  neither.metrics_on = false;
  neither.slots_on = false;
  slots_only.busy = 2;
  metrics_only.busy = 3;
  start_router(json::array({entry(slots_only, "llamacpp"), entry(metrics_only, "llamacpp"),
                            entry(neither, "llamacpp")}));
  json w = entry_when(slots_only.url(), [](const json& w) { return w["load"]["running"] == 2; });
  EXPECT_EQ(w["load"]["source"], "slots");
  EXPECT_DOUBLE_EQ(w["load"]["load_fraction"].get<double>(), 0.5);
  EXPECT_EQ(w["load"]["prompt_tokens_total"], nullptr);
  w = entry_when(metrics_only.url(), [](const json& w) { return w["load"]["running"] == 3; });
  EXPECT_EQ(w["load"]["source"], "metrics");
  EXPECT_EQ(w["load"]["max_running_requests"], 0);  // unknown without its slots
  EXPECT_EQ(w["load"]["load_fraction"], 0.0);
  // Without its slots the router cannot tell how full it is, only that it defers requests.
  metrics_only.deferred = 1;
  entry_when(metrics_only.url(), [](const json& w) { return w["load"]["load_fraction"] == 1.0; });
  // Neither: it answers, so it is reachable; its load is the router's own accounting.
  w = worker_entry(neither.url());
  EXPECT_EQ(w["load"]["source"], "router");
  EXPECT_EQ(w["reachable"], true);
  EXPECT_EQ(w["eligible"], true);
}

TEST_F(WorkerKindsTest, ALoadingLlamaCppServerIsNotChosenUntilItIsReady) {
  FakeEngine loading(Shape::kLlamaCpp);
  loading.loading = true;  // 503 "Loading model" everywhere
  FakeEngine ready(Shape::kLlamaCpp);
  start_router(json::array({entry(loading, "llamacpp"), entry(ready, "llamacpp")}), 1);
  entry_when(loading.url(),
             [](const json& w) { return w["reachable"] == false && w["eligible"] == false; });
  for (int i = 0; i < 3; ++i) {
    const HttpAnswer r = complete(prompt_body(20, 1'000 * (i + 1)));
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.header("x-strata-worker"), ready.url());
  }
  loading.loading = false;
  entry_when(loading.url(), [](const json& w) { return w["eligible"] == true; });
  EXPECT_EQ(loading.received, 0);
}

TEST_F(WorkerKindsTest, ARestartedLlamaCppServerLosesWhatTheRouterPredictedThere) {
  FakeEngine a(Shape::kLlamaCpp);
  FakeEngine b(Shape::kLlamaCpp);
  a.prompt_tokens_total = 500;
  start_router(json::array({entry(a, "llamacpp"), entry(b, "llamacpp")}));
  entry_when(a.url(), [](const json& w) { return w["load"]["prompt_tokens_total"] == 500; });
  const std::string prompt = prompt_body(64, 1'000);
  HttpAnswer r = complete(prompt);
  ASSERT_EQ(r.status, 200) << r.body;
  // Equal costs: the router's first decision starts its ties at the lowest id.
  ASSERT_EQ(r.header("x-strata-worker"), a.url());
  // The router predicts the prompt cached where it sent it.
  r = complete(prompt);
  EXPECT_EQ(r.header("x-strata-worker"), a.url());
  EXPECT_EQ(r.header("x-strata-route"), "cache");
  // The counter grows: the same process.
  a.prompt_tokens_total = 600;
  entry_when(a.url(), [](const json& w) { return w["load"]["prompt_tokens_total"] == 600; });
  r = complete(prompt);
  EXPECT_EQ(r.header("x-strata-route"), "cache");
  // It went back: another process, with an empty cache.
  a.prompt_tokens_total = 0;
  entry_when(a.url(), [](const json& w) { return w["load"]["prompt_tokens_total"] == 0; });
  // Both workers now cost the same (nothing predicted anywhere): the tie decides, not a cache.
  r = complete(prompt);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.header("x-strata-route"), "load");
}

TEST_F(WorkerKindsTest, AnOpenAiServersLoadIsTheRoutersOwnAccounting) {
  FakeEngine a(Shape::kOpenAi);
  FakeEngine b(Shape::kOpenAi);
  json list = json::array({entry(a, "openai"), entry(b, "openai")});
  list[0]["max_running_requests"] = 1;
  start_router(list);
  json w = worker_entry(a.url());
  EXPECT_EQ(w["kind"], "openai");
  EXPECT_EQ(w["load"]["source"], "router");
  EXPECT_EQ(w["load"]["max_running_requests"], 1);
  EXPECT_EQ(w["block_size"], 16);
  EXPECT_EQ(worker_entry(b.url())["load"]["max_running_requests"], 0);

  // A request held on a: the router counts it there, and with one at most a is saturated.
  a.hold = true;
  HttpAnswer held;
  std::thread t([&] { held = complete(prompt_body(20, 1'000)); });
  ASSERT_TRUE(eventually([&] { return a.received == 1; }));
  w = entry_when(a.url(), [](const json& w) { return w["load"]["load_fraction"] == 1.0; });
  EXPECT_EQ(w["router"]["active_requests"], 1);
  EXPECT_EQ(w["load"]["running"], 0);  // it reports nothing
  for (int i = 0; i < 3; ++i) {
    const HttpAnswer r = complete(prompt_body(20, 2'000 * (i + 1)));
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.header("x-strata-worker"), b.url());
  }
  a.hold = false;
  t.join();
  EXPECT_EQ(held.status, 200);
  EXPECT_EQ(held.header("x-strata-worker"), a.url());
  w = entry_when(a.url(), [](const json& w) { return w["load"]["load_fraction"] == 0.0; });
  EXPECT_EQ(w["router"]["active_requests"], 0);
}

TEST_F(WorkerKindsTest, AWorkerEnteredAsAnotherKindReadsNoLoadAndSaysSo) {
  // issue 33: llama.cpp servers entered as `kind: vllm` were routed but read no load.
  FakeEngine a(Shape::kLlamaCpp);
  a.busy = 4;
  json list = json::array({entry(a, "vllm")});
  list[0]["block_size"] = 16;
  start_router(list);
  const json w = worker_entry(a.url());
  EXPECT_EQ(w["load"]["source"], "router");
  EXPECT_EQ(w["load"]["running"], 0);
  EXPECT_EQ(w["eligible"], true);
  const HttpAnswer r = complete(prompt_body(20, 1'000));
  EXPECT_EQ(r.status, 200) << r.body;
}

TEST_F(WorkerKindsTest, BadEntriesAreAnErrorAtStart) {
  const std::string url = "http://127.0.0.1:9";
  struct Case {
    json file;
    std::string says;
  };
  const std::vector<Case> cases = {
      {json::array({{{"url", url}, {"kind", "tgi"}}}),
       "unknown worker kind 'tgi' (it must be strata, vllm, sglang, llamacpp or openai)"},
      {json::array({{{"url", url}, {"kind", 3}}}), "'kind' must be a string"},
      {json::array({{{"url", url}, {"kind", "vllm"}, {"role", "mixed"}}}), "'block_size'"},
      {json::array({{{"url", url}, {"kind", "llamacpp"}, {"kv_events", "tcp://127.0.0.1:5557"}}}),
       "publishes no KV events"},
      {json::array({{{"url", url}, {"kind", "openai"}, {"kv_events_replay", "tcp://h:1"}}}),
       "publishes no KV events"},
      {json::array({{{"url", url}, {"kind", "llamacpp"}, {"role", "boss"}}}),
       "unknown worker role 'boss'"},
      {json::array({{{"url", url}, {"kind", "llamacpp"}, {"max_running_requests", 4}}}),
       "'max_running_requests' is for kind openai"},
      {json::array({{{"url", url}, {"kind", "openai"}, {"max_running_requests", 0}}}),
       "'max_running_requests' must be an integer in [1, 1000000]"},
      {json::array({{{"url", url}, {"kind", "llamacpp"}, {"block_size", 0}}}), "'block_size'"},
      {json::array({{{"kind", "llamacpp"}}}), "without a 'url'"},
      {json{{"url", url}}, "not a JSON list"},
  };
  for (const Case& c : cases) {
    auto r = create(c.file);
    ASSERT_FALSE(r.has_value()) << c.file.dump();
    EXPECT_NE(r.error().message.find(c.says), std::string::npos)
        << c.file.dump() << ": " << r.error().message;
    EXPECT_NE(r.error().message.find("--workers-file"), std::string::npos) << r.error().message;
  }
  // Each kind with what it needs.
  auto r = create(json::array({{{"url", url}, {"kind", "llamacpp"}},
                               {{"url", "http://127.0.0.1:10"}, {"kind", "openai"}},
                               {{"url", "http://127.0.0.1:11"},
                                {"kind", "sglang"},
                                {"block_size", 64},
                                {"role", "decode"}}}));
  EXPECT_TRUE(r.has_value()) << r.error().message;
}

TEST_F(WorkerKindsTest, ABadEntryInAChangedFileIsSkippedAndTheRestRead) {
  FakeEngine a(Shape::kLlamaCpp);
  FakeEngine c(Shape::kOpenAi);
  start_router(json::array({entry(a, "llamacpp")}));
  write_file(json::array({entry(a, "llamacpp"),
                          {{"url", "http://127.0.0.1:9"}, {"kind", "tgi"}},
                          entry(c, "openai")}));
  entry_when(c.url(), [](const json& w) { return w["reachable"] == true; });
  const json j = json::parse(http_call(port_, "GET", "/workers").body);
  EXPECT_EQ(j["workers"].size(), 2u);
}

TEST_F(WorkerKindsTest, AnEntryWhoseKindIsCorrectedIsTheWorkerAddedAgain) {
  FakeEngine a(Shape::kLlamaCpp);
  a.busy = 1;
  json list = json::array({entry(a, "vllm")});
  list[0]["block_size"] = 16;
  start_router(list);
  entry_when(a.url(), [](const json& w) { return w["load"]["source"] == "router"; });
  write_file(json::array({entry(a, "llamacpp")}));
  const json w = entry_when(a.url(), [](const json& w) {
    return w["kind"] == "llamacpp" && w["load"]["source"] == "slots+metrics";
  });
  EXPECT_EQ(w["load"]["running"], 1);
  // A correction that is itself wrong leaves the worker as it was (the new entry beside it
  // shows the file was read).
  FakeEngine c(Shape::kOpenAi);
  write_file(json::array(
      {{{"url", a.url()}, {"kind", "llamacpp"}, {"role", "boss"}}, entry(c, "openai")}));
  entry_when(c.url(), [](const json& w) { return w["joined"] == true; });
  EXPECT_EQ(worker_entry(a.url())["kind"], "llamacpp");
  EXPECT_EQ(worker_entry(a.url())["id"], w["id"]);
}

TEST_F(WorkerKindsTest, POSTWorkersTakesTheKindsAndRefusesOthersClearly) {
  FakeEngine a(Shape::kLlamaCpp);
  start_router(json::array());
  HttpAnswer r = http_call(port_, "POST", "/workers", entry(a, "llamacpp").dump());
  ASSERT_EQ(r.status, 201) << r.body;
  EXPECT_EQ(json::parse(r.body)["kind"], "llamacpp");
  entry_when(a.url(), [](const json& w) { return w["load"]["source"] == "slots+metrics"; });
  r = http_call(port_, "POST", "/workers",
                json{{"url", "http://127.0.0.1:9"}, {"kind", "llama.cpp"}}.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("unknown worker kind 'llama.cpp'"), std::string::npos) << r.body;
  r = http_call(
      port_, "POST", "/workers",
      json{{"url", "http://127.0.0.1:9"}, {"kind", "openai"}, {"max_running_requests", 8}}.dump());
  EXPECT_EQ(r.status, 201) << r.body;
}

}  // namespace
}  // namespace strata::router
