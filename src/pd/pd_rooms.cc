#include "pd/pd_rooms.h"

#include <fmt/format.h>
#include <algorithm>
#include <random>
#include <type_traits>
#include <utility>

#include "common/check.h"
#include "common/clock.h"

namespace strata::pd {
namespace {

bool accepting(RoomState s) {
  return s == RoomState::kReserved || s == RoomState::kOrdered;
}

}  // namespace

Status DecodeRoomOptions::validate() const {
  const auto bad = [](const char* what) {
    return make_error(ErrorCode::kInvalidArgument, std::string("PD decode rooms: ") + what);
  };
  if (accept_timeout_ms < 1 || accept_timeout_ms > 600'000) {
    return bad("accept_timeout_ms must be 1..600000");
  }
  if (stall_ms < 1 || stall_ms > 600'000) return bad("stall_ms must be 1..600000");
  if (quarantine_ms < 0 || quarantine_ms > 600'000) return bad("quarantine_ms must be 0..600000");
  if (max_rooms < 1 || max_rooms > (size_t{1} << 24)) return bad("max_rooms must be 1..2^24");
  if (remembered_erased > (size_t{1} << 20)) return bad("remembered_erased must be 0..2^20");
  return {};
}

std::string_view room_state_name(RoomState state) {
  switch (state) {
    case RoomState::kReserved:
      return "reserved";
    case RoomState::kOrdered:
      return "ordered";
    case RoomState::kAccepted:
      return "accepted";
    case RoomState::kTransferring:
      return "transferring";
    case RoomState::kDone:
      return "done";
    case RoomState::kFailed:
      return "failed";
    case RoomState::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

std::string_view room_fail_reason_name(RoomFailReason reason) {
  switch (reason) {
    case RoomFailReason::kAcceptTimeout:
      return "accept_timeout";
    case RoomFailReason::kStalled:
      return "stalled";
    case RoomFailReason::kDeadline:
      return "deadline";
    case RoomFailReason::kPeerDead:
      return "peer_dead";
    case RoomFailReason::kRejected:
      return "rejected";
    case RoomFailReason::kPrefillFailed:
      return "prefill_failed";
    case RoomFailReason::kProtocolError:
      return "protocol_error";
  }
  return "unknown";
}

DecodeRooms::DecodeRooms(DecodeRoomOptions options) : options_(options) {
  const auto valid = options_.validate();
  STRATA_CHECK_MSG(valid.has_value(), valid.error().message);
}

RoomId DecodeRooms::new_room_id() const {
  // std::random_device reads the kernel's entropy (getrandom) on Linux: ids a peer cannot
  // predict from the ones it has seen. Orders are few enough that its cost does not matter.
  std::random_device entropy;
  for (;;) {
    const uint64_t v = (uint64_t{entropy()} << 32) | entropy();
    const RoomId id{v};
    if (v != 0 && !rooms_.contains(id) && !erased_.contains(id)) return id;
  }
}

Status DecodeRooms::open(const PrefillOrder& order, std::string_view prefill_peer, int64_t now_ms) {
  if (auto s = validate_prefill_order(order); !s) return s;
  if (!valid_worker_id(prefill_peer)) {
    return make_error(ErrorCode::kInvalidArgument, "PD decode rooms: invalid prefill worker id");
  }
  if (rooms_.contains(order.room) || erased_.contains(order.room)) {
    return make_error(
        ErrorCode::kFailedPrecondition,
        fmt::format("PD decode rooms: room {:#x} is already in use", room_value(order.room)));
  }
  if (rooms_.size() >= options_.max_rooms) {
    return make_error(ErrorCode::kResourceExhausted,
                      fmt::format("PD decode rooms: {} rooms open", rooms_.size()));
  }
  Room room;
  room.peer = std::string(prefill_peer);
  room.opened_ms = now_ms;
  room.deadline_at_ms = now_ms + order.deadline_ms;
  room.tokens_to_transfer =
      static_cast<uint32_t>(order.tokens.size()) - static_cast<uint32_t>(order.cached_tokens);
  room.landed.assign(order.dst_pages.size(), false);
  note_deadline(room);
  rooms_.emplace(order.room, std::move(room));
  ++stats_.opened;
  return {};
}

Status DecodeRooms::ordered(RoomId id, int64_t now_ms) {
  auto it = rooms_.find(id);
  if (it == rooms_.end()) {
    return make_error(ErrorCode::kNotFound, "PD decode rooms: ordered() for an unknown room");
  }
  Room& room = it->second;
  if (room.state != RoomState::kReserved) {
    return make_error(ErrorCode::kFailedPrecondition,
                      fmt::format("PD decode rooms: ordered() for a room that is {}",
                                  room_state_name(room.state)));
  }
  room.state = RoomState::kOrdered;
  room.ordered_ms = now_ms;
  note_deadline(room);
  return {};
}

Result<CancelOutcome> DecodeRooms::cancel(RoomId id, int64_t now_ms) {
  auto it = rooms_.find(id);
  if (it == rooms_.end()) {
    return make_error(ErrorCode::kNotFound, "PD decode rooms: cancel() for an unknown room");
  }
  Room& room = it->second;
  if (room_state_final(room.state)) {
    return make_error(ErrorCode::kFailedPrecondition,
                      fmt::format("PD decode rooms: cancel() for a room that is {}",
                                  room_state_name(room.state)));
  }
  CancelOutcome out;
  out.send_cancel = room.state != RoomState::kReserved;
  out.reclaimable = room.state == RoomState::kReserved;
  room.state = RoomState::kCancelled;
  room.final_ms = now_ms;
  room.reclaimable = out.reclaimable;
  note_deadline(room);
  ++stats_.cancelled;
  return out;
}

RoomEvent DecodeRooms::fail(RoomId id, Room& room, RoomFailReason reason, std::string message,
                            int64_t now_ms, bool peer_stopped) {
  STRATA_CHECK(!room_state_final(room.state));
  RoomEvent ev;
  ev.kind = RoomEvent::Kind::kFailed;
  ev.room = id;
  ev.peer = room.peer;
  ev.reason = reason;
  ev.message = std::move(message);
  // A Reserved room's order never left: nobody writes its pages.
  const bool never_sent = room.state == RoomState::kReserved;
  ev.send_cancel = !peer_stopped && !never_sent;
  ev.reclaimable = peer_stopped || never_sent;
  room.state = RoomState::kFailed;
  room.fail_reason = reason;
  room.final_ms = now_ms;
  room.reclaimable = ev.reclaimable;
  note_deadline(room);
  ++stats_.failed[static_cast<size_t>(reason)];
  return ev;
}

RoomEvent DecodeRooms::reclaim(RoomId id, Room& room) {
  room.reclaimable = true;
  RoomEvent ev;
  ev.kind = RoomEvent::Kind::kReclaimable;
  ev.room = id;
  ev.peer = room.peer;
  return ev;
}

Result<std::optional<RoomEvent>> DecodeRooms::apply(std::string_view peer, const Message& message,
                                                    int64_t now_ms) {
  const std::optional<RoomId> id = message_room(message);
  if (!id || std::holds_alternative<PrefillOrder>(message) ||
      std::holds_alternative<Cancel>(message)) {
    return make_error(
        ErrorCode::kInvalidArgument,
        fmt::format("PD decode rooms: {} is not for the decode side", message_kind(message)));
  }
  auto it = rooms_.find(*id);
  if (it == rooms_.end()) {
    if (erased_.contains(*id)) {
      ++stats_.late;
      return std::nullopt;
    }
    ++stats_.forged_or_unknown;
    return make_error(ErrorCode::kNotFound,
                      fmt::format("PD decode rooms: {} from {} for unknown room {:#x}",
                                  message_kind(message), peer, room_value(*id)));
  }
  Room& room = it->second;
  if (room.peer != peer) {
    ++stats_.forged_or_unknown;
    return make_error(ErrorCode::kUnauthenticated,
                      fmt::format("PD decode rooms: {} for room {:#x} from {}, ordered from {}",
                                  message_kind(message), room_value(*id), peer, room.peer));
  }
  const bool final = room_state_final(room.state);
  // Late answers to a failed or cancelled room that still waits for the peer to stop: a
  // PrefillFailed, PrefillDone or OrderRejected says it did.
  const auto late_or_reclaim = [&]() -> std::optional<RoomEvent> {
    if (room.state != RoomState::kDone && !room.reclaimable) return reclaim(*id, room);
    ++stats_.late;
    return std::nullopt;
  };

  return std::visit(
      [&](const auto& m) -> Result<std::optional<RoomEvent>> {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, OrderAccepted>) {
          if (final) {
            ++stats_.late;
            return std::nullopt;
          }
          if (!accepting(room.state)) {
            ++stats_.duplicates;
            return std::nullopt;
          }
          room.state = RoomState::kAccepted;
          room.last_progress_ms = now_ms;
          note_deadline(room);
          RoomEvent ev;
          ev.kind = RoomEvent::Kind::kAccepted;
          ev.room = *id;
          ev.peer = room.peer;
          return ev;
        } else if constexpr (std::is_same_v<T, OrderRejected>) {
          if (final) return late_or_reclaim();
          if (!accepting(room.state)) {
            // It took the order and may have written pages: wait for it to stop.
            return fail(*id, room, RoomFailReason::kProtocolError,
                        "the prefill worker rejected an order it had accepted: " + m.reason, now_ms,
                        /*peer_stopped=*/false);
          }
          RoomEvent ev = fail(*id, room, RoomFailReason::kRejected, m.reason, now_ms,
                              /*peer_stopped=*/true);
          ev.retry_after_ms = m.retry_after_ms;
          return ev;
        } else if constexpr (std::is_same_v<T, PagesWritten>) {
          if (final) {
            ++stats_.late;
            return std::nullopt;
          }
          const uint64_t end = uint64_t{m.first_page_index} + m.n_pages;
          if (end > room.landed.size()) {
            return fail(*id, room, RoomFailReason::kProtocolError,
                        fmt::format("pages [{}, {}) written, the order has {}", m.first_page_index,
                                    end, room.landed.size()),
                        now_ms, /*peer_stopped=*/false);
          }
          // Any word from the worker about the room is progress, a repeat included.
          room.last_progress_ms = now_ms;
          const bool implied_accept = accepting(room.state);
          if (implied_accept) room.state = RoomState::kAccepted;
          if (m.n_pages > 0) room.state = RoomState::kTransferring;
          uint32_t newly = 0;
          for (uint64_t p = m.first_page_index; p < end; ++p) {
            if (!room.landed[p]) {
              room.landed[p] = true;
              ++newly;
            }
          }
          room.pages_landed += newly;
          note_deadline(room);
          RoomEvent ev;
          ev.room = *id;
          ev.peer = room.peer;
          if (newly > 0) {
            ev.kind = RoomEvent::Kind::kProgress;
            ev.first_page_index = m.first_page_index;
            ev.n_pages = m.n_pages;
            ev.pages_landed = room.pages_landed;
            return ev;
          }
          if (m.n_pages > 0) ++stats_.duplicates;
          if (implied_accept) {
            ev.kind = RoomEvent::Kind::kAccepted;
            return ev;
          }
          return std::nullopt;
        } else if constexpr (std::is_same_v<T, PrefillDone>) {
          if (final) return late_or_reclaim();
          if (m.tokens_transferred != room.tokens_to_transfer) {
            // It says it is done: nothing more will be written.
            return fail(*id, room, RoomFailReason::kProtocolError,
                        fmt::format("PrefillDone reports {} tokens transferred, the order has {}",
                                    m.tokens_transferred, room.tokens_to_transfer),
                        now_ms, /*peer_stopped=*/true);
          }
          room.state = RoomState::kDone;
          room.final_ms = now_ms;
          room.reclaimable = true;
          room.landed.assign(room.landed.size(), true);
          room.pages_landed = static_cast<uint32_t>(room.landed.size());
          ++stats_.done;
          RoomEvent ev;
          ev.kind = RoomEvent::Kind::kDone;
          ev.room = *id;
          ev.peer = room.peer;
          ev.pages_landed = room.pages_landed;
          ev.done = m;
          return ev;
        } else if constexpr (std::is_same_v<T, PrefillFailed>) {
          if (final) return late_or_reclaim();
          return fail(*id, room, RoomFailReason::kPrefillFailed, m.reason, now_ms,
                      /*peer_stopped=*/true);
        } else {
          return make_error(ErrorCode::kInternal, "PD decode rooms: unhandled message kind");
        }
      },
      message);
}

int64_t DecodeRooms::next_deadline(const Room& room) const {
  if (room_state_final(room.state)) {
    return room.reclaimable ? kNeverMs : room.final_ms + options_.quarantine_ms;
  }
  int64_t d = room.deadline_at_ms;
  if (room.state == RoomState::kOrdered) {
    d = std::min(d, room.ordered_ms + options_.accept_timeout_ms);
  } else if (room.state == RoomState::kAccepted || room.state == RoomState::kTransferring) {
    d = std::min(d, room.last_progress_ms + options_.stall_ms);
  }
  return d;
}

void DecodeRooms::note_deadline(const Room& room) {
  next_check_ms_ = std::min(next_check_ms_, next_deadline(room));
}

std::vector<RoomEvent> DecodeRooms::tick(int64_t now_ms) {
  std::vector<RoomEvent> events;
  if (now_ms < next_check_ms_) return events;
  int64_t next = kNeverMs;
  for (auto& [id, room] : rooms_) {
    if (room_state_final(room.state)) {
      if (!room.reclaimable && now_ms - room.final_ms >= options_.quarantine_ms) {
        events.push_back(reclaim(id, room));
      }
    } else if (now_ms > room.deadline_at_ms) {
      events.push_back(fail(id, room, RoomFailReason::kDeadline,
                            fmt::format("the prefill did not finish within its deadline ({} ms)",
                                        room.deadline_at_ms - room.opened_ms),
                            now_ms, /*peer_stopped=*/false));
    } else if (room.state == RoomState::kOrdered &&
               now_ms - room.ordered_ms > options_.accept_timeout_ms) {
      events.push_back(
          fail(id, room, RoomFailReason::kAcceptTimeout,
               fmt::format("the order was not accepted within {} ms", options_.accept_timeout_ms),
               now_ms, /*peer_stopped=*/false));
    } else if ((room.state == RoomState::kAccepted || room.state == RoomState::kTransferring) &&
               now_ms - room.last_progress_ms > options_.stall_ms) {
      events.push_back(fail(id, room, RoomFailReason::kStalled,
                            fmt::format("no progress for {} ms (stall limit {} ms)",
                                        now_ms - room.last_progress_ms, options_.stall_ms),
                            now_ms, /*peer_stopped=*/false));
    }
    next = std::min(next, next_deadline(room));
  }
  next_check_ms_ = next;
  return events;
}

std::vector<RoomEvent> DecodeRooms::fail_peer(std::string_view peer, int64_t now_ms) {
  std::vector<RoomEvent> events;
  for (auto& [id, room] : rooms_) {
    if (room.peer != peer || room_state_final(room.state)) continue;
    events.push_back(fail(id, room, RoomFailReason::kPeerDead,
                          "the prefill worker " + room.peer + " died or restarted", now_ms,
                          /*peer_stopped=*/false));
  }
  return events;
}

Status DecodeRooms::erase(RoomId id) {
  auto it = rooms_.find(id);
  if (it == rooms_.end()) {
    return make_error(ErrorCode::kNotFound, "PD decode rooms: erase() of an unknown room");
  }
  if (!room_state_final(it->second.state) || !it->second.reclaimable) {
    return make_error(ErrorCode::kFailedPrecondition,
                      fmt::format("PD decode rooms: room {:#x} ({}) may still be written",
                                  room_value(id), room_state_name(it->second.state)));
  }
  rooms_.erase(it);
  remember_erased(id);
  return {};
}

void DecodeRooms::remember_erased(RoomId id) {
  if (options_.remembered_erased == 0) return;
  if (!erased_.insert(id).second) return;
  erased_order_.push_back(id);
  while (erased_order_.size() > options_.remembered_erased) {
    erased_.erase(erased_order_.front());
    erased_order_.pop_front();
  }
}

std::optional<RoomInfo> DecodeRooms::find(RoomId id) const {
  auto it = rooms_.find(id);
  if (it == rooms_.end()) return std::nullopt;
  const Room& r = it->second;
  RoomInfo info;
  info.room = id;
  info.peer = r.peer;
  info.state = r.state;
  info.n_dst_pages = static_cast<uint32_t>(r.landed.size());
  info.pages_landed = r.pages_landed;
  info.reclaimable = r.reclaimable;
  info.fail_reason = r.fail_reason;
  return info;
}

DecodeRoomStats DecodeRooms::stats() const {
  DecodeRoomStats s = stats_;
  s.active = rooms_.size();
  return s;
}

}  // namespace strata::pd
