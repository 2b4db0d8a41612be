#include "kvtransfer/storage_page_transport.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "common/clock.h"
#include "kvtransfer/page_runs.h"
#include "kvtransfer/wire_format.h"

namespace strata {

Status StoragePageTransportOptions::validate() const {
  if (pages_per_call < 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("pages_per_call must be >= 1, got {}", pages_per_call));
  }
  return {};
}

uint64_t room_page_key(uint64_t room_id, int32_t index) {
  // A tag of its own keeps these keys apart from block hashes sharing a namespace.
  std::byte bytes[24];
  std::memcpy(bytes, "kvroom\0\0", 8);
  std::memcpy(bytes + 8, &room_id, 8);
  const int64_t i = index;
  std::memcpy(bytes + 16, &i, 8);
  return XXH3_64bits(bytes, sizeof bytes);
}

StoragePageTransport::StoragePageTransport(StorageBackend& backend, KvPool& pool,
                                           const StoragePageTransportOptions& options)
    : backend_(backend), pool_(pool), options_(options) {
  WireWriter w;
  w.pool_shape(pool.shape());
  descriptor_ = frame_wire(WireKind::kStoragePool, w.bytes());
  thread_ = std::thread([this] { run_thread(); });
}

Result<std::unique_ptr<StoragePageTransport>> StoragePageTransport::create(
    StorageBackend& backend, KvPool& pool, const StoragePageTransportOptions& options) {
  if (auto s = options.validate(); !s) return std::unexpected(s.error());
  return std::unique_ptr<StoragePageTransport>(new StoragePageTransport(backend, pool, options));
}

StoragePageTransport::~StoragePageTransport() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

Result<PageDestinationId> StoragePageTransport::open_destination(
    std::span<const std::byte> descriptor) {
  auto payload = unframe_wire(WireKind::kStoragePool, descriptor);
  if (!payload) return std::unexpected(payload.error());
  WireReader r(*payload);
  auto shape = r.pool_shape();
  if (!shape) return std::unexpected(shape.error());
  if (auto f = r.finish("storage pool descriptor"); !f) return std::unexpected(f.error());
  if (auto s = check_page_compatible(pool_.shape(), *shape); !s) {
    return std::unexpected(s.error());
  }
  std::lock_guard lock(mutex_);
  const uint64_t id = next_destination_++;
  destinations_.emplace(id, *shape);
  return PageDestinationId{id};
}

void StoragePageTransport::close_destination(PageDestinationId destination) {
  std::lock_guard lock(mutex_);
  destinations_.erase(static_cast<uint64_t>(destination));
}

Status StoragePageTransport::send(PageDestinationId destination, const PageBatch& batch,
                                  int64_t timeout_ms, TransferDone done) {
  int32_t dst_pages = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = destinations_.find(static_cast<uint64_t>(destination));
    if (it == destinations_.end()) {
      return make_error(ErrorCode::kNotFound, fmt::format("unknown page destination {}",
                                                          static_cast<uint64_t>(destination)));
    }
    dst_pages = it->second.num_pages;
  }
  if (auto s = check_batch_pages(batch, pool_.num_pages(), dst_pages); !s) return s;
  if (timeout_ms < 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("a KV transfer needs a timeout >= 1 ms, got {}", timeout_ms));
  }
  enqueue([this, batch](int64_t deadline_ms) { return write_pages(batch, deadline_ms); },
          timeout_ms, std::move(done));
  return {};
}

Status StoragePageTransport::receive(const PageBatch& batch, int64_t timeout_ms,
                                     TransferDone done) {
  if (auto s = check_batch_pages(batch, -1, pool_.num_pages()); !s) return s;
  if (timeout_ms < 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("a KV transfer needs a timeout >= 1 ms, got {}", timeout_ms));
  }
  enqueue([this, batch](int64_t deadline_ms) { return read_pages(batch, deadline_ms); }, timeout_ms,
          std::move(done));
  return {};
}

void StoragePageTransport::enqueue(std::function<Status(int64_t)> job, int64_t timeout_ms,
                                   TransferDone done) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(
        Job{std::move(job), SteadyClock::instance().now_ms() + timeout_ms, std::move(done)});
  }
  cv_.notify_one();
}

