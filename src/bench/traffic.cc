#include "bench/traffic.h"

#include <chrono>

#include "bench/server_process.h"

namespace strata::bench {

double monotonic_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

nlohmann::ordered_json chat_request(const std::string& model, nlohmann::ordered_json messages,
                                    int32_t max_tokens, bool stream) {
  nlohmann::ordered_json body{{"model", model},           {"messages", std::move(messages)},
                              {"max_tokens", max_tokens}, {"temperature", 0},
                              {"ignore_eos", true},       {"stream", stream}};
  if (stream) body["stream_options"] = {{"include_usage", true}};
  return body;
}

TrafficRun::TrafficRun(ServerClient client, ConversationSource& source, TrafficOptions options)
    : client_(std::move(client)), source_(source), options_(std::move(options)) {
  next_conversation_.store(options_.first_conversation);
}

TrafficRun::~TrafficRun() {
  request_stop();
  join();
}

void TrafficRun::start() {
  start_s_ = monotonic_s();
  for (int32_t i = 0; i < std::max(options_.concurrency, 1); ++i) {
    workers_.emplace_back([this] { worker(); });
  }
}

void TrafficRun::request_stop() {
  stop_.store(true);
}

void TrafficRun::join() {
  for (std::thread& t : workers_) {
    if (t.joinable()) t.join();
  }
  workers_.clear();
}

std::string TrafficRun::first_error() const {
  std::lock_guard lock(mutex_);
  return first_error_;
}

std::vector<RequestRecord> TrafficRun::records() const {
  std::lock_guard lock(mutex_);
  return records_;
}

double TrafficRun::elapsed_s() const {
  return monotonic_s() - start_s_;
}

void TrafficRun::worker() {
  while (!stop_.load() && !interrupted()) {
    const uint64_t index = next_conversation_.fetch_add(1);
    auto c = source_.get(index);
    if (!c) {
      std::lock_guard lock(mutex_);
      if (first_error_.empty()) first_error_ = "conversation generator: " + c.error().message;
      stop_.store(true);
      return;
    }
    for (size_t turn = 0; turn < (*c)->turns.size(); ++turn) {
      if (stop_.load() || interrupted()) return;
      const int64_t n = started_.fetch_add(1);
      if (options_.max_requests > 0 && n >= options_.max_requests) {
        started_.fetch_sub(1);
        stop_.store(true);
        return;
      }
      if (!run_turn(**c, index, turn)) break;  // a failed turn ends this conversation
    }
  }
}

bool TrafficRun::run_turn(const Conversation& c, uint64_t index, size_t turn) {
  RequestRecord rec;
  rec.conversation = index;
  rec.turn = static_cast<int32_t>(turn);
  rec.start_s = monotonic_s() - start_s_;
  const auto body = chat_request(options_.model, chat_messages(c, turn, true), options_.max_tokens,
                                 options_.stream);
  std::string error;
  if (options_.stream) {
    auto r = client_.stream_chat(body);
    if (r) {
      rec.ttft_s = r->ttft_s;
      rec.e2e_s = r->e2e_s;
      rec.inter_chunk_s = r->inter_chunk_s();
      rec.usage = r->usage;
    } else {
      error = r.error().message;
    }
  } else {
    const double t0 = monotonic_s();
    auto r = client_.chat(body);
    if (r) {
      rec.e2e_s = monotonic_s() - t0;
      rec.usage = r->first;
    } else {
      error = r.error().message;
    }
  }
  std::lock_guard lock(mutex_);
  if (!error.empty()) {
    if (first_error_.empty()) first_error_ = error;
    if (failed_.fetch_add(1) + 1 >= options_.max_errors) stop_.store(true);
    return false;
  }
  records_.push_back(std::move(rec));
  completed_.fetch_add(1);
  return true;
}

}  // namespace strata::bench
