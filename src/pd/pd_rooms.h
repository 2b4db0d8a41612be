// The decode worker's rooms: one per prefill it ordered from a prefill worker, with its
// state, deadlines and the pages that have landed (docs/pd-disaggregation.md, "Rooms").
//
// States and transitions (the message or call that causes each):
//
//   Reserved --ordered()--> Ordered --OrderAccepted--> Accepted --PagesWritten--> Transferring
//      |                       |                          |                          |
//      |                       +------------- PrefillDone (all pages landed) --------+--> Done
//      +-- cancel() --> Cancelled          (from any state before Done)
//      +-- a deadline, OrderRejected, PrefillFailed, peer death, a protocol error --> Failed
//
// A PagesWritten or PrefillDone that arrives while Reserved or Ordered implies the
// acceptance (an OrderAccepted that never came). Done, Failed and Cancelled are final:
// later messages for the room are ignored and counted as late.
//
// Deadlines (a room fails when now exceeds one; "more than", so a silence of exactly the
// limit passes):
//   - overall: deadline_ms of the order, from open();
//   - accept: accept_timeout_ms from ordered() until an OrderAccepted (or progress);
//   - stall: stall_ms from the last sign of progress (OrderAccepted, any PagesWritten, a
//     keep-alive PagesWritten with n_pages == 0 included) while Accepted or Transferring.
//     A stall shorter than stall_ms never fails anything.
//
// Pages. A room's destination pages are the engine's, reserved before open(). They may be
// reused only once the prefill worker can no longer write into them ("reclaimable"):
//   - at once after Done, OrderRejected, PrefillFailed, or a failure before the order was
//     sent;
//   - otherwise (a timeout, a protocol error, the peer's death, cancel()) the engine sends
//     Cancel, and the pages stay quarantined until the prefill worker answers (PrefillFailed
//     or PrefillDone) or quarantine_ms passed, whichever is first: a prefill worker that is
//     merely slow or cut off may still be writing, and a page reused meanwhile would get
//     another request's KV overwritten.
// A kReclaimable event says when; erase() then forgets the room.
//
// Refusals. A message for a room id that is not in the table (and was not erased
// recently), or from another peer than the one the room was ordered from, is refused with
// an error and counted (forged_or_unknown), never applied. A page range outside the
// order's dst_pages from the right peer fails the room (kProtocolError): its writes are
// suspect.
//
// Thread: not thread-safe; one owner (the engine's scheduler thread) calls everything.
// Time is the caller's now_ms (an injected clock). Messages must be applied in the order
// they were received and before tick() is called with a later time, with now_ms = their
// receive time (Inbound::received_ms): a busy scheduler that polls late then never mistakes
// its own delay for the peer's stall.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/result.h"
#include "pd/pd_messages.h"

namespace strata::pd {

struct DecodeRoomOptions {
  int64_t accept_timeout_ms = 5'000;  // ordered() to OrderAccepted, in [1, 600000]
  int64_t stall_ms = 10'000;          // longest silence of an accepted room, in [1, 600000]
  int64_t quarantine_ms = 10'000;     // pages of an unanswered failure stay unused, [0, 600000]
  size_t max_rooms = 65'536;          // rooms in the table (all states), in [1, 2^24]
  size_t remembered_erased = 4'096;   // erased ids kept to tell late from forged, [0, 2^20]

  Status validate() const;
};

enum class RoomState { kReserved, kOrdered, kAccepted, kTransferring, kDone, kFailed, kCancelled };
std::string_view room_state_name(RoomState state);
inline bool room_state_final(RoomState s) {
  return s == RoomState::kDone || s == RoomState::kFailed || s == RoomState::kCancelled;
}

enum class RoomFailReason {
  kAcceptTimeout,  // not accepted within accept_timeout_ms
  kStalled,        // no progress for more than stall_ms
  kDeadline,       // the order's deadline_ms passed
  kPeerDead,       // the prefill worker's heartbeats stopped, or it restarted
  kRejected,       // OrderRejected (overloaded): retry_after_ms says when to try it again
  kPrefillFailed,  // PrefillFailed
  kProtocolError,  // a page range outside the order, a PrefillDone that does not add up
};
inline constexpr size_t kRoomFailReasons = 7;
std::string_view room_fail_reason_name(RoomFailReason reason);

// What the engine learns from apply(), tick(), fail_peer() and cancel().
struct RoomEvent {
  enum class Kind {
    kAccepted,     // the prefill worker took the order
    kProgress,     // pages landed (first_page_index, n_pages: newly landed; pages_landed: all)
    kDone,         // all pages landed, `done` has the first token: decode may start
    kFailed,       // the room failed (reason, message): prefill locally instead
    kReclaimable,  // a failed or cancelled room's pages may now be reused: erase() it
  };
  Kind kind = Kind::kAccepted;
  RoomId room{};
  std::string peer;  // the prefill worker the room was ordered from

  uint32_t first_page_index = 0;  // kProgress
  uint32_t n_pages = 0;           // kProgress
  uint32_t pages_landed = 0;      // kProgress, kDone
  PrefillDone done;               // kDone

