#include "memory/stream_transfer_engine.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>

#include "common/check.h"
#include "common/log.h"

namespace strata {

namespace {

// Appends a copy, merged into the last one when it continues it on both sides.
void append(std::vector<CopySpan>& out, std::byte* dst, const std::byte* src, size_t bytes) {
  if (!out.empty()) {
    CopySpan& last = out.back();
    if (last.dst + last.bytes == dst && last.src + last.bytes == src) {
      last.bytes += bytes;
      return;
    }
  }
  out.push_back(CopySpan{dst, src, bytes});
}

}  // namespace

StreamTransferEngine::StreamTransferEngine(CopyDevice& device, const KvBlockLayout& device_blocks,
                                           const KvBlockLayout& host_blocks,
                                           StreamTransferOptions options, const Clock& clock)
    : device_(device),
      device_blocks_(device_blocks),
      host_blocks_(host_blocks),
      options_(options),
      clock_(clock) {
  STRATA_CHECK_MSG(device_blocks.num_layers == host_blocks.num_layers &&
                       device_blocks.block_bytes == host_blocks.block_bytes &&
                       device_blocks.num_layers >= 1 && device_blocks.block_bytes > 0,
                   "device pool and host pool have different page shapes");
  STRATA_CHECK(device_blocks.base != nullptr && host_blocks.base != nullptr);
  for (auto& queue : latest_) {
    queue[0].assign(static_cast<size_t>(device_blocks.num_pages), 0);
    queue[1].assign(static_cast<size_t>(host_blocks.num_pages), 0);
  }
}

StreamTransferEngine::~StreamTransferEngine() {
  // The pools' memory is freed after this: no copy may still be writing into it.
  for (auto& [ticket, job] : jobs_) {
    for (CopyEvent e : job.events) {
      while (true) {
        const Result<bool> r = device_.wait(e, options_.stall_timeout_ms);
        if (!r || *r) break;  // failed or landed
        STRATA_LOG_WARN(
            "a KV copy is still in flight after {} ms; waiting for it before its "
            "pools are freed",
            options_.stall_timeout_ms);
      }
      device_.release(e);
    }
  }
  for (auto& [ticket, events] : held_events_) {
    for (CopyEvent e : events) device_.release(e);
  }
}

void StreamTransferEngine::check_job(const TransferJob& job) const {
  STRATA_CHECK_MSG(job.device_pages.size() == job.host_pages.size(),
                   "transfer job with " + std::to_string(job.device_pages.size()) +
                       " device pages and " + std::to_string(job.host_pages.size()) +
                       " host pages");
  for (PageId page : job.device_pages) {
    STRATA_CHECK_MSG(page_index(page) >= 0 && page_index(page) < device_blocks_.num_pages,
                     "transfer job names device page " + std::to_string(page_index(page)));
  }
  for (PageId page : job.host_pages) {
    STRATA_CHECK_MSG(page_index(page) >= 0 && page_index(page) < host_blocks_.num_pages,
                     "transfer job names host page " + std::to_string(page_index(page)));
  }
}

void StreamTransferEngine::check_issued(TransferTicket ticket) const {
  STRATA_CHECK_MSG(ticket >= 1 && ticket < next_ticket_,
                   "transfer ticket " + std::to_string(ticket) + " was never issued");
}

std::vector<CopySpan> StreamTransferEngine::spans(const TransferJob& job, int32_t layer) const {
  const bool to_host = job.direction == TransferDirection::kDeviceToHost;
  const int32_t first = layer < 0 ? 0 : layer;
  const int32_t last = layer < 0 ? device_blocks_.num_layers - 1 : layer;
  std::vector<CopySpan> out;
  out.reserve(job.device_pages.size() * 2 * static_cast<size_t>(last - first + 1));
  for (int32_t l = first; l <= last; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      for (size_t i = 0; i < job.device_pages.size(); ++i) {
        std::byte* dev = device_blocks_.block(l, job.device_pages[i], kv);
        std::byte* host = host_blocks_.block(l, job.host_pages[i], kv);
        if (to_host) {
          append(out, host, dev, device_blocks_.block_bytes);
        } else {
          append(out, dev, host, device_blocks_.block_bytes);
        }
      }
    }
  }
  return out;
}

namespace {

size_t queue_slot(CopyQueue queue) {
  return queue == CopyQueue::kLoad ? 0 : 1;
}

}  // namespace

