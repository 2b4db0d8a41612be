#include "engine/storage_worker.h"

#include <span>

#include "common/check.h"

namespace strata {

StorageWorker::StorageWorker(StorageBackend* backend, HostKvPool* host)
    : backend_(backend), host_(host) {
  STRATA_CHECK(backend_ != nullptr && host_ != nullptr);
  thread_ = std::thread([this] { run(); });
}

StorageWorker::~StorageWorker() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

uint64_t StorageWorker::submit(StorageTask task) {
  uint64_t id;
  {
    std::lock_guard lock(mutex_);
    id = next_id_++;
    task.id = id;
    queue_.push_back(std::move(task));
    ++in_flight_;
  }
  wake_.notify_one();
  return id;
}

std::vector<StorageTaskResult> StorageWorker::take_results() {
  std::lock_guard lock(mutex_);
  std::vector<StorageTaskResult> out;
  out.swap(results_);
  return out;
}

bool StorageWorker::idle() const {
  std::lock_guard lock(mutex_);
  return in_flight_ == 0;
}

void StorageWorker::drain() {
  std::unique_lock lock(mutex_);
  done_.wait(lock, [this] { return in_flight_ == 0; });
}

void StorageWorker::run() {
  for (;;) {
    StorageTask task;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    StorageTaskResult result = execute(task);
    {
      std::lock_guard lock(mutex_);
      results_.push_back(std::move(result));
      --in_flight_;
    }
    done_.notify_all();
  }
}

StorageTaskResult StorageWorker::execute(const StorageTask& task) {
  StorageTaskResult r;
  r.id = task.id;
  r.kind = task.kind;
  r.hashes = task.hashes;
  r.host_pages = task.host_pages;
  const size_t n = task.hashes.size();
  r.ok.assign(n, 0);
  std::vector<uint64_t> keys(task.hashes.begin(), task.hashes.end());
  switch (task.kind) {
    case StorageTask::Kind::kExists: {
      const std::vector<bool> found = backend_->exists(keys);
      while (static_cast<size_t>(r.leading_hits) < found.size() &&
             found[static_cast<size_t>(r.leading_hits)]) {
        r.ok[static_cast<size_t>(r.leading_hits)] = 1;
        ++r.leading_hits;
      }
      break;
    }
    case StorageTask::Kind::kWrite: {
      // Zero-copy where the host layout keeps a page contiguous; a staging copy otherwise.
      std::vector<std::vector<std::byte>> staging;
      std::vector<std::span<const std::byte>> values;
      values.reserve(n);
      for (PageId p : task.host_pages) {
        std::span<const std::byte> view = std::as_const(*host_).page_view(p);
        if (view.empty()) {
          staging.emplace_back(host_->page_bytes());
          host_->read_page(p, staging.back());
          view = staging.back();
        }
        values.push_back(view);
      }
      const std::vector<Status> st = backend_->set(keys, values);
      for (size_t i = 0; i < n; ++i) {
        r.ok[i] = st[i].has_value() ? 1 : 0;
        if (!st[i]) ++r.failures;
      }
      break;
    }
    case StorageTask::Kind::kRead: {
      std::vector<std::vector<std::byte>> staging;
      std::vector<std::span<std::byte>> dst;
      dst.reserve(n);
      for (PageId p : task.host_pages) {
        std::span<std::byte> view = host_->page_view(p);
        if (view.empty()) {
          staging.emplace_back(host_->page_bytes());
          view = staging.back();
        }
        dst.push_back(view);
      }
      const std::vector<Status> st = backend_->get(keys, dst);
      size_t staged = 0;
      for (size_t i = 0; i < n; ++i) {
        const bool direct = !host_->page_view(task.host_pages[i]).empty();
        if (st[i].has_value()) {
          if (!direct) host_->write_page(task.host_pages[i], staging[staged]);
          r.ok[i] = 1;
        } else {
          ++r.failures;
        }
        if (!direct) ++staged;
      }
      break;
    }
  }
  return r;
}

}  // namespace strata
