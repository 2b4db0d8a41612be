// The decode side's rooms on a manual clock: every transition, every deadline (a stall
// shorter than the limit never fails), refusals of forged and misdirected messages,
// duplicates, quarantine of pages a prefill worker may still write, peer death through the
// heartbeat table, and a randomized run checking that every room ends and no page leaks.
#include "pd/pd_rooms.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "pd/pd_peers.h"

namespace strata::pd {
namespace {

constexpr int64_t kAccept = 1'000;
constexpr int64_t kStall = 2'000;
constexpr int64_t kQuarantine = 3'000;
constexpr int64_t kDeadline = 20'000;

DecodeRoomOptions options() {
  DecodeRoomOptions o;
  o.accept_timeout_ms = kAccept;
  o.stall_ms = kStall;
  o.quarantine_ms = kQuarantine;
  o.max_rooms = 64;
  o.remembered_erased = 16;
  return o;
}

// 40 tokens in pages of 8, the first page cached: dst pages for prompt pages 1..4.
PrefillOrder order(RoomId room, int64_t deadline_ms = kDeadline) {
  PrefillOrder o;
  o.room = room;
  o.decode_worker_id = "decode-0";
  o.tokens.assign(40, 5);
  o.page_size = 8;
  o.cached_tokens = 8;
  o.dst_pages = {10, 11, 12, 13};
  o.transport.kind = TransportKind::kStorage;
  o.transport.storage_prefix = "pd/";
  o.deadline_ms = deadline_ms;
  return o;
}

PrefillDone done(RoomId room, uint32_t tokens = 32) {
  return PrefillDone{room, 42, tokens, 4096, 3};
}

class RoomsTest : public ::testing::Test {
 protected:
  RoomsTest() : rooms_(options()), clock_(1'000'000) {}

  // Opens and orders a room at the current time.
  RoomId open_ordered(const std::string& peer = "prefill-a") {
    const RoomId id = rooms_.new_room_id();
    EXPECT_TRUE(rooms_.open(order(id), peer, now()).has_value());
    EXPECT_TRUE(rooms_.ordered(id, now()).has_value());
    return id;
  }

  std::optional<RoomEvent> apply(const std::string& peer, const Message& m) {
    auto r = rooms_.apply(peer, m, now());
    EXPECT_TRUE(r.has_value()) << r.error().message;
    return r ? *r : std::nullopt;
  }

  RoomState state(RoomId id) { return rooms_.find(id)->state; }
  int64_t now() const { return clock_.now_ms(); }
  void advance(int64_t ms) { clock_.advance_ms(ms); }

  DecodeRooms rooms_;
  ManualClock clock_;
};

TEST_F(RoomsTest, HappyPathToDoneThenErase) {
  const RoomId id = rooms_.new_room_id();
  ASSERT_TRUE(rooms_.open(order(id), "prefill-a", now()).has_value());
  EXPECT_EQ(state(id), RoomState::kReserved);
  ASSERT_TRUE(rooms_.ordered(id, now()).has_value());
  EXPECT_EQ(state(id), RoomState::kOrdered);

  auto ev = apply("prefill-a", OrderAccepted{id});
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->kind, RoomEvent::Kind::kAccepted);
  EXPECT_EQ(state(id), RoomState::kAccepted);

  ev = apply("prefill-a", PagesWritten{id, 0, 2});
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->kind, RoomEvent::Kind::kProgress);
  EXPECT_EQ(ev->pages_landed, 2u);
  EXPECT_EQ(state(id), RoomState::kTransferring);
  ev = apply("prefill-a", PagesWritten{id, 2, 2});
  EXPECT_EQ(ev->pages_landed, 4u);

  ev = apply("prefill-a", done(id));
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->kind, RoomEvent::Kind::kDone);
  EXPECT_EQ(ev->done.first_token, 42);
  EXPECT_EQ(state(id), RoomState::kDone);
  EXPECT_TRUE(rooms_.find(id)->reclaimable);
  EXPECT_TRUE(rooms_.tick(now() + 10 * kDeadline).empty());  // final rooms time out no more

  ASSERT_TRUE(rooms_.erase(id).has_value());
  EXPECT_FALSE(rooms_.find(id));
  // Late messages for an erased room are ignored, not treated as forged.
  EXPECT_FALSE(apply("prefill-a", PagesWritten{id, 0, 1}));
  EXPECT_FALSE(apply("prefill-a", done(id)));
  const auto s = rooms_.stats();
  EXPECT_EQ(s.done, 1u);
  EXPECT_EQ(s.late, 2u);
  EXPECT_EQ(s.forged_or_unknown, 0u);
  EXPECT_EQ(s.active, 0u);
}

