// A small fork-join pool for the forward pass's kernels. The calling thread takes part
// as thread 0, so a pool of N threads starts N - 1 workers.
//
// Tasks are handed out one at a time from a shared counter, and run() returns as soon
// as every task has finished — it never waits for a worker that has not joined yet.
// On a machine shared with other processes a worker may be descheduled for a whole
// time slice; the caller then simply runs the remaining tasks itself instead of
// stalling every kernel on the slowest thread.
//
// Workers spin briefly after a job (the next kernel usually follows within
// microseconds) and then sleep on a futex, so an idle model costs no CPU.
//
// Thread: run() is called from one thread at a time (the forward pass's caller); it is
// not re-entrant (a task must not call run()).
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

namespace strata {

class ThreadPool {
 public:
  // num_threads >= 1.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(task, thread) for every task in [0, num_tasks), handing tasks out one at a
  // time in increasing order to whichever thread is free; returns when all are done.
  // `thread` is in [0, num_threads()) and identifies per-thread scratch; two tasks
  // with the same `thread` never run at the same time.
  template <typename Fn>
  void run(int64_t num_tasks, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    run_erased(
        num_tasks,
        [](void* ctx, int64_t task, int thread) { (*static_cast<F*>(ctx))(task, thread); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

  // Calls fn(part) once for every part in [0, num_threads()), in parallel: a static
  // split of work into one part per thread. A part may run on any thread (the caller
  // takes several when a worker is slow to wake), so per-part scratch is indexed by
  // `part`, and two parts may run one after the other on the same thread.
  template <typename Fn>
  void run_on_all(Fn&& fn) {
    run(num_threads_, [&fn](int64_t part, int) { fn(static_cast<int>(part)); });
  }

 private:
  using Invoke = void (*)(void* ctx, int64_t task, int thread);

  // state_: job generation in the high 32 bits, workers inside the job in the low 32.
  // An even generation is open (workers may enter it once), an odd one is closed
  // while the caller rewrites the job fields.
  static constexpr uint64_t kActiveMask = 0xffffffffull;

  // Waits until no worker is inside the current job and closes it (odd generation).
  void close_job();

  void run_erased(int64_t num_tasks, Invoke invoke, void* ctx);
  void worker_main(int thread);
  // Runs tasks until none is left; returns how many this thread ran.
  int64_t work(int thread);

  int num_threads_;
  std::vector<std::thread> workers_;

  // The current job: written by run_erased while the generation is odd (closed, no
  // worker inside), published by the bump to the next even generation (release), read
  // by a worker after it has entered that generation (acquire).
  Invoke invoke_ = nullptr;
  void* ctx_ = nullptr;
  int64_t num_tasks_ = 0;
  alignas(64) std::atomic<uint64_t> state_{0};
  alignas(64) std::atomic<int64_t> next_task_{0};
  alignas(64) std::atomic<int64_t> tasks_done_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace strata
