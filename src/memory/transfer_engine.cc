#include "memory/transfer_engine.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "common/check.h"

namespace strata {

TransferEngine::TransferEngine(KvPool& device, HostKvPool& host, int32_t num_threads)
    : device_(device), host_(host) {
  STRATA_CHECK_MSG(num_threads >= 1,
                   "transfer engine needs >= 1 copy thread, got " + std::to_string(num_threads));
  const KvPoolShape& d = device.shape();
  const KvPoolShape& h = host.shape();
  STRATA_CHECK_MSG(d.num_layers == h.num_layers && d.num_kv_heads == h.num_kv_heads &&
                       d.head_dim == h.head_dim && d.page_size == h.page_size && d.dtype == h.dtype,
                   "device pool and host pool have different page shapes");
  threads_.reserve(static_cast<size_t>(num_threads));
  for (int32_t i = 0; i < num_threads; ++i) threads_.emplace_back([this] { run_copy_thread(); });
}

TransferEngine::~TransferEngine() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void TransferEngine::check_job(const TransferJob& job) const {
  STRATA_CHECK_MSG(job.device_pages.size() == job.host_pages.size(),
                   "transfer job with " + std::to_string(job.device_pages.size()) +
                       " device pages and " + std::to_string(job.host_pages.size()) +
                       " host pages");
  for (PageId page : job.device_pages) {
    STRATA_CHECK_MSG(device_.is_valid_page(page),
                     "transfer job names device page " + std::to_string(page_index(page)));
  }
  for (PageId page : job.host_pages) {
    STRATA_CHECK_MSG(host_.is_valid_page(page),
                     "transfer job names host page " + std::to_string(page_index(page)));
  }
}

// Caller holds mutex_.
void TransferEngine::check_issued(TransferTicket ticket) const {
  STRATA_CHECK_MSG(ticket >= 1 && ticket < next_ticket_,
                   "transfer ticket " + std::to_string(ticket) + " was never issued");
}

size_t TransferEngine::queue_position(const TransferJob& job) const {
  size_t at = queue_.size();
  if (job.direction != TransferDirection::kHostToDevice) return at;
  // A load goes ahead of the queued backups it does not depend on (a request or an agent
  // waits on a load; a backup only frees pages later), behind other loads.
  while (at > 0) {
    const TransferJob& before = queue_[at - 1].job;
    if (before.direction == TransferDirection::kHostToDevice || shares_a_page(before, job)) break;
    --at;
  }
  return at;
}

TransferTicket TransferEngine::submit(TransferJob job) {
  check_job(job);
  TransferTicket ticket;
  {
    std::lock_guard lock(mutex_);
    ticket = next_ticket_++;
    pending_.emplace(ticket, 0);
    const auto at = static_cast<std::ptrdiff_t>(queue_position(job));
    queue_.insert(queue_.begin() + at, QueuedJob{ticket, std::move(job)});
  }
  work_cv_.notify_one();
  return ticket;
}

bool TransferEngine::done(TransferTicket ticket) const {
  std::lock_guard lock(mutex_);
  check_issued(ticket);
  return !pending_.contains(ticket);
}

void TransferEngine::wait(TransferTicket ticket) {
  std::unique_lock lock(mutex_);
  check_issued(ticket);
  done_cv_.wait(lock, [&] { return !pending_.contains(ticket); });
}

void TransferEngine::wait_layer(TransferTicket ticket, int32_t layer) {
  STRATA_CHECK_MSG(layer >= 0 && layer < host_.shape().num_layers,
                   "wait_layer for layer " + std::to_string(layer));
  std::unique_lock lock(mutex_);
  check_issued(ticket);
  done_cv_.wait(lock, [&] {
    const auto it = pending_.find(ticket);
    return it == pending_.end() || it->second > layer;
  });
}

std::vector<TransferTicket> TransferEngine::take_completed() {
  std::vector<TransferTicket> out;
  std::lock_guard lock(mutex_);
  out.swap(completed_);
  return out;
}

std::vector<TransferOutcome> TransferEngine::take_outcomes() {
  std::vector<TransferOutcome> out;
  for (TransferTicket t : take_completed())
    out.push_back(TransferOutcome{t, TransferResult::kLanded, {}});
  return out;
}

TransferEngine::Stats TransferEngine::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void TransferEngine::run_copy_thread() {
  for (;;) {
    QueuedJob queued;
    {
      std::unique_lock lock(mutex_);
      work_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and every queued job has been taken
      queued = std::move(queue_.front());
      queue_.pop_front();
    }
    const auto start = std::chrono::steady_clock::now();
    execute(queued);
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    finish(queued, elapsed.count());
  }
}

void TransferEngine::execute(const QueuedJob& queued) {
  const TransferJob& job = queued.job;
  if (job.direction == TransferDirection::kDeviceToHost) {
    host_.copy_from_device(device_, job.device_pages, job.host_pages);
    return;
  }
  if (!job.layer_by_layer) {
    host_.copy_to_device(job.host_pages, device_, job.device_pages);
    return;
  }
  for (int32_t layer = 0; layer < host_.shape().num_layers; ++layer) {
    host_.copy_layer_to_device(layer, job.host_pages, device_, job.device_pages);
    {
      std::lock_guard lock(mutex_);
      pending_[queued.ticket] = layer + 1;
    }
    done_cv_.notify_all();
  }
}

void TransferEngine::finish(const QueuedJob& queued, double seconds) {
  const uint64_t pages = queued.job.host_pages.size();
  const uint64_t bytes = pages * host_.page_bytes();
  {
    std::lock_guard lock(mutex_);
    pending_.erase(queued.ticket);
    completed_.push_back(queued.ticket);
    ++stats_.jobs;
    if (queued.job.direction == TransferDirection::kDeviceToHost) {
      stats_.pages_to_host += pages;
      stats_.bytes_to_host += bytes;
    } else {
      stats_.pages_to_device += pages;
      stats_.bytes_to_device += bytes;
    }
    stats_.busy_seconds += seconds;
  }
  done_cv_.notify_all();
}

}  // namespace strata
