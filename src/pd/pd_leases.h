// The prefill worker's leases: while it computes and sends a room's pages, the source pages
// (its own KV, usually pinned in its radix cache) must stay put; the lease records that,
// with a deadline, so that nothing holds them forever (docs/pd-disaggregation.md, "Leases").
//
// A lease ends, and its handle is given back to the engine to release, exactly once, when:
//   - the engine ends it: PrefillDone or PrefillFailed was sent (release());
//   - the decode worker that ordered the room sends Cancel (cancel());
//   - that decode worker dies or restarts (on_peer_dead());
//   - its deadline passes (tick()): receipt of the order + the order's deadline_ms.
// No lease outlives its deadline: tick(now_ms) ends every lease whose deadline is before
// now_ms, so a scheduler that ticks each iteration ends it within one iteration.
//
// What the engine does with an ended lease: stop the room's work, abort its transfers (the
// data plane's TransferDone says when UCX holds no reference to the source bytes), then
// release the source pages, and, unless the lease ended by release() after PrefillDone,
// send PrefillFailed to the decode worker, which tells it that no more writes will land
// (its pages become reusable). A transfer's own timeout should not exceed the lease's
// remaining time (deadline_of()), so aborting never waits long.
//
// The handle is opaque here (the engine's receipt for the pinned pages); 0 is allowed.
//
// Refusals. A Cancel for a room whose lease belongs to another decode worker is refused and
// counted (forged_or_unknown); so is one for a room with no lease (it may have ended
// already: the engine still answers PrefillFailed so the decode worker can reuse its pages,
// see the docs). An order for a room id that already has a lease is refused (a repeated
// or forged order).
//
// Thread: not thread-safe; one owner (the engine's scheduler thread) calls everything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/result.h"
#include "pd/pd_messages.h"

namespace strata::pd {

struct PrefillLeaseOptions {
  size_t max_leases = 4'096;  // leases held at once, in [1, 2^20]; more are refused (reject)

  Status validate() const;
};

using LeaseHandle = uint64_t;

enum class LeaseEnd {
  kReleased,   // release(): the engine finished the room (PrefillDone or PrefillFailed sent)
  kCancelled,  // Cancel from the decode worker
  kPeerDead,   // the decode worker died or restarted
  kDeadline,   // the deadline passed
};
std::string_view lease_end_name(LeaseEnd end);

struct EndedLease {
  RoomId room{};
  std::string peer;  // the decode worker
  LeaseHandle handle = 0;
  LeaseEnd end = LeaseEnd::kReleased;
};

struct PrefillLeaseStats {
  uint64_t acquired = 0;
  uint64_t released = 0;
  uint64_t cancelled = 0;
  uint64_t peer_dead = 0;
  uint64_t expired = 0;
  uint64_t refused = 0;            // acquire() refused: duplicate room or table full
  uint64_t forged_or_unknown = 0;  // Cancel for an unknown room or from another peer
  uint64_t active = 0;
};

class PrefillLeases {
 public:
  explicit PrefillLeases(PrefillLeaseOptions options);

  // Records the lease of `room`, ordered by decode worker `peer`, on the pages behind
  // `handle`, until now_ms + deadline_ms (deadline_ms in [1, kMaxDeadlineMs]).
  // kFailedPrecondition when the room already has a lease, kResourceExhausted when
  // max_leases are held (answer OrderRejected), kInvalidArgument for a bad deadline or
  // peer id.
  Status acquire(RoomId room, std::string_view peer, LeaseHandle handle, int64_t now_ms,
                 int64_t deadline_ms);
  // The engine is done with the room. kNotFound when it has no lease (it ended already).
  Result<EndedLease> release(RoomId room);
  // A Cancel from `peer`. kNotFound for a room without a lease, kUnauthenticated when the
  // lease is another peer's; both are counted and change nothing.
  Result<EndedLease> cancel(std::string_view peer, RoomId room);
  // Every lease of `peer` ends.
  std::vector<EndedLease> on_peer_dead(std::string_view peer);
  // Every lease whose deadline is before now_ms ends.
  std::vector<EndedLease> tick(int64_t now_ms);

  // When the lease of `room` expires; nullopt without one.
  std::optional<int64_t> deadline_of(RoomId room) const;
  bool holds(RoomId room) const { return leases_.contains(room); }
  size_t size() const { return leases_.size(); }
  PrefillLeaseStats stats() const;

 private:
  struct Lease {
    std::string peer;
    LeaseHandle handle = 0;
    int64_t deadline_at_ms = 0;
  };
  EndedLease end(std::unordered_map<RoomId, Lease>::iterator it, LeaseEnd how);

  PrefillLeaseOptions options_;
  std::unordered_map<RoomId, Lease> leases_;
  PrefillLeaseStats stats_;
  int64_t next_expiry_ms_;  // no lease expires before this: tick() skips its scan until then
};

}  // namespace strata::pd
