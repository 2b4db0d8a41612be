// The heartbeat table (death after a silence longer than the timeout, revival, restarts,
// its bound) and the prefill side's leases (released on done, cancel, peer death and
// deadline; never outliving the deadline), on a manual clock.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "pd/pd_leases.h"
#include "pd/pd_peers.h"

namespace strata::pd {
namespace {

Hello hello(const std::string& id, uint64_t incarnation) {
  return Hello{id, Role::kDecode, incarnation, 0, ""};
}

TEST(PeerTable, DeadAfterMoreThanTheTimeoutAndAliveWhenHeardAgain) {
  ManualClock clock(50'000);
  PeerTable peers(PeerTableOptions{3'000, 8});
  EXPECT_EQ(peers.on_heard("d0", clock.now_ms()), HeardOutcome::kUnknown);
  EXPECT_EQ(*peers.on_hello(hello("d0", 1), clock.now_ms()), HelloOutcome::kNew);
  EXPECT_EQ(*peers.on_hello(hello("d0", 1), clock.now_ms()), HelloOutcome::kUnchanged);
  EXPECT_TRUE(peers.alive("d0"));

  clock.advance_ms(3'000);
  EXPECT_TRUE(peers.tick(clock.now_ms()).empty());  // exactly the timeout: still alive
  clock.advance_ms(1);
  EXPECT_EQ(peers.tick(clock.now_ms()), std::vector<std::string>{"d0"});
  EXPECT_TRUE(peers.tick(clock.now_ms() + 60'000).empty());  // listed once per death
  EXPECT_FALSE(peers.alive("d0"));
  EXPECT_EQ(peers.find("d0")->deaths, 1u);

  // Heard again (a heartbeat): alive, no blacklist.
  EXPECT_EQ(peers.on_heard("d0", clock.now_ms()), HeardOutcome::kRevived);
  EXPECT_TRUE(peers.alive("d0"));
  EXPECT_EQ(peers.on_heard("d0", clock.now_ms()), HeardOutcome::kAlive);
  // Dead again, then a Hello with the same incarnation revives it too.
  clock.advance_ms(3'001);
  EXPECT_EQ(peers.tick(clock.now_ms()).size(), 1u);
  EXPECT_EQ(*peers.on_hello(hello("d0", 1), clock.now_ms()), HelloOutcome::kRevived);
}

TEST(PeerTable, HeartbeatsKeepAPeerAliveIndefinitely) {
  ManualClock clock(0);
  PeerTable peers(PeerTableOptions{3'000, 8});
  ASSERT_TRUE(peers.on_hello(hello("d0", 1), 0).has_value());
  for (int i = 0; i < 1'000; ++i) {
    clock.advance_ms(2'999);
    EXPECT_TRUE(peers.tick(clock.now_ms()).empty());
    peers.on_heard("d0", clock.now_ms());
  }
  EXPECT_EQ(peers.find("d0")->deaths, 0u);
}

TEST(PeerTable, ANewIncarnationIsARestart) {
  PeerTable peers(PeerTableOptions{3'000, 8});
  ASSERT_TRUE(peers.on_hello(hello("d0", 1), 0).has_value());
  EXPECT_EQ(*peers.on_hello(hello("d0", 2), 10), HelloOutcome::kRestarted);
  EXPECT_TRUE(peers.alive("d0"));
  EXPECT_EQ(peers.find("d0")->incarnation, 2u);
  EXPECT_EQ(peers.find("d0")->deaths, 1u);
  EXPECT_TRUE(peers.mark_dead("d0"));
  EXPECT_FALSE(peers.mark_dead("d0"));
  EXPECT_FALSE(peers.mark_dead("nobody"));
  EXPECT_EQ(*peers.on_hello(hello("d0", 3), 20), HelloOutcome::kRestarted);
  EXPECT_EQ(peers.find("d0")->deaths, 2u);  // the restart of a dead peer is no new death
}

TEST(PeerTable, AFullTableForgetsTheLongestDeadAndNeverALivePeer) {
  ManualClock clock(0);
  PeerTable peers(PeerTableOptions{100, 3});
  ASSERT_TRUE(peers.on_hello(hello("a", 1), 0).has_value());
  ASSERT_TRUE(peers.on_hello(hello("b", 1), 10).has_value());
  ASSERT_TRUE(peers.on_hello(hello("c", 1), 20).has_value());
  auto full = peers.on_hello(hello("d", 1), 30);
  ASSERT_FALSE(full.has_value());
  EXPECT_EQ(full.error().code, ErrorCode::kResourceExhausted);
  peers.on_heard("c", 150);
  EXPECT_EQ(peers.tick(150).size(), 2u);  // a and b
  ASSERT_TRUE(peers.on_hello(hello("d", 1), 160).has_value());
  EXPECT_FALSE(peers.find("a").has_value());  // silent the longest
  EXPECT_TRUE(peers.find("b").has_value());
  EXPECT_EQ(peers.size(), 3u);
  EXPECT_EQ(peers.alive_count(), 2u);
}

class LeasesTest : public ::testing::Test {
 protected:
  LeasesTest() : leases_(PrefillLeaseOptions{8}), clock_(1'000) {}
  int64_t now() const { return clock_.now_ms(); }
  PrefillLeases leases_;
  ManualClock clock_;
};

TEST_F(LeasesTest, ReleasedWhenTheEngineIsDone) {
  ASSERT_TRUE(leases_.acquire(RoomId{1}, "d0", 77, now(), 5'000).has_value());
  EXPECT_TRUE(leases_.holds(RoomId{1}));
  EXPECT_EQ(leases_.deadline_of(RoomId{1}), now() + 5'000);
  auto ended = leases_.release(RoomId{1});
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->handle, 77u);
  EXPECT_EQ(ended->peer, "d0");
  EXPECT_EQ(ended->end, LeaseEnd::kReleased);
  EXPECT_FALSE(leases_.holds(RoomId{1}));
  EXPECT_EQ(leases_.release(RoomId{1}).error().code, ErrorCode::kNotFound);  // exactly once
  EXPECT_TRUE(leases_.tick(now() + 10'000).empty());
}

TEST_F(LeasesTest, CancelOnlyFromTheOrderingPeer) {
  ASSERT_TRUE(leases_.acquire(RoomId{1}, "d0", 5, now(), 5'000).has_value());
  auto forged = leases_.cancel("d1", RoomId{1});
  ASSERT_FALSE(forged.has_value());
  EXPECT_EQ(forged.error().code, ErrorCode::kUnauthenticated);
  EXPECT_TRUE(leases_.holds(RoomId{1}));
  EXPECT_EQ(leases_.cancel("d0", RoomId{99}).error().code, ErrorCode::kNotFound);
  auto ended = leases_.cancel("d0", RoomId{1});
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(ended->end, LeaseEnd::kCancelled);
  EXPECT_EQ(ended->handle, 5u);
  const auto s = leases_.stats();
  EXPECT_EQ(s.forged_or_unknown, 2u);
  EXPECT_EQ(s.cancelled, 1u);
  EXPECT_EQ(s.active, 0u);
}

TEST_F(LeasesTest, PeerDeathReleasesExactlyItsLeases) {
  ASSERT_TRUE(leases_.acquire(RoomId{1}, "d0", 1, now(), 5'000).has_value());
  ASSERT_TRUE(leases_.acquire(RoomId{2}, "d1", 2, now(), 5'000).has_value());
  ASSERT_TRUE(leases_.acquire(RoomId{3}, "d0", 3, now(), 5'000).has_value());
  auto ended = leases_.on_peer_dead("d0");
  std::set<uint64_t> handles;
  for (const EndedLease& e : ended) {
    EXPECT_EQ(e.end, LeaseEnd::kPeerDead);
    handles.insert(e.handle);
  }
  EXPECT_EQ(handles, (std::set<uint64_t>{1, 3}));
  EXPECT_TRUE(leases_.holds(RoomId{2}));
  EXPECT_TRUE(leases_.on_peer_dead("d0").empty());
}

TEST_F(LeasesTest, ExpiresRightAfterItsDeadline) {
  ASSERT_TRUE(leases_.acquire(RoomId{1}, "d0", 1, now(), 5'000).has_value());
  ASSERT_TRUE(leases_.acquire(RoomId{2}, "d0", 2, now(), 9'000).has_value());
  clock_.advance_ms(5'000);
  EXPECT_TRUE(leases_.tick(now()).empty());
  clock_.advance_ms(1);
  auto ended = leases_.tick(now());
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].room, RoomId{1});
  EXPECT_EQ(ended[0].end, LeaseEnd::kDeadline);
  clock_.advance_ms(4'000);
  EXPECT_EQ(leases_.tick(now()).size(), 1u);
  EXPECT_EQ(leases_.size(), 0u);
  EXPECT_EQ(leases_.stats().expired, 2u);
}

TEST_F(LeasesTest, RefusesRepeatsBadArgumentsAndAFullTable) {
  ASSERT_TRUE(leases_.acquire(RoomId{1}, "d0", 1, now(), 5'000).has_value());
  EXPECT_EQ(leases_.acquire(RoomId{1}, "d0", 1, now(), 5'000).error().code,
            ErrorCode::kFailedPrecondition);
  EXPECT_EQ(leases_.acquire(RoomId{2}, "d0", 1, now(), 0).error().code,
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(leases_.acquire(RoomId{0}, "d0", 1, now(), 10).error().code,
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(leases_.acquire(RoomId{2}, "bad id", 1, now(), 10).error().code,
            ErrorCode::kInvalidArgument);
  for (uint64_t r = 2; r <= 8; ++r) {
    ASSERT_TRUE(leases_.acquire(RoomId{r}, "d0", r, now(), 10).has_value());
  }
  EXPECT_EQ(leases_.acquire(RoomId{9}, "d0", 9, now(), 10).error().code,
            ErrorCode::kResourceExhausted);
  EXPECT_EQ(leases_.stats().refused, 5u);
}

// Random acquires, releases, cancels, deaths and clock steps: after every tick(now), no
// lease with a deadline before now is held, and every handle comes back exactly once.
TEST(LeasesRandomized, NoLeaseOutlivesItsDeadlineAndEveryHandleComesBackOnce) {
  std::mt19937_64 rng(11);
  ManualClock clock(0);
  PrefillLeases leases(PrefillLeaseOptions{64});
  std::map<uint64_t, int64_t> deadline_of;  // room -> deadline, for the leases held
  std::map<uint64_t, int> returned;         // handle (= room) -> times given back
  uint64_t next_room = 1;
  const auto give_back = [&](const EndedLease& e) {
    ++returned[e.handle];
    EXPECT_EQ(e.handle, room_value(e.room));
    deadline_of.erase(room_value(e.room));
  };
  for (int step = 0; step < 50'000; ++step) {
    const int64_t now = clock.now_ms();
    const std::string peer = std::string("d").append(std::to_string(rng() % 3));
    switch (rng() % 6) {
      case 0: {
        const uint64_t room = next_room++;
        const int64_t deadline_ms = 1 + static_cast<int64_t>(rng() % 2'000);
        if (leases.acquire(RoomId{room}, peer, room, now, deadline_ms).has_value()) {
          deadline_of[room] = now + deadline_ms;
          returned[room] = 0;
        }
        break;
      }
      case 1:
        if (!deadline_of.empty()) {
          auto it = std::next(deadline_of.begin(),
                              static_cast<std::ptrdiff_t>(rng() % deadline_of.size()));
          auto e = leases.release(RoomId{it->first});
          ASSERT_TRUE(e.has_value());
          give_back(*e);
        }
        break;
      case 2:
        if (!deadline_of.empty()) {
          auto it = std::next(deadline_of.begin(),
                              static_cast<std::ptrdiff_t>(rng() % deadline_of.size()));
          if (auto e = leases.cancel(peer, RoomId{it->first})) give_back(*e);
        }
        break;
      case 3:
        if (rng() % 10 == 0) {
          for (const EndedLease& e : leases.on_peer_dead(peer)) give_back(e);
        }
        break;
      default: {
        clock.advance_ms(static_cast<int64_t>(rng() % 300));
        const int64_t t = clock.now_ms();
        for (const EndedLease& e : leases.tick(t)) {
          EXPECT_LT(deadline_of.at(room_value(e.room)), t);
          give_back(e);
        }
        for (const auto& [room, deadline] : deadline_of) {
          ASSERT_GE(deadline, t) << "lease of room " << room << " outlived its deadline";
        }
        break;
      }
    }
  }
  clock.advance_ms(10'000);
  for (const EndedLease& e : leases.tick(clock.now_ms())) give_back(e);
  EXPECT_EQ(leases.size(), 0u);
  for (const auto& [handle, times] : returned) EXPECT_EQ(times, 1) << handle;
}

}  // namespace
}  // namespace strata::pd