void StreamTransferEngine::order_after_conflicts(const TransferJob& job, CopyQueue queue,
                                                 Job& into) {
  const auto& other = latest_[1 - queue_slot(queue)];
  std::vector<TransferTicket> conflicts;
  for (int pool = 0; pool < 2; ++pool) {
    for (PageId page : pool == 0 ? job.device_pages : job.host_pages) {
      const TransferTicket t = other[pool][static_cast<size_t>(page_index(page))];
      if (t != 0) conflicts.push_back(t);
    }
  }
  std::sort(conflicts.begin(), conflicts.end());
  conflicts.erase(std::unique(conflicts.begin(), conflicts.end()), conflicts.end());
  for (TransferTicket ticket : conflicts) {  // in submission order
    const Job& before = jobs_.at(ticket);
    const Status s = device_.queue_wait(queue, before.events.back());
    if (!s && !into.error) into.error = s.error().message;
  }
}

void StreamTransferEngine::index_pages(TransferTicket ticket, const Job& job) {
  if (job.events.empty()) return;  // refused outright: it copies nothing
  auto& latest = latest_[queue_slot(job.queue)];
  for (PageId page : job.job.device_pages)
    latest[0][static_cast<size_t>(page_index(page))] = ticket;
  for (PageId page : job.job.host_pages) latest[1][static_cast<size_t>(page_index(page))] = ticket;
}

void StreamTransferEngine::unindex_pages(TransferTicket ticket, const Job& job) {
  auto& latest = latest_[queue_slot(job.queue)];
  for (int pool = 0; pool < 2; ++pool) {
    for (PageId page : pool == 0 ? job.job.device_pages : job.job.host_pages) {
      TransferTicket& t = latest[pool][static_cast<size_t>(page_index(page))];
      if (t == ticket) t = 0;
    }
  }
}

void StreamTransferEngine::enqueue(Job& job, std::span<const CopySpan> batch) {
  if (job.error) return;  // an earlier batch was refused: nothing after it runs
  Result<CopyEvent> e = device_.enqueue(job.queue, batch);
  if (!e) {
    job.error = "the device refused a copy: " + e.error().message;
    return;
  }
  job.events.push_back(*e);
  ++stats_.batches;
  stats_.spans += batch.size();
}

TransferTicket StreamTransferEngine::submit(TransferJob job) {
  check_job(job);
  const TransferTicket ticket = next_ticket_++;
  Job j;
  j.queue =
      job.direction == TransferDirection::kHostToDevice ? CopyQueue::kLoad : CopyQueue::kBackup;
  j.enqueued_ms = clock_.now_ms();
  order_after_conflicts(job, j.queue, j);
  if (j.queue == CopyQueue::kLoad && job.layer_by_layer) {
    for (int32_t l = 0; l < device_blocks_.num_layers; ++l) enqueue(j, spans(job, l));
  } else {
    enqueue(j, spans(job, -1));
  }
  j.job = std::move(job);
  const auto placed = jobs_.emplace(ticket, std::move(j)).first;
  index_pages(ticket, placed->second);
  return ticket;
}

bool StreamTransferEngine::poll(std::map<TransferTicket, Job>::iterator it) {
  Job& job = it->second;
  bool all_resolved = true;
  for (CopyEvent e : job.events) {
    const Result<bool> r = device_.ready(e);
    if (!r) {
      if (!job.error) job.error = "a copy failed: " + r.error().message;
    } else if (!*r) {
      all_resolved = false;
    }
  }
  if (!all_resolved) return false;
  finish(it);
  return true;
}

void StreamTransferEngine::finish(std::map<TransferTicket, Job>::iterator it) {
  Job& job = it->second;
  if (job.compute_hold) {
    // The forward pass may still make its compute wait for them: released at end_layer_wait.
    held_events_[it->first] = std::move(job.events);
  } else {
    for (CopyEvent e : job.events) device_.release(e);
  }
  TransferOutcome out{it->first, TransferResult::kLanded, {}};
  ++stats_.jobs;
  if (job.error) {
    out.result = TransferResult::kFailed;
    out.error = *job.error;
    ++stats_.failed;
  } else {
    const uint64_t pages = job.job.device_pages.size();
    const uint64_t bytes =
        pages * 2 * static_cast<uint64_t>(device_blocks_.num_layers) * device_blocks_.block_bytes;
    if (job.queue == CopyQueue::kBackup) {
      stats_.pages_to_host += pages;
      stats_.bytes_to_host += bytes;
    } else {
      stats_.pages_to_device += pages;
      stats_.bytes_to_device += bytes;
    }
  }
  resolved_.push_back(std::move(out));
  unindex_pages(it->first, job);
  jobs_.erase(it);
}

