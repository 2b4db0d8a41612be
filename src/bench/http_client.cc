#include "bench/http_client.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <thread>
#include <utility>

#include "http/client.h"

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

namespace {

http::ClientOptions client_options(double timeout_s) {
  http::ClientOptions o;
  o.connect_timeout_ms = 10'000;
  const auto timeout_ms = std::max<int64_t>(1, static_cast<int64_t>(timeout_s * 1000));
  o.read_timeout_ms = timeout_ms;
  o.write_timeout_ms = timeout_ms;
  return o;
}

}  // namespace

ServerClient::ServerClient(std::string base_url, std::string api_key, double timeout_s)
    : base_url_(std::move(base_url)),
      api_key_(std::move(api_key)),
      timeout_s_(timeout_s),
      http_(std::make_shared<http::BlockingClient>(client_options(timeout_s))) {
  while (!base_url_.empty() && base_url_.back() == '/') base_url_.pop_back();
}

Result<http::ClientRequest> ServerClient::make_request(const std::string& method,
                                                       const std::string& path,
                                                       std::string body) const {
  http::Headers headers;
  if (!api_key_.empty()) headers.emplace_back("Authorization", "Bearer " + api_key_);
  if (method == "POST") headers.emplace_back("Content-Type", "application/json");
  return http::make_request(method, base_url_ + path, std::move(body), std::move(headers));
}

Result<HttpResponse> ServerClient::get(const std::string& path) const {
  auto req = make_request("GET", path, {});
  if (!req) return std::unexpected(req.error());
  auto res = http_->request(std::move(*req));
  if (!res) return std::unexpected(res.error());
  return HttpResponse{res->status, std::move(res->body)};
}

Result<HttpResponse> ServerClient::post(const std::string& path, const nlohmann::json& body) const {
  auto req = make_request("POST", path, body.dump());
  if (!req) return std::unexpected(req.error());
  auto res = http_->request(std::move(*req));
  if (!res) return std::unexpected(res.error());
  return HttpResponse{res->status, std::move(res->body)};
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

std::string AnswerHead::header(std::string_view name) const {
  auto lower = [](unsigned char c) { return static_cast<char>(std::tolower(c)); };
  for (const auto& [key, value] : headers) {
    if (key.size() == name.size() &&
        std::equal(key.begin(), key.end(), name.begin(),
                   [&](char a, char b) { return lower(a) == lower(b); })) {
      return value;
    }
  }
  return {};
}

Result<StreamedChat> ServerClient::stream_chat(const nlohmann::ordered_json& body,
                                               AnswerHead* head) const {
  return stream_generation("/v1/chat/completions", body, head);
}

Result<StreamedChat> ServerClient::stream_completion(const nlohmann::ordered_json& body,
                                                     AnswerHead* head) const {
  return stream_generation("/v1/completions", body, head);
}

Result<StreamedChat> ServerClient::stream_generation(const std::string& path,
                                                     const nlohmann::ordered_json& body,
                                                     AnswerHead* head) const {
  auto req = make_request("POST", path, body.dump());
  if (!req) return std::unexpected(req.error());
  req->headers.emplace_back("Accept", "text/event-stream");

  // Arrival times are taken on the client's I/O thread as each event completes; the events
  // are parsed afterwards, here, so that JSON work does not delay other streams' timings.
  struct Arrival {
    double t_s;
    std::string data;
  };
  std::vector<Arrival> arrivals;
  const auto start = SteadyClock::now();
  auto res = http_->stream(std::move(*req), [&](std::string_view data) {
    arrivals.push_back(Arrival{seconds_between(start, SteadyClock::now()), std::string(data)});
  });
  if (!res) return std::unexpected(res.error());
  if (head != nullptr) *head = AnswerHead{res->status, res->headers};
  StreamedChat out;
  out.e2e_s = seconds_between(start, SteadyClock::now());
  if (res->status != 200) {
    return make_error(res->status == 404 ? ErrorCode::kNotFound : ErrorCode::kFailedPrecondition,
                      status_error("POST " + path, res->status, res->body));
  }

  std::string stream_error;
  bool first = true;
  for (const Arrival& a : arrivals) {
    const std::string_view data = a.data;
    if (data == "[DONE]") continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(data);
    } catch (const nlohmann::json::exception&) {
      stream_error = "invalid JSON in the event stream: " + std::string(data.substr(0, 200));
      continue;
    }
    if (j.contains("error")) {
      stream_error = "the stream carried an error: " + error_message(a.data);
      continue;
    }
    if (j.contains("usage") && j["usage"].is_object()) out.usage = parse_usage(j["usage"]);
    if (!j.contains("choices") || !j["choices"].is_array()) continue;
    for (const auto& choice : j["choices"]) {
      if (choice.contains("finish_reason") && choice["finish_reason"].is_string()) {
        out.finish_reason = choice["finish_reason"].get<std::string>();
      }
      // A chat chunk's delta.content, a completion chunk's text.
      std::string piece;
      if (choice.contains("delta") && choice["delta"].contains("content") &&
          choice["delta"]["content"].is_string()) {
        piece = choice["delta"]["content"].get<std::string>();
      } else if (choice.contains("text") && choice["text"].is_string()) {
        piece = choice["text"].get<std::string>();
      }
      if (piece.empty()) continue;
      if (first) {
        out.ttft_s = a.t_s;
        first = false;
      }
      out.content_times_s.push_back(a.t_s);
      out.text += piece;
    }
  }
  if (!stream_error.empty()) return make_error(ErrorCode::kFailedPrecondition, stream_error);
  if (first) out.ttft_s = out.e2e_s;  // no content at all: the answer came with the end
  return out;
}

Result<std::pair<ChatUsage, std::string>> ServerClient::chat(
    const nlohmann::ordered_json& body) const {
  auto req = make_request("POST", "/v1/chat/completions", body.dump());
  if (!req) return std::unexpected(req.error());
  auto res = http_->request(std::move(*req));
  if (!res) return std::unexpected(res.error());
  auto j = json_of("POST /v1/chat/completions", HttpResponse{res->status, std::move(res->body)});
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
    auto req = http::make_request("GET", base_url_ + "/health");
    if (!req) return std::unexpected(req.error());
    req->read_timeout_ms = 5'000;
    auto res = http_->request(std::move(*req));
    if (res && res->status == 200) return {};
    last = res ? "HTTP " + std::to_string(res->status) : res.error().message;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return make_error(ErrorCode::kTimeout, base_url_ + "/health did not answer 200 within " +
                                             std::to_string(static_cast<int>(timeout_s)) +
                                             " s (last: " + last + ")");
}

}  // namespace strata::bench
