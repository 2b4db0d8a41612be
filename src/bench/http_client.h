// The benchmark's HTTP client of a Strata (or any OpenAI-compatible) server: JSON calls
// for the control endpoints and streaming chat and plain completions over server-sent
// events, timed the way a user sees them (TTFT from sending the request to the first content
// chunk).
//
// Threads: a ServerClient is immutable and may be shared; its copies share one
// http::BlockingClient (one I/O thread and a keep-alive connection pool), so the load
// generator's user threads each block in their own call while their exchanges run
// concurrently on that thread. Event arrival times are taken there, as each event completes;
// the JSON of the events is parsed afterwards on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/result.h"
#include "http/sse.h"

namespace strata::http {
class BlockingClient;
struct ClientRequest;
}  // namespace strata::http

namespace strata::bench {

struct HttpResponse {
  int status = 0;
  std::string body;
};

struct CachedTiers {
  int64_t device = 0;
  int64_t host = 0;
  int64_t storage = 0;
};

// A completion's `usage`.
struct ChatUsage {
  bool present = false;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt_tokens_details.cached_tokens
  CachedTiers cached;         // cached_tokens_details (zeros when the server omits it)
};

ChatUsage parse_usage(const nlohmann::json& usage);

struct StreamedChat {
  double ttft_s = 0;                    // send -> first non-empty content chunk
  double e2e_s = 0;                     // send -> end of the stream
  std::vector<double> content_times_s;  // arrival of every content chunk, from the send
  std::string text;                     // the concatenated content
  std::string finish_reason;
  ChatUsage usage;
  // Gaps between consecutive content chunks (the inter-token latencies as a client sees
  // them: tokens that arrive in one network read give gaps near 0).
  std::vector<double> inter_chunk_s() const;
};

// The status line and headers of an answer, kept also when its body then failed (a router's
// x-strata-worker of a stream that broke). status 0: no answer came.
struct AnswerHead {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  // The first header of that name (case-insensitive), or "" when absent.
  std::string header(std::string_view name) const;
};

// The server-sent-events splitter (now in the HTTP layer).
using SseParser = http::SseParser;

class ServerClient {
 public:
  // base_url like "http://127.0.0.1:8000"; api_key (may be empty) is sent as a Bearer
  // token; timeout_s bounds each wait for the server's bytes (and each send).
  explicit ServerClient(std::string base_url, std::string api_key = {}, double timeout_s = 1800);

  // Any status; an error only when no HTTP answer came (connection refused, timeout).
  Result<HttpResponse> get(const std::string& path) const;
  Result<HttpResponse> post(const std::string& path, const nlohmann::json& body) const;
  // 2xx with a JSON body, else an error naming the path, the status and the server's message.
  Result<nlohmann::json> get_json(const std::string& path) const;
  Result<nlohmann::json> post_json(const std::string& path, const nlohmann::json& body) const;

  // POSTs /v1/chat/completions with `body` (which must ask for stream and include_usage)
  // and reads the stream to its end.
  // `head`, when given, receives the answer's status and headers whenever one came.
  Result<StreamedChat> stream_chat(const nlohmann::ordered_json& body,
                                   AnswerHead* head = nullptr) const;
  // The same for POST /v1/completions (a prompt of text or token ids): the chunks' text.
  Result<StreamedChat> stream_completion(const nlohmann::ordered_json& body,
                                         AnswerHead* head = nullptr) const;
  // The non-streaming form; returns the usage and the reply text.
  Result<std::pair<ChatUsage, std::string>> chat(const nlohmann::ordered_json& body) const;

  // Polls GET /health until 200, `alive` turns false, or the timeout passes.
  Status wait_healthy(double timeout_s, const std::function<bool()>& alive) const;

  const std::string& base_url() const { return base_url_; }

 private:
  // A request to base_url_ + path with the API key; an error when base_url_ is malformed.
  Result<http::ClientRequest> make_request(const std::string& method, const std::string& path,
                                           std::string body) const;
  // POSTs `path` and reads the stream of chat or completion chunks to its end.
  Result<StreamedChat> stream_generation(const std::string& path,
                                         const nlohmann::ordered_json& body,
                                         AnswerHead* head) const;

  std::string base_url_;
  std::string api_key_;
  double timeout_s_;
  std::shared_ptr<http::BlockingClient> http_;
};

// The error message of an error body ({"error": {"message"}}), or the body itself.
std::string error_message(const std::string& body);

}  // namespace strata::bench