TEST_F(RoomsTest, DoneWithoutProgressMessagesImpliesEveryPage) {
  const RoomId id = open_ordered();
  auto ev = apply("prefill-a", done(id));  // no OrderAccepted, no PagesWritten
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->kind, RoomEvent::Kind::kDone);
  EXPECT_EQ(ev->pages_landed, 4u);
}

TEST_F(RoomsTest, AcceptTimeoutFailsAndQuarantinesUntilThePeerAnswers) {
  const RoomId id = open_ordered();
  advance(kAccept);
  EXPECT_TRUE(rooms_.tick(now()).empty());  // exactly the limit: not more than it
  advance(1);
  auto events = rooms_.tick(now());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, RoomEvent::Kind::kFailed);
  EXPECT_EQ(events[0].reason, RoomFailReason::kAcceptTimeout);
  EXPECT_TRUE(events[0].send_cancel);
  EXPECT_FALSE(events[0].reclaimable);
  EXPECT_EQ(rooms_.erase(id).error().code, ErrorCode::kFailedPrecondition);
  // The late acceptance and progress change nothing; the answer to Cancel frees the pages.
  EXPECT_FALSE(apply("prefill-a", OrderAccepted{id}));
  EXPECT_FALSE(apply("prefill-a", PagesWritten{id, 0, 1}));
  auto ack = apply("prefill-a", PrefillFailed{id, "cancelled"});
  ASSERT_TRUE(ack);
  EXPECT_EQ(ack->kind, RoomEvent::Kind::kReclaimable);
  EXPECT_TRUE(rooms_.erase(id).has_value());
  EXPECT_EQ(rooms_.stats().failed[static_cast<size_t>(RoomFailReason::kAcceptTimeout)], 1u);
}

TEST_F(RoomsTest, StallsShorterThanTheLimitNeverFail) {
  const RoomId id = open_ordered();
  apply("prefill-a", OrderAccepted{id});
  // 8 silences, each exactly the limit or just under it, ticking all along: a transfer far
  // longer than stall_ms in total, never failed.
  for (int i = 0; i < 8; ++i) {
    for (int step = 0; step < 4; ++step) {
      advance(kStall / 4);
      EXPECT_TRUE(rooms_.tick(now()).empty()) << "silence " << i;
    }
    if (i % 2 == 0) {
      apply("prefill-a", PagesWritten{id, static_cast<uint32_t>(i / 2), 1});
    } else {
      EXPECT_FALSE(apply("prefill-a", PagesWritten{id, 0, 0}));  // keep-alive
    }
  }
  EXPECT_EQ(state(id), RoomState::kTransferring);
  EXPECT_TRUE(apply("prefill-a", done(id)));
}

TEST_F(RoomsTest, StallLongerThanTheLimitFails) {
  const RoomId id = open_ordered();
  apply("prefill-a", OrderAccepted{id});
  apply("prefill-a", PagesWritten{id, 0, 1});
  advance(kStall + 1);
  auto events = rooms_.tick(now());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].reason, RoomFailReason::kStalled);
  EXPECT_TRUE(events[0].send_cancel);
  EXPECT_EQ(state(id), RoomState::kFailed);
  // Nobody answers the Cancel: the quarantine ends on its own.
  advance(kQuarantine - 1);
  EXPECT_TRUE(rooms_.tick(now()).empty());
  advance(1);
  events = rooms_.tick(now());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, RoomEvent::Kind::kReclaimable);
  EXPECT_TRUE(rooms_.erase(id).has_value());
}

// Progress applied with its receive time, then a tick much later (a busy scheduler that
// polled late): the scheduler's own delay is not the peer's stall.
TEST_F(RoomsTest, LateTickAfterApplyingQueuedProgressDoesNotStall) {
  const RoomId id = open_ordered();
  apply("prefill-a", OrderAccepted{id});
  const int64_t received = now() + kStall - 10;
  ASSERT_TRUE(rooms_.apply("prefill-a", PagesWritten{id, 0, 1}, received).has_value());
  EXPECT_TRUE(rooms_.tick(received + kStall).empty());
  EXPECT_EQ(rooms_.tick(received + kStall + 1).size(), 1u);
}

