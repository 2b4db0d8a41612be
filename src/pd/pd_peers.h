// Liveness of the PD peers (the workers at the other end of the control plane), from their
// Hellos, heartbeats and other messages.
//
// Health is heartbeats only, never a count of failures: a peer is dead once nothing was
// heard from it for more than peer_timeout_ms, and alive again as soon as it is heard
// again. A room that failed (a stall, a rejection) never marks its peer unusable: that
// was seed 003's one-failure blacklist, which shut a worker out for good after one
// transient stall. The caller turns a death into failed rooms (DecodeRooms::fail_peer) or
// released leases (PrefillLeases::on_peer_dead).
//
// A peer is known from its first accepted Hello on. A Hello with another incarnation from a
// known worker id is a restart: the old process's rooms are gone although the id never
// went silent.
//
// Bounds: at most max_peers entries, alive or dead. When a new peer arrives at a full table,
// the dead peer silent the longest is forgotten; with no dead peer the Hello is refused.
//
// Time is the caller's (now_ms from an injected clock), so tests move it by hand. Not
// thread-safe: one owner (the channel's thread) calls everything.
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

struct PeerTableOptions {
  int64_t peer_timeout_ms = 3000;  // silence after which a peer is dead, in [1, 600000]
  size_t max_peers = 1024;         // peers remembered, alive or dead, in [1, 65536]

  Status validate() const;
};

struct PeerInfo {
  std::string worker_id;
  Role role = Role::kDecode;
  uint64_t incarnation = 0;
  bool alive = false;
  int64_t last_heard_ms = 0;
  uint64_t deaths = 0;  // times it went silent or restarted
};

// What an accepted Hello changed.
enum class HelloOutcome {
  kNew,        // first Hello from this worker id
  kRestarted,  // known id, new incarnation: it lost its rooms (alive now)
  kRevived,    // known id, same incarnation, was dead: alive again
  kUnchanged,  // known id, same incarnation, alive
};

// What another message from a worker id means for its liveness.
enum class HeardOutcome {
  kUnknown,  // no Hello accepted from it yet: the caller ignores the message
  kAlive,    // it was alive
  kRevived,  // it was dead and is alive again
};

class PeerTable {
 public:
  explicit PeerTable(PeerTableOptions options);

  // Records a Hello that the caller accepted (role, layout and version already checked).
  // kResourceExhausted when the table is full of live peers.
  Result<HelloOutcome> on_hello(const Hello& hello, int64_t now_ms);
  // Any other message (a heartbeat, a room message) from `worker_id`.
  HeardOutcome on_heard(std::string_view worker_id, int64_t now_ms);
  // Declares a peer dead now (its connection now reaches another worker). False when it was
  // unknown or already dead.
  bool mark_dead(std::string_view worker_id);

  // The live peers silent for more than peer_timeout_ms, now dead; each is listed once
  // per death.
  std::vector<std::string> tick(int64_t now_ms);

  bool alive(std::string_view worker_id) const;
  std::optional<PeerInfo> find(std::string_view worker_id) const;
  std::vector<PeerInfo> list() const;
  size_t size() const { return peers_.size(); }
  size_t alive_count() const;

 private:
  PeerTableOptions options_;
  std::unordered_map<std::string, PeerInfo> peers_;
};

}  // namespace strata::pd
