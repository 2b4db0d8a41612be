#include "engine/queue_order.h"

#include <algorithm>

namespace strata {

const char* sched_class_name(SchedClass c) {
  switch (c) {
    case SchedClass::kResume:
      return "resume";
    case SchedClass::kVip:
      return "vip";
    case SchedClass::kNormal:
      return "normal";
  }
  return "normal";
}

double queue_rank(const QueueKey& key, int64_t now_ms, int64_t aging_ms) {
  const double waited = static_cast<double>(std::max<int64_t>(0, now_ms - key.arrival_ms));
  const double aging = static_cast<double>(std::max<int64_t>(1, aging_ms));
  return kClassStep * static_cast<double>(static_cast<int>(key.cls)) +
         static_cast<double>(key.priority) - waited / aging;
}

bool goes_before(const QueueKey& a, const QueueKey& b, int64_t now_ms, int64_t aging_ms) {
  const double ra = queue_rank(a, now_ms, aging_ms);
  const double rb = queue_rank(b, now_ms, aging_ms);
  if (ra != rb) return ra < rb;
  return a.id < b.id;
}

}  // namespace strata