TEST_F(RoomsTest, OverallDeadlineFailsEvenWithSteadyProgress) {
  const RoomId id = rooms_.new_room_id();
  ASSERT_TRUE(rooms_.open(order(id, 5'000), "prefill-a", now()).has_value());
  ASSERT_TRUE(rooms_.ordered(id, now()).has_value());
  apply("prefill-a", OrderAccepted{id});
  for (int i = 0; i < 5; ++i) {
    advance(1'000);
    EXPECT_TRUE(rooms_.tick(now()).empty());
    apply("prefill-a", PagesWritten{id, 0, 0});
  }
  advance(1);
  auto events = rooms_.tick(now());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].reason, RoomFailReason::kDeadline);
}

TEST_F(RoomsTest, DeadlineOfARoomNeverOrderedFreesItsPagesAtOnce) {
  const RoomId id = rooms_.new_room_id();
  ASSERT_TRUE(rooms_.open(order(id, 100), "prefill-a", now()).has_value());
  advance(101);
  auto events = rooms_.tick(now());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].reason, RoomFailReason::kDeadline);
  EXPECT_FALSE(events[0].send_cancel);
  EXPECT_TRUE(events[0].reclaimable);
  EXPECT_TRUE(rooms_.erase(id).has_value());
}

TEST_F(RoomsTest, CancelBeforeAndAfterTheOrderLeft) {
  const RoomId reserved = rooms_.new_room_id();
  ASSERT_TRUE(rooms_.open(order(reserved), "prefill-a", now()).has_value());
  auto c = rooms_.cancel(reserved, now());
  ASSERT_TRUE(c.has_value());
  EXPECT_FALSE(c->send_cancel);
  EXPECT_TRUE(c->reclaimable);
  EXPECT_TRUE(rooms_.erase(reserved).has_value());

  const RoomId sent = open_ordered();
  apply("prefill-a", OrderAccepted{sent});
  c = rooms_.cancel(sent, now());
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(c->send_cancel);
  EXPECT_FALSE(c->reclaimable);
  EXPECT_EQ(state(sent), RoomState::kCancelled);
  EXPECT_EQ(rooms_.cancel(sent, now()).error().code, ErrorCode::kFailedPrecondition);
  // The prefill worker had finished meanwhile: its PrefillDone also ends the quarantine.
  auto ev = apply("prefill-a", done(sent));
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->kind, RoomEvent::Kind::kReclaimable);
  EXPECT_EQ(state(sent), RoomState::kCancelled);
  EXPECT_TRUE(rooms_.erase(sent).has_value());
  EXPECT_EQ(rooms_.stats().cancelled, 2u);
}

TEST_F(RoomsTest, ForgedRoomIdsAndOtherPeersAreRefusedAndCounted) {
  const RoomId id = open_ordered("prefill-a");
  const RoomId forged{room_value(id) ^ 1};
  auto r = rooms_.apply("prefill-a", PagesWritten{forged, 0, 1}, now());
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, ErrorCode::kNotFound);

  for (const Message& m : std::vector<Message>{OrderAccepted{id}, PagesWritten{id, 0, 4}, done(id),
                                               PrefillFailed{id, "x"}, OrderRejected{id, "x", 0}}) {
    auto wrong = rooms_.apply("prefill-b", m, now());
    ASSERT_FALSE(wrong.has_value()) << message_kind(m);
    EXPECT_EQ(wrong.error().code, ErrorCode::kUnauthenticated);
  }
  EXPECT_EQ(state(id), RoomState::kOrdered);  // nothing was applied
  EXPECT_EQ(rooms_.find(id)->pages_landed, 0u);
  EXPECT_EQ(rooms_.stats().forged_or_unknown, 6u);
  // Kinds that are not for the decode side.
  EXPECT_EQ(rooms_.apply("prefill-a", Heartbeat{"prefill-a", 1}, now()).error().code,
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(rooms_.apply("prefill-a", Cancel{id}, now()).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(rooms_.apply("prefill-a", order(id), now()).error().code, ErrorCode::kInvalidArgument);
}

TEST_F(RoomsTest, DuplicatesAreIgnoredAndCounted) {
  const RoomId id = open_ordered();
  EXPECT_TRUE(apply("prefill-a", OrderAccepted{id}));
  EXPECT_FALSE(apply("prefill-a", OrderAccepted{id}));
  EXPECT_TRUE(apply("prefill-a", PagesWritten{id, 1, 2}));
  EXPECT_FALSE(apply("prefill-a", PagesWritten{id, 1, 2}));
  EXPECT_FALSE(apply("prefill-a", PagesWritten{id, 2, 1}));
  auto overlap = apply("prefill-a", PagesWritten{id, 0, 2});  // page 0 is new
  ASSERT_TRUE(overlap);
  EXPECT_EQ(overlap->pages_landed, 3u);
  EXPECT_TRUE(apply("prefill-a", done(id)));
  EXPECT_FALSE(apply("prefill-a", done(id)));
  EXPECT_FALSE(apply("prefill-a", PagesWritten{id, 3, 1}));  // after Done
  EXPECT_FALSE(apply("prefill-a", OrderAccepted{id}));
  EXPECT_EQ(state(id), RoomState::kDone);
  const auto s = rooms_.stats();
  EXPECT_EQ(s.duplicates, 3u);
  EXPECT_EQ(s.late, 3u);
}

TEST_F(RoomsTest, PageRangesOutsideTheOrderFailTheRoom) {
  const RoomId id = open_ordered();
  apply("prefill-a", OrderAccepted{id});
  auto ev = apply("prefill-a", PagesWritten{id, 3, 2});  // pages 3 and 4 of 4
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->kind, RoomEvent::Kind::kFailed);
  EXPECT_EQ(ev->reason, RoomFailReason::kProtocolError);
  EXPECT_TRUE(ev->send_cancel);
  EXPECT_FALSE(ev->reclaimable);
  EXPECT_EQ(rooms_.find(id)->pages_landed, 0u);

  const RoomId other = open_ordered();
  ev = apply("prefill-a", PagesWritten{other, 5, 0});  // an empty range past the end
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->reason, RoomFailReason::kProtocolError);
}