void StoragePageTransport::run_thread() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
      if (stopping_) {
        ++stats_.failures;
        lock.unlock();
        job.done(
            make_error(ErrorCode::kFailedPrecondition, "the storage page transport is shut down"));
        continue;
      }
    }
    Status status = job.work(job.deadline_ms);
    if (!status) {
      std::lock_guard lock(mutex_);
      ++stats_.failures;
    }
    job.done(std::move(status));
  }
}

Status StoragePageTransport::write_pages(const PageBatch& batch, int64_t deadline_ms) {
  const size_t page_bytes = pool_.page_bytes();
  const size_t n = batch.src_pages.size();
  const size_t chunk = static_cast<size_t>(options_.pages_per_call);
  std::vector<std::byte> staging(std::min(n, chunk) * page_bytes);
  for (size_t begin = 0; begin < n; begin += chunk) {
    if (SteadyClock::instance().now_ms() > deadline_ms) {
      return make_error(ErrorCode::kTimeout,
                        fmt::format("room {}: {} of {} pages written to the store when the "
                                    "deadline passed",
                                    batch.room_id, begin, n));
    }
    const size_t count = std::min(chunk, n - begin);
    std::vector<uint64_t> keys(count);
    std::vector<std::span<const std::byte>> values(count);
    for (size_t i = 0; i < count; ++i) {
      std::span<std::byte> buffer(staging.data() + i * page_bytes, page_bytes);
      pool_.copy_page_out(batch.src_pages[begin + i], buffer);
      keys[i] = room_page_key(batch.room_id, batch.first_index + static_cast<int32_t>(begin + i));
      values[i] = buffer;
    }
    const std::vector<Status> results = backend_.set(keys, values);
    for (size_t i = 0; i < count; ++i) {
      if (!results[i]) {
        return make_error(results[i].error().code,
                          fmt::format("room {}: page {} not written to the {} store: {}",
                                      batch.room_id, batch.first_index + begin + i, backend_.name(),
                                      results[i].error().message));
      }
    }
    std::lock_guard lock(mutex_);
    stats_.pages_sent += count;
    stats_.bytes_sent += count * page_bytes;
  }
  return {};
}

Status StoragePageTransport::read_pages(const PageBatch& batch, int64_t deadline_ms) {
  const size_t page_bytes = pool_.page_bytes();
  const size_t n = batch.dst_pages.size();
  const size_t chunk = static_cast<size_t>(options_.pages_per_call);
  std::vector<std::byte> staging(std::min(n, chunk) * page_bytes);
  for (size_t begin = 0; begin < n; begin += chunk) {
    if (SteadyClock::instance().now_ms() > deadline_ms) {
      return make_error(ErrorCode::kTimeout,
                        fmt::format("room {}: {} of {} pages read from the store when the "
                                    "deadline passed",
                                    batch.room_id, begin, n));
    }
    const size_t count = std::min(chunk, n - begin);
    std::vector<uint64_t> keys(count);
    std::vector<std::span<std::byte>> buffers(count);
    for (size_t i = 0; i < count; ++i) {
      keys[i] = room_page_key(batch.room_id, batch.first_index + static_cast<int32_t>(begin + i));
      buffers[i] = std::span<std::byte>(staging.data() + i * page_bytes, page_bytes);
    }
    const std::vector<Status> results = backend_.get(keys, buffers);
    // All of the chunk is checked before any of it goes into the pool, so that a failed
    // read leaves no half-written page behind it in this chunk.
    for (size_t i = 0; i < count; ++i) {
      if (!results[i]) {
        const bool missing = results[i].error().code == ErrorCode::kNotFound;
        return make_error(
            results[i].error().code,
            fmt::format("room {}: page {} {} the {} store: {}", batch.room_id,
                        batch.first_index + begin + i, missing ? "is not in" : "unreadable from",
                        backend_.name(), results[i].error().message));
      }
    }
    for (size_t i = 0; i < count; ++i) pool_.copy_page_in(batch.dst_pages[begin + i], buffers[i]);
    std::lock_guard lock(mutex_);
    stats_.pages_received += count;
    stats_.bytes_received += count * page_bytes;
  }
  return {};
}

StoragePageTransport::Stats StoragePageTransport::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace strata
