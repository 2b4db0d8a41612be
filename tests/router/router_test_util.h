// Helpers of the router's tests against fake workers on loopback ports (pd_route_test.cc,
// worker_kinds_route_test.cc): a blocking HTTP call, a bounded wait, the two-token
// tokenizer the router reads prompts of token ids with, and such a prompt.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cctype>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "http/server.h"
#include "text/tokenizer/tokenizer.h"

namespace strata::router {

// Polls `f` every 5 ms until it is true or `within` passed; its last answer.
template <typename F>
bool eventually(F f, std::chrono::milliseconds within = std::chrono::milliseconds(5000)) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < deadline) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return f();
}

struct HttpAnswer {
  int status = 0;
  std::string head;  // status line and headers, names lower-cased
  std::string body;  // as sent (chunked framing left in for streams)

  std::string header(const std::string& name) const {
    const std::string key = "\r\n" + name + ":";
    const size_t p = head.find(key);
    if (p == std::string::npos) return "";
    size_t b = p + key.size();
    while (b < head.size() && head[b] == ' ') ++b;
    return head.substr(b, head.find("\r\n", b) - b);
  }
};

// One request on a fresh blocking connection (Connection: close), 10 s receive timeout.
inline HttpAnswer http_call(int port, const std::string& method, const std::string& target,
                            const std::string& body = "", const std::string& extra_headers = "") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{.tv_sec = 10, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  HttpAnswer out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return out;
  }
  const std::string req = method + " " + target + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" +
                          extra_headers + "Content-Length: " + std::to_string(body.size()) +
                          "\r\n\r\n" + body;
  (void)::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
  std::string all;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    all.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  const size_t end = all.find("\r\n\r\n");
  if (all.size() < 12 || end == std::string::npos) return out;
  out.status = std::stoi(all.substr(9, 3));
  out.head = all.substr(0, end + 2);
  for (char& c : out.head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  out.body = all.substr(end + 4);
  return out;
}

// A fake worker's HTTP server on a free loopback port, one I/O and one worker thread.
inline std::unique_ptr<http::Server> fake_http_server() {
  http::ServerOptions o;
  o.port = 0;
  o.io_threads = 1;
  o.worker_threads = 1;
  return std::make_unique<http::Server>(o);
}

// A tokenizer of two tokens: the tests' prompts are token ids, which it needs not read.
inline std::unique_ptr<Tokenizer> tiny_tokenizer() {
  const nlohmann::json tokenizer = {
      {"model",
       {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}}}, {"merges", nlohmann::json::array()}}},
      {"added_tokens", nlohmann::json::array()},
      {"normalizer", nullptr},
      {"pre_tokenizer", nullptr},
      {"post_processor", nullptr},
      {"decoder", nullptr}};
  auto tok = Tokenizer::from_json_text(tokenizer.dump(), "", "");
  EXPECT_TRUE(tok.has_value()) << tok.error().message;
  return tok ? std::move(*tok) : nullptr;
}

// A completion request whose prompt is `n` token ids starting at `first` (distinct
// prompts share no block).
inline std::string prompt_body(int n, int first, bool stream = false) {
  nlohmann::json ids = nlohmann::json::array();
  for (int i = 0; i < n; ++i) ids.push_back(first + i);
  nlohmann::json body{{"prompt", ids}, {"max_tokens", 1}};
  if (stream) body["stream"] = true;
  return body.dump();
}

}  // namespace strata::router