TEST_F(RoomsTest, ProgressBeforeAcceptanceImpliesIt) {
  const RoomId id = open_ordered();
  auto ev = apply("prefill-a", PagesWritten{id, 0, 0});
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->kind, RoomEvent::Kind::kAccepted);
  const RoomId other = open_ordered();
  ev = apply("prefill-a", PagesWritten{other, 0, 1});
  EXPECT_EQ(ev->kind, RoomEvent::Kind::kProgress);
  EXPECT_EQ(state(other), RoomState::kTransferring);
  // Accepted now: the accept deadline no longer applies, the stall deadline does.
  advance(kAccept + 1);
  EXPECT_TRUE(rooms_.tick(now()).empty());
}

TEST_F(RoomsTest, RejectionAndFailureFreeThePagesAtOnce) {
  const RoomId rejected = open_ordered();
  auto ev = apply("prefill-a", OrderRejected{rejected, "overloaded", 250});
  ASSERT_TRUE(ev);
  EXPECT_EQ(ev->reason, RoomFailReason::kRejected);
  EXPECT_EQ(ev->retry_after_ms, 250);
  EXPECT_TRUE(ev->reclaimable);
  EXPECT_FALSE(ev->send_cancel);

  const RoomId failed = open_ordered();
  apply("prefill-a", OrderAccepted{failed});
  apply("prefill-a", PagesWritten{failed, 0, 1});
  ev = apply("prefill-a", PrefillFailed{failed, "out of memory"});
  EXPECT_EQ(ev->reason, RoomFailReason::kPrefillFailed);
  EXPECT_EQ(ev->message, "out of memory");
  EXPECT_TRUE(ev->reclaimable);

  // A rejection after acceptance breaks the protocol: the worker may have written.
  const RoomId odd = open_ordered();
  apply("prefill-a", OrderAccepted{odd});
  ev = apply("prefill-a", OrderRejected{odd, "changed its mind", 0});
  EXPECT_EQ(ev->reason, RoomFailReason::kProtocolError);
  EXPECT_FALSE(ev->reclaimable);
  EXPECT_TRUE(ev->send_cancel);

  // A PrefillDone that does not add up: the worker stopped, but the KV is not usable.
  const RoomId short_done = open_ordered();
  ev = apply("prefill-a", done(short_done, 31));
  EXPECT_EQ(ev->reason, RoomFailReason::kProtocolError);
  EXPECT_TRUE(ev->reclaimable);

  for (RoomId id : {rejected, failed, short_done}) EXPECT_TRUE(rooms_.erase(id).has_value());
}

