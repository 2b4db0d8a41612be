// Multi-turn chat traffic: `concurrency` simulated users, each replaying generated
// conversations turn by turn (the history with its scripted replies, then the next user
// turn), as a load generator's multi-turn mode does. Used as the depth-sweep's flood, the
// tool-calls scenario's background and the load scenario's sweep.
//
// Threads: start() runs one worker thread per user; request_stop() and the accessors may
// be called from any thread; join() from the owner. Requests in flight when a stop is
// requested run to their end (the traffic "drains").
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench/conversation.h"
#include "bench/http_client.h"

namespace strata::bench {

struct TrafficOptions {
  int32_t concurrency = 4;          // simultaneous users, >= 1
  int32_t max_tokens = 16;          // generated tokens per request (ignore_eos), >= 1
  bool stream = false;              // stream and time each request (TTFT, inter-chunk gaps)
  int64_t max_requests = 0;         // requests to start in all (0: until request_stop())
  uint64_t first_conversation = 0;  // users take conversations first, first + 1, ...
  std::string model;                // the request's "model"
  int32_t max_errors = 5;           // failed requests before the traffic stops itself
};

struct RequestRecord {
  uint64_t conversation = 0;
  int32_t turn = 0;
  double start_s = 0;  // since the traffic started
  double ttft_s = 0;   // streamed requests only
  double e2e_s = 0;
  std::vector<double> inter_chunk_s;  // streamed requests only
  ChatUsage usage;
};

class TrafficRun {
 public:
  TrafficRun(ServerClient client, ConversationSource& source, TrafficOptions options);
  ~TrafficRun();  // request_stop() and join()
  TrafficRun(const TrafficRun&) = delete;
  TrafficRun& operator=(const TrafficRun&) = delete;

  void start();
  void request_stop();
  void join();

  int64_t started() const { return started_.load(); }
  int64_t completed() const { return completed_.load(); }
  int64_t failed() const { return failed_.load(); }
  bool stopping() const { return stop_.load(); }
  std::string first_error() const;
  std::vector<RequestRecord> records() const;
  double elapsed_s() const;

 private:
  void worker();
  bool run_turn(const Conversation& c, uint64_t index, size_t turn);

  const ServerClient client_;
  ConversationSource& source_;
  const TrafficOptions options_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> started_{0};
  std::atomic<int64_t> completed_{0};
  std::atomic<int64_t> failed_{0};
  std::atomic<uint64_t> next_conversation_{0};
  double start_s_ = 0;
  std::vector<std::thread> workers_;
  mutable std::mutex mutex_;
  std::vector<RequestRecord> records_;  // GUARDED_BY(mutex_)
  std::string first_error_;             // GUARDED_BY(mutex_)
};

// The request body of a chat completion the benchmark sends (greedy, ignore_eos so that
// every request generates exactly max_tokens).
nlohmann::ordered_json chat_request(const std::string& model, nlohmann::ordered_json messages,
                                    int32_t max_tokens, bool stream);

// Seconds on a monotonic clock (shared by the scenarios' timers).
double monotonic_s();

}  // namespace strata::bench
