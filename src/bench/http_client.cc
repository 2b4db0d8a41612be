#include "bench/http_client.h"

#include <httplib.h>

#include <chrono>
#include <thread>

namespace strata::bench {

namespace {

using SteadyClock = std::chrono::steady_clock;

double seconds_between(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

int64_t int_or_zero(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number()) return 0;
  return j[key].get<int64_t>();
}

std::string status_error(const std::string& what, int status, const std::string& body) {
  return what + " answered HTTP " + std::to_string(status) + ": " + error_message(body);
}

}  // namespace

std::string error_message(const std::string& body) {
  try {
    const auto j = nlohmann::json::parse(body);
    if (j.contains("error") && j["error"].is_object() && j["error"].contains("message")) {
      return j["error"]["message"].get<std::string>();
    }
  } catch (const nlohmann::json::exception&) {
  }
  return body.size() > 300 ? body.substr(0, 300) + "..." : body;
}

ChatUsage parse_usage(const nlohmann::json& usage) {
  ChatUsage u;
  if (!usage.is_object()) return u;
  u.present = true;
  u.prompt_tokens = int_or_zero(usage, "prompt_tokens");
  u.completion_tokens = int_or_zero(usage, "completion_tokens");
  if (usage.contains("prompt_tokens_details")) {
    u.cached_tokens = int_or_zero(usage["prompt_tokens_details"], "cached_tokens");
  }
  if (usage.contains("cached_tokens_details")) {
    const auto& d = usage["cached_tokens_details"];
    u.cached =
        CachedTiers{int_or_zero(d, "device"), int_or_zero(d, "host"), int_or_zero(d, "storage")};
  }
  return u;
}

std::vector<double> StreamedChat::inter_chunk_s() const {
  std::vector<double> gaps;
  for (size_t i = 1; i < content_times_s.size(); ++i) {
    gaps.push_back(content_times_s[i] - content_times_s[i - 1]);
  }
  return gaps;
}

void SseParser::feed(std::string_view bytes,
                     const std::function<void(std::string_view data)>& on_data) {
  for (char c : bytes) {
    if (c != '\n') {
      line_ += c;
      continue;
    }
    if (!line_.empty() && line_.back() == '\r') line_.pop_back();
    if (line_.empty()) {  // a blank line ends the event
      if (has_data_) on_data(data_);
      data_.clear();
      has_data_ = false;
    } else if (line_.rfind("data:", 0) == 0) {
      std::string_view v(line_);
      v.remove_prefix(5);
      if (!v.empty() && v.front() == ' ') v.remove_prefix(1);
      if (has_data_) data_ += '\n';
      data_ += v;
      has_data_ = true;
    }  // other fields (event:, id:, comments) carry nothing the benchmark needs
    line_.clear();
  }
}

ServerClient::ServerClient(std::string base_url, std::string api_key, double timeout_s)
    : base_url_(std::move(base_url)), api_key_(std::move(api_key)), timeout_s_(timeout_s) {}

namespace {

std::unique_ptr<httplib::Client> make_client(const std::string& base, double timeout_s) {
  auto cli = std::make_unique<httplib::Client>(base);
  cli->set_connection_timeout(10, 0);
  cli->set_tcp_nodelay(true);
  const auto t = static_cast<time_t>(timeout_s);
  cli->set_read_timeout(t, 0);
  cli->set_write_timeout(t, 0);
  return cli;
}

httplib::Headers headers_for(const std::string& api_key) {
  httplib::Headers h;
  if (!api_key.empty()) h.emplace("Authorization", "Bearer " + api_key);
  return h;
}

}  // namespace

Result<HttpResponse> ServerClient::get(const std::string& path) const {
  auto cli = make_client(base_url_, timeout_s_);
  auto res = cli->Get(path, headers_for(api_key_));
  if (!res) {
    return make_error(ErrorCode::kIoError,
                      "GET " + base_url_ + path + " failed: " + httplib::to_string(res.error()));
  }
  return HttpResponse{res->status, res->body};
}

Result<HttpResponse> ServerClient::post(const std::string& path, const nlohmann::json& body) const {
  auto cli = make_client(base_url_, timeout_s_);
  auto res = cli->Post(path, headers_for(api_key_), body.dump(), "application/json");
  if (!res) {
    return make_error(ErrorCode::kIoError,
                      "POST " + base_url_ + path + " failed: " + httplib::to_string(res.error()));
  }
  return HttpResponse{res->status, res->body};
}

namespace {

Result<nlohmann::json> json_of(const std::string& what, const Result<HttpResponse>& r) {
  if (!r) return std::unexpected(r.error());
  if (r->status < 200 || r->status >= 300) {
    return make_error(r->status == 404 ? ErrorCode::kNotFound : ErrorCode::kFailedPrecondition,
                      status_error(what, r->status, r->body));
  }
  try {
    return nlohmann::json::parse(r->body);
  } catch (const nlohmann::json::exception& e) {
    return make_error(ErrorCode::kCorrupt, what + " answered with invalid JSON: " + e.what());
  }
}

}  // namespace

Result<nlohmann::json> ServerClient::get_json(const std::string& path) const {
  return json_of("GET " + path, get(path));
}

Result<nlohmann::json> ServerClient::post_json(const std::string& path,
                                               const nlohmann::json& body) const {
  return json_of("POST " + path, post(path, body));
}

Result<StreamedChat> ServerClient::stream_chat(const nlohmann::ordered_json& body) const {
  auto cli = make_client(base_url_, timeout_s_);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.headers = headers_for(api_key_);
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  req.body = body.dump();

  StreamedChat out;
  int status = 0;
  std::string error_body;
  std::string stream_error;
  SseParser parser;
  const auto start = SteadyClock::now();
  bool first = true;
  auto on_data = [&](std::string_view data) {
    if (data == "[DONE]") return;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(data);
    } catch (const nlohmann::json::exception&) {
      stream_error = "invalid JSON in the event stream: " + std::string(data.substr(0, 200));
      return;
    }
    if (j.contains("error")) {
      stream_error = "the stream carried an error: " + error_message(std::string(data));
      return;
    }
    if (j.contains("usage") && j["usage"].is_object()) out.usage = parse_usage(j["usage"]);
    if (!j.contains("choices") || !j["choices"].is_array()) return;
    for (const auto& choice : j["choices"]) {
      if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
        out.finish_reason = choice["finish_reason"].get<std::string>();
      }
      if (!choice.contains("delta") || !choice["delta"].contains("content") ||
          !choice["delta"]["content"].is_string()) {
        continue;
      }
      const std::string piece = choice["delta"]["content"].get<std::string>();
      if (piece.empty()) continue;
      const double t = seconds_between(start, SteadyClock::now());
      if (first) {
        out.ttft_s = t;
        first = false;
      }
      out.content_times_s.push_back(t);
      out.text += piece;
    }
  };
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (status != 200) {
      error_body.append(data, n);
    } else {
      parser.feed(std::string_view(data, n), on_data);
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  if (!cli->send(req, res, err)) {
    return make_error(ErrorCode::kIoError, "POST " + base_url_ + "/v1/chat/completions failed: " +
                                               httplib::to_string(err));
  }
  out.e2e_s = seconds_between(start, SteadyClock::now());
  if (status != 200) {
    return make_error(status == 404 ? ErrorCode::kNotFound : ErrorCode::kFailedPrecondition,
                      status_error("POST /v1/chat/completions", status, error_body + res.body));
  }
  if (!stream_error.empty()) return make_error(ErrorCode::kFailedPrecondition, stream_error);
  if (first) out.ttft_s = out.e2e_s;  // no content at all: the answer came with the end
  return out;
}

