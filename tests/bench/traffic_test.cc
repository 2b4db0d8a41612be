// The traffic driver and the streaming client against an in-process fake server that
// speaks the chat completions API (SSE with usage), so that what the benchmark records
// can be compared with what was served.
#include "bench/traffic.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <map>
#include <mutex>
#include <thread>

namespace strata::bench {
namespace {

constexpr int kChunks = 5;

class FakeServer {
 public:
  FakeServer() {
    svr_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      const auto body = nlohmann::json::parse(req.body);
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
      if (!body.value("stream", false)) {
        res.set_content(
            nlohmann::json{{"choices", {{{"message", {{"content", "hi"}}}}}}, {"usage", usage}}
                .dump(),
            "application/json");
        return;
      }
      res.set_chunked_content_provider("text/event-stream", [usage](size_t,
                                                                    httplib::DataSink& sink) {
        auto sse = [&](const nlohmann::json& j) {
          const std::string s = "data: " + j.dump() + "\n\n";
          sink.write(s.data(), s.size());
        };
        sse({{"choices", {{{"delta", {{"role", "assistant"}, {"content", ""}}}}}}});
        for (int i = 0; i < kChunks; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
          sse({{"choices", {{{"delta", {{"content", "t" + std::to_string(i)}}}}}}});
        }
        sse({{"choices", {{{"delta", nlohmann::json::object()}, {"finish_reason", "length"}}}}});
        sse({{"choices", nlohmann::json::array()}, {"usage", usage}});
        const std::string done = "data: [DONE]\n\n";
        sink.write(done.data(), done.size());
        sink.done();
        return true;
      });
    });
    port_ = svr_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { svr_.listen_after_bind(); });
  }
  ~FakeServer() {
    svr_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int64_t requests() {
    std::lock_guard lock(mutex_);
    return requests_;
  }

 private:
  httplib::Server svr_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  int64_t requests_ = 0;
  std::vector<int64_t> message_counts_;
};

Result<int64_t> four_byte_tokens(std::string_view text) {
  return static_cast<int64_t>((text.size() + 3) / 4);
}

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
