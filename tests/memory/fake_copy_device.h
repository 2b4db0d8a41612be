// A copy device (memory/copy_device.h) whose copies land only when the test says: each
// queue keeps its batches in order, land(queue) runs the next one (a real memcpy of its
// spans), and a batch cannot land before the events its queue was told to wait for. So a
// test sees exactly what a GPU's streams would allow, in the order it chooses, without one.
//
// For an engine's scheduler thread, which polls the device while the test waits for a reply,
// it can also land by itself (set_auto: what can land lands whenever the device is asked),
// fail every batch (fail_all), or land nothing (neither: a stalled device). Every call takes
// one lock, so the test may drive it from its own thread.
//
// It also checks the engine's side of the contract: every event is released exactly once
// and never asked about afterwards, and it records what the compute stream was told to wait
// for.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "memory/copy_device.h"

namespace strata {

class FakeCopyDevice final : public CopyDevice {
 public:
  struct Batch {
    CopyEvent event = 0;
    std::vector<CopySpan> spans;
    std::vector<CopyEvent> after;  // events of the other queue it must wait for
    bool fail = false;             // lands as a failed copy (nothing copied)
  };

  ~FakeCopyDevice() override {
    for (const auto& [event, state] : state_) {
      EXPECT_TRUE(released_.contains(event)) << "event " << event << " never released";
    }
  }

  Result<CopyEvent> enqueue(CopyQueue queue, std::span<const CopySpan> spans) override {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    if (refuse_next_) {
      refuse_next_ = false;
      return make_error(ErrorCode::kInternal, "refused (test)");
    }
    Batch b;
    b.event = next_event_++;
    b.spans.assign(spans.begin(), spans.end());
    b.after = std::move(waits_[q(queue)]);
    waits_[q(queue)].clear();
    b.fail = fail_next_ || fail_all_;
    fail_next_ = false;
    state_[b.event] = State::kQueued;
    queue_of_[b.event] = queue;
    queues_[q(queue)].push_back(std::move(b));
    ++batches_;
    return queues_[q(queue)].back().event;
  }

  Result<bool> ready(CopyEvent event) override {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    check_live(event);
    if (auto_) land_all();
    const State s = state_.at(event);
    if (s == State::kFailed) return make_error(ErrorCode::kInternal, "copy failed (test)");
    return s == State::kLanded;
  }

  // Lands everything up to the event on its queue (and what that waits for), as the device
  // would in time; an error if the event's copy failed. An event of a hung queue (hang())
  // does not land: it sleeps out the timeout (at most 1 s) and answers false, as a copy
  // that is stuck would.
  Result<bool> wait(CopyEvent event, int64_t timeout_ms) override {
    {
      std::lock_guard<std::recursive_mutex> lock(mutex_);
      check_live(event);
      if (!hung_[q(queue_of_.at(event))]) {
        land_through(event);
        return ready(event);
      }
    }
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::clamp<int64_t>(timeout_ms, 0, 1000)));
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    return ready(event);
  }
  // A stuck queue: nothing of it lands (land(), land_all(), auto and wait() pass it by) until
  // hang(queue, false); the other queue goes on.
  void hang(CopyQueue queue, bool on) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    hung_[q(queue)] = on;
  }

  Status queue_wait(CopyQueue queue, CopyEvent event) override {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    check_live(event);
    if (state_.at(event) == State::kQueued) waits_[q(queue)].push_back(event);
    return {};
  }

  // Recorded. In auto mode the event also lands first (unless its queue hangs), as the compute
  // a GPU issues next would start only then: an engine's caller computes on the CPU right
  // after (a hung queue lets it compute over bytes that never came, as a test of the engine's
  // stall handling wants).
  Status compute_wait(CopyEvent event) override {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    check_live(event);
    compute_waits_.push_back(event);
    if (auto_ && !hung_[q(queue_of_.at(event))]) land_through(event);
    return {};
  }

  void release(CopyEvent event) override {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    EXPECT_TRUE(state_.contains(event)) << "event " << event << " never issued";
    EXPECT_TRUE(released_.insert(event).second) << "event " << event << " released twice";
  }

  // Lands the next batch of `queue`: false when it has none, or when it still waits for a
  // batch of the other queue that has not landed.
  bool land(CopyQueue queue) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    std::deque<Batch>& batches = queues_[q(queue)];
    if (batches.empty() || hung_[q(queue)]) return false;
    for (CopyEvent e : batches.front().after) {
      if (state_.at(e) == State::kQueued) return false;
    }
    Batch b = std::move(batches.front());
    batches.pop_front();
    if (!b.fail) {
      for (const CopySpan& s : b.spans) std::memcpy(s.dst, s.src, s.bytes);
    }
    state_[b.event] = b.fail ? State::kFailed : State::kLanded;
    return true;
  }
  // Lands everything that can land, in queue order, alternating queues.
  void land_all() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    while (land(CopyQueue::kLoad) || land(CopyQueue::kBackup)) {
    }
  }

  void refuse_next_enqueue() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    refuse_next_ = true;
  }
  void fail_next_batch() {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    fail_next_ = true;
  }
  // Lands what can land whenever the device is asked (ready, wait), as a real device would.
  void set_auto(bool on) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    auto_ = on;
  }
  // Every batch enqueued from now on fails (copies nothing).
  void fail_all(bool on) {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    fail_all_ = on;
  }

  // (Single-threaded tests only: no lock held while the caller reads them.)
  const std::deque<Batch>& queued(CopyQueue queue) const { return queues_[q(queue)]; }
  const std::vector<CopyEvent>& compute_waits() const { return compute_waits_; }
  // A copy of the compute waits so far, under the lock (an engine's forward thread adds them).
  std::vector<CopyEvent> compute_waits_now() const {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    return compute_waits_;
  }
  // The event's queue (events never released are still known).
  CopyQueue queue_of(CopyEvent event) const {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    return queue_of_.at(event);
  }
  uint64_t batches() const {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    return batches_;
  }
  // Events issued and not released (the engine's in-flight copies).
  size_t live_events() const {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    return state_.size() - released_.size();
  }

 private:
  enum class State { kQueued, kLanded, kFailed };
  static size_t q(CopyQueue queue) { return static_cast<size_t>(queue); }

  void check_live(CopyEvent event) const {
    EXPECT_TRUE(state_.contains(event)) << "event " << event << " never issued";
    EXPECT_FALSE(released_.contains(event)) << "event " << event << " used after release";
  }
  void land_through(CopyEvent event) {
    for (int guard = 0; state_.at(event) == State::kQueued && guard < 1'000'000; ++guard) {
      // Land whichever queue can move; one of them holds the event.
      if (!land(CopyQueue::kLoad) && !land(CopyQueue::kBackup)) {
        ADD_FAILURE() << "event " << event << " can never land";
        return;
      }
    }
  }

  std::deque<Batch> queues_[2];
  std::vector<CopyEvent> waits_[2];
  std::map<CopyEvent, State> state_;
  std::set<CopyEvent> released_;
  std::vector<CopyEvent> compute_waits_;
  CopyEvent next_event_ = 1;
  uint64_t batches_ = 0;
  bool refuse_next_ = false;
  bool hung_[2] = {false, false};
  std::map<CopyEvent, CopyQueue> queue_of_;
  bool fail_next_ = false;
  bool fail_all_ = false;
  bool auto_ = false;
  mutable std::recursive_mutex mutex_;
};

}  // namespace strata
