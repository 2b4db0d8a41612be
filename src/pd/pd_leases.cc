#include "pd/pd_leases.h"

#include <fmt/format.h>
#include <algorithm>
#include <utility>

#include "common/check.h"
#include "common/clock.h"

namespace strata::pd {
Status PrefillLeaseOptions::validate() const {
  if (max_leases < 1 || max_leases > (size_t{1} << 20)) {
    return make_error(ErrorCode::kInvalidArgument, "PD leases: max_leases must be 1..2^20");
  }
  return {};
}

std::string_view lease_end_name(LeaseEnd end) {
  switch (end) {
    case LeaseEnd::kReleased:
      return "released";
    case LeaseEnd::kCancelled:
      return "cancelled";
    case LeaseEnd::kPeerDead:
      return "peer_dead";
    case LeaseEnd::kDeadline:
      return "deadline";
  }
  return "unknown";
}

PrefillLeases::PrefillLeases(PrefillLeaseOptions options)
    : options_(options), next_expiry_ms_(kNeverMs) {
  const auto valid = options_.validate();
  STRATA_CHECK_MSG(valid.has_value(), valid.error().message);
}

Status PrefillLeases::acquire(RoomId room, std::string_view peer, LeaseHandle handle,
                              int64_t now_ms, int64_t deadline_ms) {
  if (deadline_ms < 1 || deadline_ms > kMaxDeadlineMs) {
    ++stats_.refused;
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("PD leases: deadline_ms must be 1..{}", kMaxDeadlineMs));
  }
  if (room_value(room) == 0 || !valid_worker_id(peer)) {
    ++stats_.refused;
    return make_error(ErrorCode::kInvalidArgument, "PD leases: room 0 or an invalid peer id");
  }
  if (leases_.contains(room)) {
    ++stats_.refused;
    return make_error(ErrorCode::kFailedPrecondition,
                      fmt::format("PD leases: room {:#x} already has a lease", room_value(room)));
  }
  if (leases_.size() >= options_.max_leases) {
    ++stats_.refused;
    return make_error(ErrorCode::kResourceExhausted,
                      fmt::format("PD leases: {} leases held", leases_.size()));
  }
  Lease lease;
  lease.peer = std::string(peer);
  lease.handle = handle;
  lease.deadline_at_ms = now_ms + deadline_ms;
  next_expiry_ms_ = std::min(next_expiry_ms_, lease.deadline_at_ms);
  leases_.emplace(room, std::move(lease));
  ++stats_.acquired;
  return {};
}

EndedLease PrefillLeases::end(std::unordered_map<RoomId, Lease>::iterator it, LeaseEnd how) {
  EndedLease out;
  out.room = it->first;
  out.peer = std::move(it->second.peer);
  out.handle = it->second.handle;
  out.end = how;
  leases_.erase(it);
  switch (how) {
    case LeaseEnd::kReleased:
      ++stats_.released;
      break;
    case LeaseEnd::kCancelled:
      ++stats_.cancelled;
      break;
    case LeaseEnd::kPeerDead:
      ++stats_.peer_dead;
      break;
    case LeaseEnd::kDeadline:
      ++stats_.expired;
      break;
  }
  return out;
}

Result<EndedLease> PrefillLeases::release(RoomId room) {
  auto it = leases_.find(room);
  if (it == leases_.end()) {
    return make_error(ErrorCode::kNotFound,
                      fmt::format("PD leases: room {:#x} has no lease", room_value(room)));
  }
  return end(it, LeaseEnd::kReleased);
}

Result<EndedLease> PrefillLeases::cancel(std::string_view peer, RoomId room) {
  auto it = leases_.find(room);
  if (it == leases_.end()) {
    ++stats_.forged_or_unknown;
    return make_error(ErrorCode::kNotFound,
                      fmt::format("PD leases: Cancel from {} for room {:#x}, which has no lease",
                                  peer, room_value(room)));
  }
  if (it->second.peer != peer) {
    ++stats_.forged_or_unknown;
    return make_error(ErrorCode::kUnauthenticated,
                      fmt::format("PD leases: Cancel from {} for room {:#x}, ordered by {}", peer,
                                  room_value(room), it->second.peer));
  }
  return end(it, LeaseEnd::kCancelled);
}

std::vector<EndedLease> PrefillLeases::on_peer_dead(std::string_view peer) {
  std::vector<EndedLease> out;
  for (auto it = leases_.begin(); it != leases_.end();) {
    auto next = std::next(it);
    if (it->second.peer == peer) out.push_back(end(it, LeaseEnd::kPeerDead));
    it = next;
  }
  return out;
}

std::vector<EndedLease> PrefillLeases::tick(int64_t now_ms) {
  std::vector<EndedLease> out;
  if (now_ms <= next_expiry_ms_) return out;
  int64_t next = kNeverMs;
  for (auto it = leases_.begin(); it != leases_.end();) {
    auto following = std::next(it);
    if (now_ms > it->second.deadline_at_ms) {
      out.push_back(end(it, LeaseEnd::kDeadline));
    } else {
      next = std::min(next, it->second.deadline_at_ms);
    }
    it = following;
  }
  next_expiry_ms_ = next;
  return out;
}

std::optional<int64_t> PrefillLeases::deadline_of(RoomId room) const {
  auto it = leases_.find(room);
  if (it == leases_.end()) return std::nullopt;
  return it->second.deadline_at_ms;
}

PrefillLeaseStats PrefillLeases::stats() const {
  PrefillLeaseStats s = stats_;
  s.active = leases_.size();
  return s;
}

}  // namespace strata::pd
