// The router's bounded, fair queue of requests waiting for a worker, used when every
// eligible worker is saturated (Decision::all_saturated) (docs/router.md, issue 13).
//
// Contract. A data structure: the router's request coroutines push, pop and remove under
// the router's lock; it reads no clock (calls that look at time take now_ms, the
// router's monotonic milliseconds) and wakes no one: the router maps each Ticket to its
// waiting coroutine and resumes the one pop_next() names when capacity frees.
//
// Order. Round-robin across tenants (a tenant is the API key, or the `x-tenant` header;
// "" for anonymous requests), then round-robin across sessions within the tenant (""
// for requests without a session: they share one FIFO), FIFO within a session. A tenant
// or session that becomes non-empty joins the back of its ring. So a tenant with one
// waiting request is admitted within as many pops as there are tenants waiting, however
// many requests another tenant queued, and one agent's fan-out cannot starve another
// session of the same tenant.
//
// Bounds (each refusal is counted in stats(): the metric when a bound bites). At most
// max_entries requests wait in all, at most max_per_tenant per tenant (default: three
// quarters of the queue, so one tenant never fills it all). A refused push is answered 429
// with Retry-After: retry_after_s(). A request waits at most max_wait_ms: expired()
// removes and returns those past it (the router answers them 503 with Retry-After).
#pragma once

#include <array>
#include <cstdint>
#include <expected>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/result.h"

namespace strata::router {

struct AdmissionQueueOptions {
  int64_t max_entries = 256;      // --queue-size: requests waiting in all, >= 1
  int64_t max_per_tenant = 192;   // --queue-per-tenant: per tenant, in [1, max_entries]
  int64_t max_wait_ms = 30'000;   // --queue-timeout-s: longest wait, >= 1 ms
  int64_t min_retry_after_s = 1;  // Retry-After bounds, 1 <= min <= max
  int64_t max_retry_after_s = 60;
};

Status validate(const AdmissionQueueOptions& options);

// An opaque waiting request. Never reused by one queue.
enum class Ticket : uint64_t {};

enum class PushRefusal : uint8_t { kQueueFull, kTenantFull };
std::string_view push_refusal_name(PushRefusal refusal);

struct AdmissionQueueStats {
  uint64_t pushed = 0;
  uint64_t popped = 0;
  uint64_t removed = 0;  // remove(): the client left
  uint64_t expired = 0;  // expired(): waited max_wait_ms
  uint64_t refused_queue_full = 0;
  uint64_t refused_tenant_full = 0;
};

// Retry-After in whole seconds for a client refused when `queued` requests wait and the
// queue admits `dequeues_per_s`: the time for the queue ahead of it to drain, rounded up,
// in [min_s, max_s]; max_s when nothing was admitted recently (no rate to go by).
int64_t estimate_retry_after_s(int64_t queued, double dequeues_per_s, int64_t min_s, int64_t max_s);

class AdmissionQueue {
 public:
  explicit AdmissionQueue(AdmissionQueueOptions options = {});

  // Queues a request; the refusal says which bound bit.
  std::expected<Ticket, PushRefusal> push(std::string_view tenant, std::string_view session,
                                          int64_t now_ms);
  // The request to admit next, removed from the queue; nullopt: empty. now_ms feeds the
  // admission rate behind retry_after_s().
  std::optional<Ticket> pop_next(int64_t now_ms);
  // The client left or timed out; false: not queued (already popped, expired or removed).
  bool remove(Ticket ticket);
  // Removes and returns, oldest first, the requests that have waited max_wait_ms.
  std::vector<Ticket> expired(int64_t now_ms);
  // When the oldest waiting request expires; nullopt: empty (the router's timer).
  std::optional<int64_t> next_expiry_ms() const;

  bool contains(Ticket ticket) const { return entries_.contains(static_cast<uint64_t>(ticket)); }
  int64_t size() const { return static_cast<int64_t>(entries_.size()); }
  int64_t tenant_size(std::string_view tenant) const;
  int64_t tenants() const { return static_cast<int64_t>(tenant_ring_.size()); }

  // Admissions per second over the last rate window (10 s), 0 when none.
  double dequeue_rate_per_s(int64_t now_ms) const;
  // Retry-After for a request refused now (estimate_retry_after_s with this queue).
  int64_t retry_after_s(int64_t now_ms) const;

  const AdmissionQueueStats& stats() const { return stats_; }
  const AdmissionQueueOptions& options() const { return options_; }

 private:
  // Transparent, so that the maps keyed by std::string accept std::string_view lookups.
  struct NameHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  template <typename V>
  using NameMap = absl::flat_hash_map<std::string, V, NameHash, std::equal_to<>>;

  struct Tenant;
  struct Session {
    std::string name;
    Tenant* tenant = nullptr;               // non-owning: the tenant owns its sessions
    std::list<uint64_t> fifo;               // tickets, oldest first
    std::list<Session*>::iterator in_ring;  // in tenant->ring
  };
  struct Tenant {
    std::string name;
    int64_t size = 0;
    NameMap<std::unique_ptr<Session>> sessions;  // non-empty ones
    std::list<Session*> ring;                    // sessions with waiting requests, next first
    std::list<Tenant*>::iterator in_ring;        // in tenant_ring_
  };
  struct Entry {
    Session* session = nullptr;
    std::list<uint64_t>::iterator in_fifo;
    std::list<uint64_t>::iterator in_arrivals;
    int64_t enqueued_ms = 0;
  };

  // Unlinks the entry of `id` from every list, dropping an emptied session and tenant.
  void erase(uint64_t id);
  void record_pop(int64_t now_ms);

  static constexpr int kRateBuckets = 10;  // one per second
  struct RateBucket {
    int64_t second = -1;
    int64_t pops = 0;
  };

  AdmissionQueueOptions options_;
  uint64_t next_id_ = 1;
  absl::flat_hash_map<uint64_t, Entry> entries_;
  NameMap<std::unique_ptr<Tenant>> tenants_;  // non-empty ones
  std::list<Tenant*> tenant_ring_;            // tenants with waiting requests, next first
  std::list<uint64_t> arrivals_;              // every waiting ticket, oldest first (expiry order)
  std::array<RateBucket, kRateBuckets> rate_{};
  AdmissionQueueStats stats_;
};

}  // namespace strata::router
