#include "model/thread_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "common/check.h"

namespace strata {

namespace {

// Spin iterations before a worker (or the caller waiting for the last tasks) sleeps.
// Some tens of microseconds: long enough to bridge the gap between two kernels of one
// forward pass, short enough not to burn a core when the model is idle.
constexpr int kSpinIterations = 20000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(num_threads) {
  STRATA_CHECK_MSG(num_threads >= 1, "a thread pool needs at least one thread");
  workers_.reserve(static_cast<size_t>(num_threads - 1));
  for (int t = 1; t < num_threads; ++t) {
    workers_.emplace_back([this, t] { worker_main(t); });
  }
}

ThreadPool::~ThreadPool() {
  close_job();
  stop_.store(true, std::memory_order_release);
  state_.fetch_add(uint64_t{1} << 32, std::memory_order_acq_rel);  // even: open, stop seen
  state_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void ThreadPool::close_job() {
  // Move from an open (even) generation with no worker inside to the next, odd one:
  // workers never enter an odd generation, so the job fields can then be rewritten.
  uint64_t state = state_.load(std::memory_order_acquire);
  for (;;) {
    if ((state & kActiveMask) != 0) {
      cpu_relax();
      state = state_.load(std::memory_order_acquire);
      continue;
    }
    if (state_.compare_exchange_weak(state, state + (uint64_t{1} << 32), std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
      return;
    }
  }
}

int64_t ThreadPool::work(int thread) {
  int64_t ran = 0;
  for (;;) {
    const int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= num_tasks_) break;
    invoke_(ctx_, task, thread);
    ++ran;
  }
  return ran;
}

void ThreadPool::run_erased(int64_t num_tasks, Invoke invoke, void* ctx) {
  if (num_tasks <= 0) return;
  if (workers_.empty() || num_tasks == 1) {
    for (int64_t task = 0; task < num_tasks; ++task) invoke(ctx, task, 0);
    return;
  }
  // Close the previous job (waiting for a worker that joined it late and found no
  // task left), write the new one, and open it with the next even generation.
  close_job();
  invoke_ = invoke;
  ctx_ = ctx;
  num_tasks_ = num_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  tasks_done_.store(0, std::memory_order_relaxed);
  state_.fetch_add(uint64_t{1} << 32, std::memory_order_release);
  state_.notify_all();
  const int64_t mine = work(0);
  // Wait only for the tasks that workers took, never for a worker to show up.
  const int64_t expected = num_tasks - mine;
  int spins = 0;
  for (;;) {
    const int64_t done = tasks_done_.load(std::memory_order_acquire);
    if (done == expected) break;
    if (++spins < kSpinIterations) {
      cpu_relax();
    } else {
      tasks_done_.wait(done, std::memory_order_acquire);
    }
  }
}

void ThreadPool::worker_main(int thread) {
  uint64_t seen_generation = 0;
  for (;;) {
    int spins = 0;
    uint64_t state = state_.load(std::memory_order_acquire);
    for (;;) {
      const uint64_t generation = state >> 32;
      if (generation != seen_generation && generation % 2 == 0) {
        // An open job we have not run: enter it. The CAS fails if the caller closed it
        // (or another worker entered) meanwhile; then look again.
        if (state_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel,
                                         std::memory_order_acquire)) {
          seen_generation = generation;
          break;
        }
        continue;
      }
      if (++spins < kSpinIterations) {
        cpu_relax();
      } else {
        state_.wait(state, std::memory_order_acquire);
      }
      state = state_.load(std::memory_order_acquire);
    }
    if (stop_.load(std::memory_order_acquire)) {
      state_.fetch_sub(1, std::memory_order_acq_rel);
      return;
    }
    const int64_t ran = work(thread);
    if (ran > 0) {
      tasks_done_.fetch_add(ran, std::memory_order_acq_rel);
      tasks_done_.notify_one();
    }
    state_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace strata