TEST_F(RoomsTest, OpenRefusesBadOrdersReusedIdsAndAFullTable) {
  const RoomId id = rooms_.new_room_id();
  EXPECT_NE(room_value(id), 0u);
  PrefillOrder bad = order(id);
  bad.dst_pages.pop_back();
  EXPECT_EQ(rooms_.open(bad, "prefill-a", now()).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(rooms_.open(order(id), "not valid", now()).error().code, ErrorCode::kInvalidArgument);
  ASSERT_TRUE(rooms_.open(order(id), "prefill-a", now()).has_value());
  EXPECT_EQ(rooms_.open(order(id), "prefill-a", now()).error().code,
            ErrorCode::kFailedPrecondition);
  EXPECT_EQ(rooms_.ordered(RoomId{12345}, now()).error().code, ErrorCode::kNotFound);
  ASSERT_TRUE(rooms_.ordered(id, now()).has_value());
  EXPECT_EQ(rooms_.ordered(id, now()).error().code, ErrorCode::kFailedPrecondition);

  std::set<uint64_t> ids{room_value(id)};
  while (rooms_.size() < options().max_rooms) {
    const RoomId next = rooms_.new_room_id();
    EXPECT_TRUE(ids.insert(room_value(next)).second);
    ASSERT_TRUE(rooms_.open(order(next), "prefill-a", now()).has_value());
  }
  EXPECT_EQ(rooms_.open(order(rooms_.new_room_id()), "prefill-a", now()).error().code,
            ErrorCode::kResourceExhausted);
}

// Heartbeats decide health: the peer table says who died, the rooms of exactly that peer
// fail, and once it is heard again it takes new orders like any other worker.
TEST_F(RoomsTest, PeerDeathFailsExactlyItsRoomsAndARevivedPeerIsUsable) {
  PeerTable peers(PeerTableOptions{3'000, 16});
  ASSERT_TRUE(peers.on_hello(Hello{"prefill-a", Role::kPrefill, 1, 0, ""}, now()).has_value());
  ASSERT_TRUE(peers.on_hello(Hello{"prefill-b", Role::kPrefill, 2, 0, ""}, now()).has_value());
  const RoomId a1 = open_ordered("prefill-a");
  const RoomId a2 = open_ordered("prefill-a");
  const RoomId a_done = open_ordered("prefill-a");
  apply("prefill-a", done(a_done));
  const RoomId b1 = open_ordered("prefill-b");
  apply("prefill-a", OrderAccepted{a1});
  apply("prefill-b", OrderAccepted{b1});

  // prefill-b heartbeats every 500 ms (and makes progress); prefill-a falls silent.
  std::vector<std::string> dead;
  for (int i = 0; i < 7 && dead.empty(); ++i) {
    advance(500);
    peers.on_heard("prefill-b", now());
    apply("prefill-b", PagesWritten{b1, 0, 0});
    dead = peers.tick(now());
  }
  ASSERT_EQ(dead, std::vector<std::string>{"prefill-a"});
  EXPECT_FALSE(peers.alive("prefill-a"));
  EXPECT_TRUE(peers.alive("prefill-b"));
  auto failed = rooms_.fail_peer("prefill-a", now());
  std::set<uint64_t> failed_ids;
  for (const RoomEvent& ev : failed) {
    EXPECT_EQ(ev.reason, RoomFailReason::kPeerDead);
    failed_ids.insert(room_value(ev.room));
  }
  EXPECT_EQ(failed_ids, (std::set<uint64_t>{room_value(a1), room_value(a2)}));
  EXPECT_EQ(state(a_done), RoomState::kDone);
  EXPECT_EQ(state(b1), RoomState::kAccepted);
  EXPECT_TRUE(rooms_.tick(now()).empty());  // nothing else fails

  // prefill-a heartbeats again: alive, and a new room with it runs to the end.
  EXPECT_EQ(peers.on_heard("prefill-a", now()), HeardOutcome::kRevived);
  EXPECT_TRUE(peers.alive("prefill-a"));
  const RoomId again = open_ordered("prefill-a");
  EXPECT_EQ(apply("prefill-a", OrderAccepted{again})->kind, RoomEvent::Kind::kAccepted);
  EXPECT_EQ(apply("prefill-a", done(again))->kind, RoomEvent::Kind::kDone);
}

// Random messages, cancels, peer deaths and clock jumps over many rooms. Each room must see
// exactly one final outcome, at most one kReclaimable (and only after a failure that was not
// reclaimable at once), and after the clock runs past every deadline and quarantine, every
// room must be erasable: no destination page is held forever.
TEST(RoomsRandomized, EveryRoomEndsAndEveryPageIsReclaimed) {
  std::mt19937_64 rng(7);
  ManualClock clock(0);
  DecodeRooms rooms(options());
  struct Seen {
    int finals = 0;
    int reclaims = 0;
    bool reclaimable = false;
  };
  std::map<uint64_t, Seen> seen;
  std::vector<RoomId> ids;
  const std::vector<std::string> peers = {"p0", "p1", "p2"};
  std::map<uint64_t, std::string> peer_of;

  const auto record = [&](const RoomEvent& ev) {
    Seen& s = seen[room_value(ev.room)];
    switch (ev.kind) {
      case RoomEvent::Kind::kDone:
        ++s.finals;
        s.reclaimable = true;
        break;
      case RoomEvent::Kind::kFailed:
        ++s.finals;
        s.reclaimable = ev.reclaimable;
        break;
      case RoomEvent::Kind::kReclaimable:
        EXPECT_FALSE(s.reclaimable) << "reclaimed twice";
        ++s.reclaims;
        s.reclaimable = true;
        break;
      default:
        break;
    }
  };

  for (int step = 0; step < 20'000; ++step) {
    const int64_t now = clock.now_ms();
    const auto op = rng() % 100;
    if (op < 8 && rooms.size() < options().max_rooms) {
      const RoomId id = rooms.new_room_id();
      const std::string& p = peers[rng() % peers.size()];
      ASSERT_TRUE(
          rooms.open(order(id, 500 + static_cast<int64_t>(rng() % 8000)), p, now).has_value());
      if (rng() % 4 != 0) {
        ASSERT_TRUE(rooms.ordered(id, now).has_value());
      }
      ids.push_back(id);
      peer_of[room_value(id)] = p;
      seen[room_value(id)];
    } else if (op < 75 && !ids.empty()) {
      const RoomId id = ids[rng() % ids.size()];
      // Mostly the right peer; sometimes another (must be refused).
      const bool right = rng() % 10 != 0;
      const std::string peer = right ? peer_of[room_value(id)] : "intruder";
      Message m;
      switch (rng() % 6) {
        case 0:
          m = OrderAccepted{id};
          break;
        case 1:
          m = PagesWritten{id, static_cast<uint32_t>(rng() % 5), static_cast<uint32_t>(rng() % 3)};
          break;
        case 2:
          m = done(id, rng() % 20 == 0 ? 7 : 32);
          break;
        case 3:
          m = PrefillFailed{id, "boom"};
          break;
        case 4:
          m = OrderRejected{id, "busy", 10};
          break;
        default:
          m = PagesWritten{id, 0, 0};
          break;
      }
      auto r = rooms.apply(peer, m, now);
      if (!right) {
        EXPECT_FALSE(r.has_value());
      } else if (r.has_value() && *r) {
        record(**r);
      }
    } else if (op < 80 && !ids.empty()) {
      const RoomId id = ids[rng() % ids.size()];
      auto c = rooms.cancel(id, now);
      if (c.has_value()) {
        Seen& s = seen[room_value(id)];
        ++s.finals;
        s.reclaimable = c->reclaimable;
      }
    } else if (op < 82) {
      for (const RoomEvent& ev : rooms.fail_peer(peers[rng() % peers.size()], now)) record(ev);
    } else if (op < 90 && !ids.empty()) {
      // The engine erases what it may.
      const RoomId id = ids[rng() % ids.size()];
      const auto info = rooms.find(id);
      if (info && info->reclaimable && room_state_final(info->state)) {
        ASSERT_TRUE(rooms.erase(id).has_value());
        ids.erase(std::find(ids.begin(), ids.end(), id));
      }
    } else {
      clock.advance_ms(static_cast<int64_t>(rng() % 700));
      for (const RoomEvent& ev : rooms.tick(clock.now_ms())) record(ev);
    }
  }
  // Past every deadline and quarantine: everything becomes reclaimable.
  clock.advance_ms(kDeadline + kQuarantine + kStall + 1);
  for (const RoomEvent& ev : rooms.tick(clock.now_ms())) record(ev);
  clock.advance_ms(kQuarantine + 1);
  for (const RoomEvent& ev : rooms.tick(clock.now_ms())) record(ev);
  for (RoomId id : ids) {
    EXPECT_TRUE(rooms.erase(id).has_value()) << room_state_name(rooms.find(id)->state);
  }
  EXPECT_EQ(rooms.size(), 0u);
  for (const auto& [id, s] : seen) {
    EXPECT_EQ(s.finals, 1) << id;
    EXPECT_LE(s.reclaims, 1) << id;
    EXPECT_TRUE(s.reclaimable) << id;
  }
  EXPECT_GT(rooms.stats().forged_or_unknown, 0u);
}

}  // namespace
}  // namespace strata::pd
