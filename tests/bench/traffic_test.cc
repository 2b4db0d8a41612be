// The traffic driver and the streaming client against an in-process fake server that
// speaks the chat completions API (SSE with usage), so that what the benchmark records
// can be compared with what was served.
#include "bench/traffic.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench_test_util.h"
#include "http/server.h"

namespace strata::bench {
namespace {

constexpr int kChunks = 5;

std::string sse_event(const nlohmann::json& j) {
  return "data: " + j.dump() + "\n\n";
}

// The events of a streamed completion: the role, kChunks content chunks (sent 2 ms apart),
// the finish reason, the usage, and [DONE].
std::vector<std::string> stream_events(const nlohmann::json& usage) {
  std::vector<std::string> out;
  out.push_back(sse_event({{"choices", {{{"delta", {{"role", "assistant"}, {"content", ""}}}}}}}));
  for (int i = 0; i < kChunks; ++i) {
    // Appended rather than "t" + std::to_string(i): g++ 12 inlines that differently in a
    // unity build and then warns falsely (-Wrestrict, GCC bug 105329).
    std::string content = "t";
    content += std::to_string(i);
    out.push_back(sse_event({{"choices", {{{"delta", {{"content", content}}}}}}}));
  }
  out.push_back(sse_event(
      {{"choices", {{{"delta", nlohmann::json::object()}, {"finish_reason", "length"}}}}}));
  out.push_back(sse_event({{"choices", nlohmann::json::array()}, {"usage", usage}}));
  out.push_back("data: [DONE]\n\n");
  return out;
}

class FakeServer {
 public:
  FakeServer() : server_(options()) {
    server_.route("POST", "/v1/chat/completions",
                  [this](http::Exchange& ex) -> boost::asio::awaitable<void> {
                    const Answer answer = answer_for(ex.request().body);
                    if (!answer.stream) {
                      http::Response r{.body = answer.body};
                      co_await ex.respond(std::move(r));
                      co_return;
                    }
                    if (!co_await ex.begin_stream(200, "text/event-stream")) co_return;
                    const std::chrono::milliseconds gap(2);
                    for (size_t i = 0; i < answer.events.size(); ++i) {
                      // A gap before every content chunk (events 1..kChunks).
                      if (i >= 1 && i <= static_cast<size_t>(kChunks)) co_await ex.sleep(gap);
                      if (!ex.send(answer.events[i])) co_return;
                    }
                    co_await ex.end_stream();
                  });
    const Status bound = server_.bind();
    EXPECT_TRUE(bound.has_value()) << bound.error().message;
    server_.start();
  }
  ~FakeServer() { server_.shutdown(0); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_.port()); }
  int64_t requests() {
    std::lock_guard lock(mutex_);
    return requests_;
  }

 private:
  struct Answer {
    bool stream = false;
    std::string body;                 // when not streaming
    std::vector<std::string> events;  // when streaming
  };

  static http::ServerOptions options() {
    http::ServerOptions o;
    o.port = 0;
    o.io_threads = 2;
    o.worker_threads = 2;
    return o;
  }

  Answer answer_for(const std::string& request_body) {
    const auto body = nlohmann::json::parse(request_body);
    const int64_t messages = static_cast<int64_t>(body["messages"].size());
    {
      std::lock_guard lock(mutex_);
      ++requests_;
      message_counts_.push_back(messages);
    }
    const nlohmann::json usage{{"prompt_tokens", 100 * messages},
                               {"completion_tokens", body["max_tokens"]},
                               {"prompt_tokens_details", {{"cached_tokens", 90 * messages}}},
                               {"cached_tokens_details", {{"device", 90 * messages}}}};
    Answer a;
    a.stream = body.value("stream", false);
    if (a.stream) {
      a.events = stream_events(usage);
    } else {
      a.body = nlohmann::json{{"choices", {{{"message", {{"content", "hi"}}}}}}, {"usage", usage}}
                   .dump();
    }
    return a;
  }