bool StreamTransferEngine::done(TransferTicket ticket) {
  check_issued(ticket);
  const auto it = jobs_.find(ticket);
  return it == jobs_.end() || poll(it);
}

Status StreamTransferEngine::wait(TransferTicket ticket) {
  check_issued(ticket);
  const auto it = jobs_.find(ticket);
  if (it == jobs_.end()) {
    for (const TransferOutcome& o : resolved_) {
      if (o.ticket == ticket && o.result == TransferResult::kFailed) {
        return make_error(ErrorCode::kInternal, o.error);
      }
    }
    return {};
  }
  for (CopyEvent e : it->second.events) {
    // Bounded by the stall timeout: a copy that hangs leaves the job in flight (reported
    // kStalled by take_completed) and its waiter free. Errors come from ready(), below.
    const int64_t left = it->second.enqueued_ms + options_.stall_timeout_ms - clock_.now_ms();
    const Result<bool> r = device_.wait(e, std::max<int64_t>(left, 0));
    if (r && !*r) {
      return make_error(ErrorCode::kTimeout, "a KV copy is still in flight after " +
                                                 std::to_string(options_.stall_timeout_ms) +
                                                 " ms (stalled)");
    }
  }
  STRATA_CHECK(poll(it));
  const TransferOutcome& out = resolved_.back();
  if (out.result == TransferResult::kFailed) return make_error(ErrorCode::kInternal, out.error);
  return {};
}

Status StreamTransferEngine::wait_layer(TransferTicket ticket, int32_t layer) {
  STRATA_CHECK_MSG(layer >= 0 && layer < device_blocks_.num_layers,
                   "wait_layer for layer " + std::to_string(layer));
  check_issued(ticket);
  const auto it = jobs_.find(ticket);
  if (it == jobs_.end()) return wait(ticket);  // resolved: its outcome only
  const Job& job = it->second;
  if (job.error) return make_error(ErrorCode::kInternal, *job.error);
  const bool per_layer = job.queue == CopyQueue::kLoad && job.job.layer_by_layer;
  const CopyEvent e = per_layer ? job.events[static_cast<size_t>(layer)] : job.events.back();
  return device_.compute_wait(e);
}

std::vector<TransferOutcome> StreamTransferEngine::take_completed() {
  const int64_t now = clock_.now_ms();
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    const auto next = std::next(it);
    if (!poll(it)) {
      Job& job = it->second;
      if (!job.stall_reported && now - job.enqueued_ms >= options_.stall_timeout_ms) {
        job.stall_reported = true;
        ++stats_.stalled;
        resolved_.push_back(TransferOutcome{
            it->first, TransferResult::kStalled,
            "copies in flight for " + std::to_string(now - job.enqueued_ms) + " ms"});
      }
    }
    it = next;
  }
  std::vector<TransferOutcome> out;
  out.swap(resolved_);
  return out;
}

LayerWait StreamTransferEngine::layer_wait(TransferTicket ticket) {
  check_issued(ticket);
  const auto it = jobs_.find(ticket);
  // Resolved (landed: nothing to wait for; failed: the caller learns it from the outcome), or
  // refused before any copy ran.
  if (it == jobs_.end() || it->second.error || it->second.events.empty()) {
    return [](int32_t) { return Status{}; };
  }
  Job& job = it->second;
  STRATA_CHECK_MSG(!job.compute_hold, "a second layer wait for one transfer");
  job.compute_hold = true;
  const bool per_layer = job.queue == CopyQueue::kLoad && job.job.layer_by_layer;
  // The events are the job's until end_layer_wait (finish() keeps them in held_events_), so
  // the forward thread may use this copy of their ids after the job has resolved.
  return [device = &device_, events = job.events, per_layer](int32_t layer) -> Status {
    const size_t last = events.size() - 1;
    const size_t i = per_layer ? std::min(static_cast<size_t>(layer), last) : last;
    return device->compute_wait(events[i]);
  };
}

void StreamTransferEngine::end_layer_wait(TransferTicket ticket) {
  if (const auto held = held_events_.find(ticket); held != held_events_.end()) {
    for (CopyEvent e : held->second) device_.release(e);
    held_events_.erase(held);
    return;
  }
  if (const auto it = jobs_.find(ticket); it != jobs_.end()) it->second.compute_hold = false;
}

}  // namespace strata
