// The HTTP front end (cpp-httplib): OpenAI-compatible endpoints, tokenize/detokenize,
// health and metrics, and the cache-control API. Handlers parse and validate on the
// HTTP thread, then talk to the engine through submit() and call(); no handler touches
// the tree directly. Every error is {"error": {"message", "type", "code"}} with a 4xx
// for bad input and 5xx only for faults of the server itself; no exception escapes.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/result.h"
#include "engine/engine.h"
#include "model/jinja/chat_template.h"
#include "model/tokenizer/tokenizer.h"
#include "server/metrics.h"

namespace httplib {
class Server;
class Request;
class Response;
}  // namespace httplib

namespace strata {

struct ServerOptions {
  std::string host = "127.0.0.1";  // bind address (loopback unless told otherwise)
  int port = 8000;                 // 0: any free port (see HttpServer::port())
  std::string admin_api_key;       // guards /cache/*, /session/*, /flush_cache when set
  bool auto_tool_offload = false;  // offload a session whose turn ends in a tool call
  std::string model_name = "strata";
  int http_threads = 64;           // concurrent connections served, >= 4
  int64_t default_max_tokens = 0;  // 0: up to the context length
};

// What the server remembers of a conversation sent with a session_id, to keep its exact
// tokens (see docs/sessions.md).
struct SessionRecord {
  size_t num_messages = 0;      // messages that produced `tokens`' prompt
  std::vector<int32_t> tokens;  // prompt + generated + the stop token
  std::string stop_text;        // the stop token's text
  std::string completion_text;  // the generated text (no stop token)
  std::string cache_salt;
};

class HttpServer {
 public:
  // `chat` may be null (a model without a chat template: chat endpoints answer 400).
  HttpServer(ServerOptions options, Engine& engine, const Tokenizer& tokenizer,
             const ChatTemplate* chat, Metrics& metrics);
  ~HttpServer();

  // Binds the port; fails with a clear message when it is taken.
  Status bind();
  int port() const { return port_; }
  // Serves until stop(). Blocking.
  void run();
  void stop();

 private:
  void routes();
  bool authorized(const httplib::Request& req, httplib::Response& res);
  void handle_completions(const httplib::Request& req, httplib::Response& res, bool chat);
  void handle_tokenize(const httplib::Request& req, httplib::Response& res);
  void handle_detokenize(const httplib::Request& req, httplib::Response& res);
  void handle_pin(const httplib::Request& req, httplib::Response& res, bool pin, bool legacy);
  void handle_evict(const httplib::Request& req, httplib::Response& res);
  void handle_flush(const httplib::Request& req, httplib::Response& res);
  void handle_state(const httplib::Request& req, httplib::Response& res);
  void handle_tool_session(const httplib::Request& req, httplib::Response& res, bool start);
  void handle_kv_meta(const httplib::Request& req, httplib::Response& res);
  Result<SessionView> settle_session(const std::string& id, SessionView v);
  void handle_metrics(const httplib::Request& req, httplib::Response& res);

  // Renders and tokenizes messages (with tools, add_generation_prompt) into ids.
  Result<std::vector<int32_t>> chat_tokens(const nlohmann::ordered_json& messages,
                                           const nlohmann::ordered_json* tools,
                                           bool add_generation_prompt,
                                           const nlohmann::ordered_json& template_kwargs) const;
  // The content forms of pin/unpin: block_hashes, token_ids or messages.
  Result<std::vector<BlockHash>> hashes_from_body(const nlohmann::json& body,
                                                  const std::string& raw_body) const;
  ChatRenderOptions render_options(const nlohmann::ordered_json* tools, bool add_generation_prompt,
                                   const nlohmann::ordered_json& template_kwargs) const;

  ServerOptions options_;
  Engine& engine_;
  const Tokenizer& tokenizer_;
  const ChatTemplate* chat_;
  Metrics& metrics_;
  std::unique_ptr<httplib::Server> http_;
  int port_ = 0;

  std::mutex sessions_mutex_;
  std::unordered_map<std::string, SessionRecord> sessions_;  // GUARDED_BY(sessions_mutex_)
};

}  // namespace strata
