#include "router/admission_queue.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/check.h"

namespace strata::router {

Status validate(const AdmissionQueueOptions& o) {
  auto invalid = [](const char* what) {
    return make_error(ErrorCode::kInvalidArgument, std::string("router queue: ") + what);
  };
  if (o.max_entries < 1) return invalid("max_entries must be >= 1");
  if (o.max_per_tenant < 1 || o.max_per_tenant > o.max_entries) {
    return invalid("max_per_tenant not in [1, max_entries]");
  }
  if (o.max_wait_ms < 1) return invalid("max wait must be >= 1 ms");
  if (o.min_retry_after_s < 1 || o.max_retry_after_s < o.min_retry_after_s) {
    return invalid("Retry-After bounds must satisfy 1 <= min <= max");
  }
  return {};
}

std::string_view push_refusal_name(PushRefusal refusal) {
  switch (refusal) {
    case PushRefusal::kQueueFull:
      return "queue_full";
    case PushRefusal::kTenantFull:
      return "tenant_full";
  }
  return "unknown";
}

int64_t estimate_retry_after_s(int64_t queued, double dequeues_per_s, int64_t min_s,
                               int64_t max_s) {
  STRATA_CHECK(min_s >= 1 && max_s >= min_s);
  if (!(dequeues_per_s > 0.0) || !std::isfinite(dequeues_per_s)) return max_s;
  // The refused client would wait behind every queued request and one more slot.
  const double seconds = static_cast<double>(std::max<int64_t>(0, queued) + 1) / dequeues_per_s;
  if (seconds >= static_cast<double>(max_s)) return max_s;
  return std::clamp(static_cast<int64_t>(std::ceil(seconds)), min_s, max_s);
}

AdmissionQueue::AdmissionQueue(AdmissionQueueOptions options) : options_(options) {
  const Status ok = validate(options_);
  STRATA_CHECK_MSG(ok.has_value(), ok ? std::string() : ok.error().message);
}

int64_t AdmissionQueue::tenant_size(std::string_view tenant) const {
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second->size;
}

std::expected<Ticket, PushRefusal> AdmissionQueue::push(std::string_view tenant_name,
                                                        std::string_view session_name,
                                                        int64_t now_ms) {
  if (size() >= options_.max_entries) {
    ++stats_.refused_queue_full;
    return std::unexpected(PushRefusal::kQueueFull);
  }
  if (tenant_size(tenant_name) >= options_.max_per_tenant) {
    ++stats_.refused_tenant_full;
    return std::unexpected(PushRefusal::kTenantFull);
  }

  auto [tenant_it, new_tenant] = tenants_.try_emplace(tenant_name);
  if (new_tenant) {
    tenant_it->second = std::make_unique<Tenant>();
    Tenant* t = tenant_it->second.get();
    t->name = std::string(tenant_name);
    t->in_ring = tenant_ring_.insert(tenant_ring_.end(), t);
  }
  Tenant* tenant = tenant_it->second.get();

  auto [session_it, new_session] = tenant->sessions.try_emplace(session_name);
  if (new_session) {
    session_it->second = std::make_unique<Session>();
    Session* s = session_it->second.get();
    s->name = std::string(session_name);
    s->tenant = tenant;
    s->in_ring = tenant->ring.insert(tenant->ring.end(), s);
  }
  Session* session = session_it->second.get();

  const uint64_t id = next_id_++;
  Entry e;
  e.session = session;
  e.in_fifo = session->fifo.insert(session->fifo.end(), id);
  e.in_arrivals = arrivals_.insert(arrivals_.end(), id);
  e.enqueued_ms = now_ms;
  entries_.emplace(id, e);
  ++tenant->size;
  ++stats_.pushed;
  return static_cast<Ticket>(id);
}

void AdmissionQueue::erase(uint64_t id) {
  auto found = entries_.find(id);
  STRATA_CHECK(found != entries_.end());
  const Entry e = found->second;
  entries_.erase(found);
  arrivals_.erase(e.in_arrivals);
  Session* session = e.session;
  Tenant* tenant = session->tenant;
  session->fifo.erase(e.in_fifo);
  STRATA_CHECK(tenant->size > 0);
  --tenant->size;
  if (session->fifo.empty()) {
    tenant->ring.erase(session->in_ring);
    tenant->sessions.erase(tenant->sessions.find(session->name));  // destroys *session
  }
  if (tenant->size == 0) {
    STRATA_CHECK(tenant->ring.empty());
    tenant_ring_.erase(tenant->in_ring);
    tenants_.erase(tenants_.find(tenant->name));  // destroys *tenant
  }
}

std::optional<Ticket> AdmissionQueue::pop_next(int64_t now_ms) {
  if (tenant_ring_.empty()) return std::nullopt;
  Tenant* tenant = tenant_ring_.front();
  STRATA_CHECK(!tenant->ring.empty());
  Session* session = tenant->ring.front();
  STRATA_CHECK(!session->fifo.empty());
  const uint64_t id = session->fifo.front();
  // Both go to the back of their rings before the erase, which may drop them.
  tenant->ring.splice(tenant->ring.end(), tenant->ring, session->in_ring);
  tenant_ring_.splice(tenant_ring_.end(), tenant_ring_, tenant->in_ring);
  erase(id);
  ++stats_.popped;
  record_pop(now_ms);
  return static_cast<Ticket>(id);
}

bool AdmissionQueue::remove(Ticket ticket) {
  const uint64_t id = static_cast<uint64_t>(ticket);
  if (!entries_.contains(id)) return false;
  erase(id);
  ++stats_.removed;
  return true;
}

std::vector<Ticket> AdmissionQueue::expired(int64_t now_ms) {
  std::vector<Ticket> out;
  while (!arrivals_.empty()) {
    const uint64_t id = arrivals_.front();
    if (now_ms - entries_.at(id).enqueued_ms < options_.max_wait_ms) break;
    erase(id);
    ++stats_.expired;
    out.push_back(static_cast<Ticket>(id));
  }
  return out;
}

std::optional<int64_t> AdmissionQueue::next_expiry_ms() const {
  if (arrivals_.empty()) return std::nullopt;
  return entries_.at(arrivals_.front()).enqueued_ms + options_.max_wait_ms;
}

void AdmissionQueue::record_pop(int64_t now_ms) {
  const int64_t second = now_ms / 1000;
  RateBucket& b = rate_[static_cast<size_t>(second % kRateBuckets)];
  if (b.second != second) b = RateBucket{second, 0};
  ++b.pops;
}

double AdmissionQueue::dequeue_rate_per_s(int64_t now_ms) const {
  // The buckets of the last kRateBuckets whole seconds, the current partial one included.
  const int64_t second = now_ms / 1000;
  int64_t pops = 0;
  for (const RateBucket& b : rate_) {
    if (b.second >= 0 && b.second <= second && second - b.second < kRateBuckets) pops += b.pops;
  }
  return static_cast<double>(pops) / static_cast<double>(kRateBuckets);
}

int64_t AdmissionQueue::retry_after_s(int64_t now_ms) const {
  return estimate_retry_after_s(size(), dequeue_rate_per_s(now_ms), options_.min_retry_after_s,
                                options_.max_retry_after_s);
}

}  // namespace strata::router