  http::Server server_;
  std::mutex mutex_;
  int64_t requests_ = 0;
  std::vector<int64_t> message_counts_;
};

const ConversationShape kSmall{.system_min_tokens = 20,
                               .system_max_tokens = 30,
                               .user_min_tokens = 5,
                               .user_max_tokens = 10,
                               .assistant_min_tokens = 5,
                               .assistant_max_tokens = 10,
                               .min_turns = 3,
                               .max_turns = 3};

TEST(StreamChatTest, TimesContentChunksAndReadsUsage) {
  FakeServer server;
  ServerClient client(server.url());
  auto r = client.stream_chat(chat_request(
      "m", nlohmann::ordered_json::array({{{"role", "user"}, {"content", "x"}}}), 7, true));
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(r->text, "t0t1t2t3t4");
  ASSERT_EQ(r->content_times_s.size(), static_cast<size_t>(kChunks));
  EXPECT_EQ(r->inter_chunk_s().size(), static_cast<size_t>(kChunks - 1));
  EXPECT_LE(r->ttft_s, r->e2e_s);
  EXPECT_EQ(r->ttft_s, r->content_times_s.front());
  EXPECT_EQ(r->finish_reason, "length");
  EXPECT_EQ(r->usage.prompt_tokens, 100);
  EXPECT_EQ(r->usage.completion_tokens, 7);
  EXPECT_EQ(r->usage.cached.device, 90);
}

TEST(StreamChatTest, ErrorsNameTheStatusAndMessage) {
  FakeServer server;
  ServerClient client(server.url());
  auto missing = client.get_json("/session/kv_meta");
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().code, ErrorCode::kNotFound);
  EXPECT_NE(missing.error().message.find("404"), std::string::npos);
  ServerClient nobody("http://127.0.0.1:9");
  EXPECT_FALSE(nobody.get("/health"));
}

TEST(TrafficRunTest, SendsExactlyTheBudgetTurnByTurn) {
  FakeServer server;
  ConversationSource source(1, "t", kSmall, four_byte_tokens);
  TrafficOptions to;
  to.concurrency = 2;
  to.max_tokens = 4;
  to.stream = true;
  to.max_requests = 7;
  to.model = "m";
  TrafficRun run(ServerClient(server.url()), source, to);
  run.start();
  run.join();
  EXPECT_EQ(run.started(), 7);
  EXPECT_EQ(run.completed(), 7);
  EXPECT_EQ(run.failed(), 0);
  EXPECT_EQ(server.requests(), 7);
  std::map<uint64_t, std::vector<int32_t>> turns;
  for (const RequestRecord& r : run.records()) {
    turns[r.conversation].push_back(r.turn);
    // system + (user, assistant) per earlier turn + the new user turn.
    EXPECT_EQ(r.usage.prompt_tokens, 100 * (2 + 2 * r.turn));
    EXPECT_EQ(r.inter_chunk_s.size(), static_cast<size_t>(kChunks - 1));
  }
  for (const auto& [conversation, list] : turns) {
    for (size_t i = 0; i < list.size(); ++i) EXPECT_EQ(list[i], static_cast<int32_t>(i));
  }
}

TEST(TrafficRunTest, StopsOnRequestAndDrains) {
  FakeServer server;
  ConversationSource source(1, "t", kSmall, four_byte_tokens);
  TrafficOptions to;
  to.concurrency = 3;
  to.model = "m";
  TrafficRun run(ServerClient(server.url()), source, to);
  run.start();
  while (run.completed() < 10) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  run.request_stop();
  run.join();
  EXPECT_EQ(run.completed(), run.started());  // every started request finished
  EXPECT_EQ(server.requests(), run.started());
}

TEST(TrafficRunTest, FailuresStopTheTrafficWithTheFirstError) {
  ConversationSource source(1, "t", kSmall, four_byte_tokens);
  TrafficOptions to;
  to.concurrency = 2;
  to.max_errors = 3;
  TrafficRun run(ServerClient("http://127.0.0.1:9"), source, to);
  run.start();
  run.join();
  EXPECT_GE(run.failed(), 3);
  EXPECT_EQ(run.completed(), 0);
  EXPECT_NE(run.first_error(), "");
}

}  // namespace
}  // namespace strata::bench