Result<std::pair<ChatUsage, std::string>> ServerClient::chat(
    const nlohmann::ordered_json& body) const {
  auto cli = make_client(base_url_, timeout_s_);
  auto res =
      cli->Post("/v1/chat/completions", headers_for(api_key_), body.dump(), "application/json");
  if (!res) {
    return make_error(ErrorCode::kIoError, "POST " + base_url_ + "/v1/chat/completions failed: " +
                                               httplib::to_string(res.error()));
  }
  auto j = json_of("POST /v1/chat/completions", HttpResponse{res->status, res->body});
  if (!j) return std::unexpected(j.error());
  std::string text;
  if (j->contains("choices") && (*j)["choices"].is_array() && !(*j)["choices"].empty()) {
    const auto& m = (*j)["choices"][0];
    if (m.contains("message") && m["message"].contains("content") &&
        m["message"]["content"].is_string()) {
      text = m["message"]["content"].get<std::string>();
    }
  }
  return std::make_pair(parse_usage(j->value("usage", nlohmann::json())), text);
}

Status ServerClient::wait_healthy(double timeout_s, const std::function<bool()>& alive) const {
  const auto start = SteadyClock::now();
  std::string last = "no answer yet";
  while (seconds_between(start, SteadyClock::now()) < timeout_s) {
    if (alive && !alive()) {
      return make_error(ErrorCode::kFailedPrecondition, "the server exited while starting");
    }
    auto cli = make_client(base_url_, 5);
    auto res = cli->Get("/health");
    if (res && res->status == 200) return {};
    last = res ? "HTTP " + std::to_string(res->status) : httplib::to_string(res.error());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return make_error(ErrorCode::kTimeout, base_url_ + "/health did not answer 200 within " +
                                             std::to_string(static_cast<int>(timeout_s)) +
                                             " s (last: " + last + ")");
}

}  // namespace strata::bench