  RoomFailReason reason = RoomFailReason::kProtocolError;  // kFailed
  std::string message;                                     // kFailed: for logs and errors
  int64_t retry_after_ms = 0;                              // kFailed with kRejected
  // kFailed: the prefill worker may still be working on the room; send it Cancel (it
  // answers PrefillFailed, which makes the room reclaimable).
  bool send_cancel = false;
  // kFailed: the pages may be reused at once; else a kReclaimable follows.
  bool reclaimable = false;
};

// What cancel() leaves to the engine.
struct CancelOutcome {
  bool send_cancel = false;  // the order went out: send Cancel to the prefill worker
  bool reclaimable = false;  // the pages may be reused at once; else a kReclaimable follows
};

struct RoomInfo {
  RoomId room{};
  std::string peer;
  RoomState state = RoomState::kReserved;
  uint32_t n_dst_pages = 0;
  uint32_t pages_landed = 0;
  bool reclaimable = false;
  std::optional<RoomFailReason> fail_reason;  // kFailed
};

struct DecodeRoomStats {
  uint64_t opened = 0;
  uint64_t done = 0;
  uint64_t cancelled = 0;
  std::array<uint64_t, kRoomFailReasons> failed{};  // by RoomFailReason
  uint64_t forged_or_unknown = 0;                   // refused: unknown room id or another peer
  uint64_t late = 0;                                // ignored: for a final or recently erased room
  uint64_t duplicates = 0;  // ignored: an OrderAccepted or page range seen before
  uint64_t active = 0;      // rooms in the table now
};

class DecodeRooms {
 public:
  explicit DecodeRooms(DecodeRoomOptions options);

  // A fresh room id: 64 bits from the system's entropy source, never 0 and never one in
  // the table or remembered as erased.
  RoomId new_room_id() const;

  // Opens a room (Reserved) for `order`, to be sent to `prefill_peer`; the room keeps what
  // it needs from the order (peer, page count, tokens to transfer, deadline).
  // kInvalidArgument for an order that validate_message refuses, kFailedPrecondition for a
  // room id already in use, kResourceExhausted when max_rooms are open.
  Status open(const PrefillOrder& order, std::string_view prefill_peer, int64_t now_ms);
  // The order was handed to the channel: Reserved -> Ordered, the accept deadline starts.
  // kNotFound for an unknown room, kFailedPrecondition unless Reserved.
  Status ordered(RoomId room, int64_t now_ms);
  // The engine gives up on the room (the request was aborted, or sending the order failed):
  // -> Cancelled. kNotFound for an unknown room, kFailedPrecondition for a final one.
  Result<CancelOutcome> cancel(RoomId room, int64_t now_ms);

  // Applies a message from `peer` received at now_ms. The event it caused, nullopt for a
  // message that changes nothing (late, duplicate). Refused (not applied, counted in
  // forged_or_unknown): kNotFound for an unknown room id, kUnauthenticated for a peer
  // other than the room's. kInvalidArgument for a kind the decode side does not take
  // (Hello, Heartbeat, PrefillOrder, Cancel).
  Result<std::optional<RoomEvent>> apply(std::string_view peer, const Message& message,
                                         int64_t now_ms);

  // Rooms whose deadlines passed (kFailed) and quarantines that ended (kReclaimable).
  std::vector<RoomEvent> tick(int64_t now_ms);
  // The peer died or restarted: every room of it that is not final fails (kPeerDead).
  std::vector<RoomEvent> fail_peer(std::string_view peer, int64_t now_ms);

  // Forgets a reclaimable room (Done, or failed/cancelled and reclaimable); its id is
  // remembered so late messages count as late. kNotFound, or kFailedPrecondition while the
  // room's pages may still be written.
  Status erase(RoomId room);

  std::optional<RoomInfo> find(RoomId room) const;
  size_t size() const { return rooms_.size(); }
  DecodeRoomStats stats() const;

 private:
  struct Room {
    std::string peer;
    RoomState state = RoomState::kReserved;
    int64_t opened_ms = 0;
    int64_t deadline_at_ms = 0;  // opened_ms + order.deadline_ms
    int64_t ordered_ms = 0;      // when Ordered
    int64_t last_progress_ms = 0;
    int64_t final_ms = 0;  // when it became final
    uint32_t tokens_to_transfer = 0;
    std::vector<bool> landed;  // one per dst page
    uint32_t pages_landed = 0;
    bool reclaimable = false;
    std::optional<RoomFailReason> fail_reason;
  };

  // Moves a room that is not final to Failed and describes it. `peer_stopped`: the peer
  // said it no longer writes (OrderRejected, PrefillFailed, a PrefillDone that does not
  // add up), so the pages are reclaimable at once and no Cancel is needed.
  RoomEvent fail(RoomId id, Room& room, RoomFailReason reason, std::string message, int64_t now_ms,
                 bool peer_stopped);
  // The earliest time at which tick() may have something to do for `room`.
  int64_t next_deadline(const Room& room) const;
  void note_deadline(const Room& room);
  RoomEvent reclaim(RoomId id, Room& room);
  void remember_erased(RoomId id);

  DecodeRoomOptions options_;
  std::unordered_map<RoomId, Room> rooms_;
  std::unordered_set<RoomId> erased_;
  std::deque<RoomId> erased_order_;  // oldest first, for the bound
  DecodeRoomStats stats_;
  // No deadline of any room falls before this: tick() skips its scan until then.
  int64_t next_check_ms_ = 0;
};

}  // namespace strata::pd
