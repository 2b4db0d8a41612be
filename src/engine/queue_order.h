// The order in which the scheduler admits waiting requests and, when pages run short,
// which running requests it retracts first (docs/scheduling.md).
//
// Each request has a class and a priority. Classes, best first:
//   kResume  the next turn of a tool session that was just restored (or is restoring):
//            its KV is on the device now, and an agent waits on it;
//   kVip     a request whose prompt starts with a block an operator pinned (a hard pin,
//            or a soft pin above the lowest priority: a client's own pins do not count);
//   kNormal  everything else.
// The request's `priority` follows vLLM: lower is served earlier, in [-100, 100], 0 by
// default. The rank is class offset + priority - waited / aging: the lowest rank goes
// first, ties by arrival. A class is worth kClassStep priority points (a full priority
// range), so a better class goes first unless a request of a worse class has waited long
// enough; every request's rank keeps falling while it waits, so none starves (aging_ms
// per point: with 100 ms, a request that waited 20 s has overtaken a full priority range,
// 40 s a class).
#pragma once

#include <cstdint>

namespace strata {

enum class SchedClass : uint8_t { kResume = 0, kVip = 1, kNormal = 2 };
const char* sched_class_name(SchedClass c);

inline constexpr int32_t kMinRequestPriority = -100;
inline constexpr int32_t kMaxRequestPriority = 100;
inline constexpr double kClassStep = 200.0;  // a class is worth a full priority range

struct QueueKey {
  SchedClass cls = SchedClass::kNormal;
  int32_t priority = 0;    // lower first, [kMinRequestPriority, kMaxRequestPriority]
  int64_t arrival_ms = 0;  // the engine clock when the request arrived
  uint64_t id = 0;         // arrival order (ties)
};

// Lower ranks go first. `aging_ms` > 0: milliseconds of waiting worth one priority point.
double queue_rank(const QueueKey& key, int64_t now_ms, int64_t aging_ms);
// Strict weak order: a goes before b.
bool goes_before(const QueueKey& a, const QueueKey& b, int64_t now_ms, int64_t aging_ms);

}  // namespace strata
