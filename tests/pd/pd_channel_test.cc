// Channels over tcp://127.0.0.1 in one process: the handshake, an order running to Done
// through the rooms and the leases, peer death when a channel is destroyed and revival when
// it comes back, restarts, bad handshakes, garbage and forged frames from raw sockets, a
// full inbox, and a consumer that does not poll for longer than the peer timeout (the seed's
// busy scheduler) without anyone being declared dead.
//
// Nothing here asserts a duration: waits have generous upper bounds (kPatienceMs) that only
// a broken channel reaches.
#include "pd/pd_channel.h"

#include <gtest/gtest.h>
#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "pd/pd_leases.h"
#include "pd/pd_rooms.h"

namespace strata::pd {
namespace {

constexpr int64_t kPatienceMs = 30'000;
constexpr int64_t kHeartbeatMs = 20;
// 50 heartbeats: only a thread starved for a whole second (not a slow sanitizer build)
// makes a live peer look dead.
constexpr int64_t kPeerTimeoutMs = 1'000;

ChannelOptions prefill_options(const std::string& id, std::string bind = "tcp://127.0.0.1:0") {
  ChannelOptions o;
  o.worker_id = id;
  o.role = Role::kPrefill;
  o.bind_endpoint = std::move(bind);
  o.kv_layout = "test-layout";
  o.heartbeat_ms = kHeartbeatMs;
  o.peer_timeout_ms = kPeerTimeoutMs;
  return o;
}

ChannelOptions decode_options(const std::string& id) {
  ChannelOptions o;
  o.worker_id = id;
  o.role = Role::kDecode;
  o.kv_layout = "test-layout";
  o.heartbeat_ms = kHeartbeatMs;
  o.peer_timeout_ms = kPeerTimeoutMs;
  return o;
}

std::unique_ptr<Channel> start(ChannelOptions o) {
  auto c = Channel::start(std::move(o));
  EXPECT_TRUE(c.has_value()) << c.error().message;
  return c ? std::move(*c) : nullptr;
}

// Collects what a channel delivers, waiting (bounded) for a condition on it.
struct Collector {
  Channel* channel;
  std::vector<PeerChange> changes;
  std::vector<Inbound> messages;

  void drain() {
    ChannelEvents ev = channel->poll();
    for (auto& c : ev.peers) changes.push_back(std::move(c));
    for (auto& m : ev.messages) messages.push_back(std::move(m));
  }
  bool until(const std::function<bool()>& done) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(kPatienceMs);
    for (;;) {
      drain();
      if (done()) return true;
      if (std::chrono::steady_clock::now() > give_up) return false;
      channel->wait(50);
    }
  }
  bool saw_alive(const std::string& peer) const {
    for (const auto& c : changes) {
      if (c.peer == peer && c.alive) return true;
    }
    return false;
  }
  bool saw_lost(const std::string& peer) const {
    for (const auto& c : changes) {
      if (c.peer == peer && c.lost) return true;
    }
    return false;
  }
  template <typename T>
  std::vector<T> of() const {
    std::vector<T> out;
    for (const auto& m : messages) {
      if (const auto* t = std::get_if<T>(&m.message)) out.push_back(*t);
    }
    return out;
  }
};

PrefillOrder order_for(RoomId room, const std::string& decode_id) {
  PrefillOrder o;
  o.room = room;
  o.decode_worker_id = decode_id;
  o.tokens.assign(40, 3);
  o.page_size = 8;
  o.cached_tokens = 8;
  o.dst_pages = {4, 5, 6, 7};
  o.transport.kind = TransportKind::kStorage;
  o.transport.storage_prefix = "pd/test";
  o.sampling["temperature"] = 0.0;
  o.deadline_ms = 60'000;
  return o;
}

// A connected pair: prefill "p0" and decode "d0", handshake done on both sides.
struct Pair {
  std::unique_ptr<Channel> prefill = start(prefill_options("p0"));
  std::unique_ptr<Channel> decode = start(decode_options("d0"));
  Collector p{prefill.get(), {}, {}};
  Collector d{decode.get(), {}, {}};

  bool connect() {
    if (!decode->connect(prefill->endpoint()).has_value()) return false;
    return d.until([&] { return d.saw_alive("p0"); }) && p.until([&] { return p.saw_alive("d0"); });
  }
};

TEST(PdChannel, OptionsAreValidated) {
  ChannelOptions o = decode_options("d0");
  o.worker_id = "with space";
  EXPECT_EQ(Channel::start(o).error().code, ErrorCode::kInvalidArgument);
  o = decode_options("d0");
  o.bind_endpoint = "tcp://127.0.0.1:0";
  EXPECT_EQ(Channel::start(o).error().code, ErrorCode::kInvalidArgument);
  o = prefill_options("p0", "");
  EXPECT_EQ(Channel::start(o).error().code, ErrorCode::kInvalidArgument);
  o = decode_options("d0");
  o.peer_timeout_ms = o.heartbeat_ms;  // one lost heartbeat would kill a peer
  EXPECT_EQ(Channel::start(o).error().code, ErrorCode::kInvalidArgument);
  o = prefill_options("p0", "tcp://256.1.1.1:0");
  auto bad = Channel::start(o);
  ASSERT_FALSE(bad.has_value());
  EXPECT_NE(bad.error().message.find("cannot bind"), std::string::npos);
}

TEST(PdChannel, BindsAFreePortAndReportsIt) {
  auto a = start(prefill_options("p0", "tcp://127.0.0.1:0"));
  auto b = start(prefill_options("p1", "tcp://127.0.0.1:*"));
  ASSERT_TRUE(a && b);
  for (const std::string& ep : {a->endpoint(), b->endpoint()}) {
    ASSERT_TRUE(ep.starts_with("tcp://127.0.0.1:")) << ep;
    const std::string port = ep.substr(ep.rfind(':') + 1);
    EXPECT_NE(port, "0");
    EXPECT_NE(port, "*");
    EXPECT_GT(std::stoi(port), 0);
  }
  EXPECT_NE(a->endpoint(), b->endpoint());
  // A port in use is refused.
  auto clash = Channel::start(prefill_options("p2", a->endpoint()));
  EXPECT_FALSE(clash.has_value());
  EXPECT_EQ(a->connect("tcp://127.0.0.1:1").error().code, ErrorCode::kInvalidArgument);
}

TEST(PdChannel, OrderRunsToDoneThroughRoomsAndLeases) {
  Pair pair;
  ASSERT_TRUE(pair.connect());
  EXPECT_TRUE(pair.decode->peer_alive("p0"));
  EXPECT_TRUE(pair.prefill->peer_alive("d0"));

  DecodeRooms rooms(DecodeRoomOptions{});
  PrefillLeases leases(PrefillLeaseOptions{});
  const Clock& clock = SteadyClock::instance();

  const RoomId room = rooms.new_room_id();
  const PrefillOrder order = order_for(room, "d0");
  ASSERT_TRUE(rooms.open(order, "p0", clock.now_ms()).has_value());
  ASSERT_TRUE(pair.decode->send("p0", order).has_value());
  ASSERT_TRUE(rooms.ordered(room, clock.now_ms()).has_value());

  // Prefill side: the order arrives intact, from d0.
  ASSERT_TRUE(pair.p.until([&] { return !pair.p.of<PrefillOrder>().empty(); }));
  const Inbound& in = pair.p.messages.front();
  EXPECT_EQ(in.peer, "d0");
  EXPECT_EQ(std::get<PrefillOrder>(in.message), order);
  ASSERT_TRUE(leases.acquire(room, in.peer, 1234, clock.now_ms(), order.deadline_ms).has_value());
  ASSERT_TRUE(pair.prefill->send("d0", OrderAccepted{room}).has_value());
  for (uint32_t chunk = 0; chunk < 4; ++chunk) {
    ASSERT_TRUE(pair.prefill->send("d0", PagesWritten{room, chunk, 1}).has_value());
  }
  ASSERT_TRUE(pair.prefill->send("d0", PrefillDone{room, 99, 32, 4 * 4096, 2}).has_value());
  auto lease = leases.release(room);
  ASSERT_TRUE(lease.has_value());
  EXPECT_EQ(lease->handle, 1234u);

  // Decode side: accepted, four chunks, done, in order, applied to the room.
  ASSERT_TRUE(pair.d.until([&] { return !pair.d.of<PrefillDone>().empty(); }));
  std::vector<RoomEvent::Kind> kinds;
  for (const Inbound& m : pair.d.messages) {
    auto ev = rooms.apply(m.peer, m.message, m.received_ms);
    ASSERT_TRUE(ev.has_value()) << ev.error().message;
    if (*ev) kinds.push_back((*ev)->kind);
  }
  using K = RoomEvent::Kind;
  EXPECT_EQ(kinds, (std::vector<K>{K::kAccepted, K::kProgress, K::kProgress, K::kProgress,
                                   K::kProgress, K::kDone}));
  EXPECT_EQ(rooms.find(room)->state, RoomState::kDone);
  EXPECT_TRUE(rooms.erase(room).has_value());

  // Heartbeats flow both ways once the handshake is done.
  ASSERT_TRUE(pair.d.until([&] { return pair.decode->stats().heartbeats_received > 0; }));
  ASSERT_TRUE(pair.p.until([&] { return pair.prefill->stats().heartbeats_received > 0; }));
  const ChannelStats ds = pair.decode->stats();
  EXPECT_EQ(ds.decode_errors, 0u);
  EXPECT_EQ(ds.bad_handshakes, 0u);
}

TEST(PdChannel, SendRefusesUnknownPeersAndInvalidMessages) {
  Pair pair;
  ASSERT_TRUE(pair.connect());
  EXPECT_EQ(pair.decode->send("p9", Cancel{RoomId{1}}).error().code, ErrorCode::kNotFound);
  EXPECT_EQ(pair.decode->send("p0", Cancel{RoomId{0}}).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(pair.prefill->connect("tcp://127.0.0.1:5555").error().code,
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(pair.decode->connect("no-such-transport://x").error().code,
            ErrorCode::kInvalidArgument);
  EXPECT_TRUE(pair.decode->connect(pair.prefill->endpoint()).has_value());  // already: no-op
  EXPECT_EQ(pair.decode->disconnect("tcp://127.0.0.1:1").error().code, ErrorCode::kNotFound);
}

TEST(PdChannel, DestroyedPeerIsDetectedDeadAndItsRoomsFail) {
  Pair pair;
  ASSERT_TRUE(pair.connect());
  DecodeRooms rooms(DecodeRoomOptions{});
  const RoomId room = rooms.new_room_id();
  ASSERT_TRUE(rooms.open(order_for(room, "d0"), "p0", 0).has_value());
  ASSERT_TRUE(rooms.ordered(room, 0).has_value());

  pair.d.changes.clear();
  pair.prefill.reset();  // the prefill worker dies
  ASSERT_TRUE(pair.d.until([&] { return pair.d.saw_lost("p0"); }));
  EXPECT_FALSE(pair.decode->peer_alive("p0"));
  EXPECT_EQ(pair.decode->send("p0", Cancel{room}).error().code, ErrorCode::kNotFound);
  for (const PeerChange& c : pair.d.changes) {
    if (!c.lost) continue;
    auto failed = rooms.fail_peer(c.peer, 0);
    ASSERT_EQ(failed.size(), 1u);
    EXPECT_EQ(failed[0].reason, RoomFailReason::kPeerDead);
  }
  EXPECT_GE(pair.decode->stats().peer_deaths, 1u);
}

TEST(PdChannel, APrefillWorkerThatComesBackIsUsableAgain) {
  Pair pair;
  ASSERT_TRUE(pair.connect());
  const std::string endpoint = pair.prefill->endpoint();
  pair.prefill.reset();
  ASSERT_TRUE(pair.d.until([&] { return pair.d.saw_lost("p0"); }));

  // A new process of the same worker on the same port: the decode worker's DEALER
  // reconnects on its own, the handshake runs again, and orders flow.
  pair.d.changes.clear();
  auto again = start(prefill_options("p0", endpoint));
  ASSERT_TRUE(again);
  Collector p2{again.get(), {}, {}};
  ASSERT_TRUE(pair.d.until([&] { return pair.d.saw_alive("p0"); }));
  ASSERT_TRUE(p2.until([&] { return p2.saw_alive("d0"); }));
  ASSERT_TRUE(pair.decode->send("p0", order_for(RoomId{77}, "d0")).has_value());
  ASSERT_TRUE(p2.until([&] { return !p2.of<PrefillOrder>().empty(); }));
}

// The prefill worker restarts faster than the peer timeout: the new incarnation in its
// Hello tells the decode worker that the old process's rooms are gone.
TEST(PdChannel, AQuickRestartIsSeenThroughTheIncarnation) {
  Pair pair;
  ASSERT_TRUE(pair.connect());
  const std::string endpoint = pair.prefill->endpoint();
  pair.d.drain();
  pair.d.changes.clear();
  pair.prefill.reset();
  auto again = start(prefill_options("p0", endpoint));
  ASSERT_TRUE(again);
  Collector p2{again.get(), {}, {}};
  ASSERT_TRUE(pair.d.until([&] { return pair.d.saw_lost("p0") && pair.decode->peer_alive("p0"); }));
  ASSERT_TRUE(p2.until([&] { return p2.saw_alive("d0"); }));
}

// The decode worker restarts: the prefill worker sees its leases' owner lost.
TEST(PdChannel, ARestartedDecodeWorkerIsSeenLostByThePrefillWorker) {
  Pair pair;
  ASSERT_TRUE(pair.connect());
  pair.p.changes.clear();
  const uint64_t first = pair.decode->incarnation();
  pair.decode.reset();
  auto again = start(decode_options("d0"));
  ASSERT_TRUE(again);
  EXPECT_NE(again->incarnation(), first);
  ASSERT_TRUE(again->connect(pair.prefill->endpoint()).has_value());
  ASSERT_TRUE(
      pair.p.until([&] { return pair.p.saw_lost("d0") && pair.prefill->peer_alive("d0"); }));
  Collector d2{again.get(), {}, {}};
  ASSERT_TRUE(d2.until([&] { return d2.saw_alive("p0"); }));
}

TEST(PdChannel, DisconnectReportsThePeerLost) {
  Pair pair;
  ASSERT_TRUE(pair.connect());
  pair.d.changes.clear();
  ASSERT_TRUE(pair.decode->disconnect(pair.prefill->endpoint()).has_value());
  pair.d.drain();
  EXPECT_TRUE(pair.d.saw_lost("p0"));
  EXPECT_FALSE(pair.decode->peer_alive("p0"));
}

TEST(PdChannel, ADifferentKvLayoutIsRefused) {
  auto prefill = start(prefill_options("p0"));
  ChannelOptions o = decode_options("d0");
  o.kv_layout = "another-model";
  auto decode = start(o);
  ASSERT_TRUE(decode->connect(prefill->endpoint()).has_value());
  // Bounded wait for the refusal to be counted; then the peer must still be unknown.
  Collector p{prefill.get(), {}, {}};
  ASSERT_TRUE(p.until([&] { return prefill->stats().bad_handshakes > 0; }));
  EXPECT_FALSE(prefill->peer_alive("d0"));
  EXPECT_FALSE(decode->peer_alive("p0"));
  EXPECT_TRUE(p.changes.empty());
  EXPECT_NE(prefill->stats().last_error.find("layout"), std::string::npos);
}

// A peer whose pages are of another KV dtype (issue 54) is refused with that reason.
TEST(PdChannel, AnotherKvDtypeIsRefusedWithTheReason) {
  ChannelOptions po = prefill_options("p0");
  po.kv_layout = "int8-p16-abc;layers=2;kv_heads=2;head_dim=64;dtype=int8";
  auto prefill = start(po);
  ChannelOptions o = decode_options("d0");
  o.kv_layout = "bf16-p16-abc;layers=2;kv_heads=2;head_dim=64;dtype=bf16";
  auto decode = start(o);
  ASSERT_TRUE(decode->connect(prefill->endpoint()).has_value());
  Collector p{prefill.get(), {}, {}};
  ASSERT_TRUE(p.until([&] { return prefill->stats().bad_handshakes > 0; }));
  EXPECT_FALSE(prefill->peer_alive("d0"));
  const std::string error = prefill->stats().last_error;
  EXPECT_NE(error.find("KV pages are bf16 and ours int8"), std::string::npos) << error;
  EXPECT_NE(error.find("--kv-cache-dtype"), std::string::npos) << error;
}

// Frames from a raw DEALER: another protocol version, garbage, a Hello that names another
// worker than its identity, and (after a proper handshake) an order naming another decode
// worker. Each is refused and counted; the channel keeps serving a well-behaved peer.
TEST(PdChannel, BadFramesAndForgedSendersAreRefused) {
  Pair pair;
  ASSERT_TRUE(pair.connect());
  zmq::context_t ctx(1);
  const auto raw_dealer = [&](const std::string& identity) {
    zmq::socket_t s(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::routing_id, identity);
    s.set(zmq::sockopt::rcvtimeo, static_cast<int>(kPatienceMs));
    s.connect(pair.prefill->endpoint());
    return s;
  };
  const auto send = [](zmq::socket_t& s, const std::string& bytes) {
    ASSERT_TRUE(s.send(zmq::buffer(bytes), zmq::send_flags::none).has_value());
  };
  const auto stats = [&] { return pair.prefill->stats(); };

  zmq::socket_t mallory = raw_dealer("mallory");
  send(mallory,
       *encode_message_with_version(Hello{"mallory", Role::kDecode, 5, 0, "test-layout"}, 9));
  ASSERT_TRUE(pair.p.until([&] { return stats().bad_handshakes >= 1; }));
  send(mallory, std::string("\x93\x01\xa6"
                            "Cancel",
                            9));  // truncated
  send(mallory, "garbage that is not msgpack");
  ASSERT_TRUE(pair.p.until([&] { return stats().decode_errors >= 2; }));
  // Claims to be d0 on the connection of mallory.
  send(mallory, *encode_message(Hello{"d0", Role::kDecode, 5, 0, "test-layout"}));
  ASSERT_TRUE(pair.p.until([&] { return stats().bad_handshakes >= 2; }));
  // A message before any Hello: answered with the prefill's Hello, dropped.
  send(mallory, *encode_message(Cancel{RoomId{1}}));
  ASSERT_TRUE(pair.p.until([&] { return stats().unknown_peer >= 1; }));
  zmq::message_t answer;
  ASSERT_TRUE(mallory.recv(answer, zmq::recv_flags::none).has_value());
  auto hello = decode_message(std::string_view(answer.data<char>(), answer.size()));
  ASSERT_TRUE(hello.has_value());
  EXPECT_EQ(std::get<Hello>(*hello).worker_id, "p0");

  // eve handshakes properly, then orders in d0's name and sends a decode-side message.
  zmq::socket_t eve = raw_dealer("eve");
  send(eve,
       *encode_message(Hello{"eve", Role::kDecode, 6, pair.prefill->incarnation(), "test-layout"}));
  ASSERT_TRUE(pair.p.until([&] { return pair.p.saw_alive("eve"); }));
  send(eve, *encode_message(order_for(RoomId{5}, "d0")));
  send(eve, *encode_message(PrefillDone{RoomId{5}, 1, 1, 1, 1}));
  ASSERT_TRUE(pair.p.until([&] { return stats().protocol_errors >= 2; }));
  EXPECT_TRUE(pair.p.of<PrefillOrder>().empty());

  // d0 itself is still served.
  ASSERT_TRUE(pair.decode->send("p0", order_for(RoomId{6}, "d0")).has_value());
  ASSERT_TRUE(pair.p.until([&] { return !pair.p.of<PrefillOrder>().empty(); }));
  EXPECT_EQ(pair.p.of<PrefillOrder>().front().room, RoomId{6});
  EXPECT_FALSE(pair.prefill->peer_alive("mallory"));
}

TEST(PdChannel, AFullInboxRejectsOrdersAtOnce) {
  ChannelOptions po = prefill_options("p0");
  po.max_inbox_messages = 2;
  auto prefill = start(po);
  auto decode = start(decode_options("d0"));
  Collector d{decode.get(), {}, {}};
  ASSERT_TRUE(decode->connect(prefill->endpoint()).has_value());
  ASSERT_TRUE(d.until([&] { return d.saw_alive("p0"); }));
  ASSERT_TRUE(prefill->wait(kPatienceMs));  // the peer change for d0
  (void)prefill->poll();
  for (uint64_t r = 1; r <= 5; ++r) {
    ASSERT_TRUE(decode->send("p0", order_for(RoomId{r}, "d0")).has_value());
  }
  ASSERT_TRUE(d.until([&] { return d.of<OrderRejected>().size() == 3; }));
  for (const OrderRejected& rej : d.of<OrderRejected>()) {
    EXPECT_NE(rej.reason.find("inbox is full"), std::string::npos);
    EXPECT_EQ(rej.retry_after_ms, kHeartbeatMs);
  }
  const ChannelEvents got = prefill->poll();
  ASSERT_EQ(got.messages.size(), 2u);
  EXPECT_EQ(std::get<PrefillOrder>(got.messages[0].message).room, RoomId{1});
  EXPECT_EQ(std::get<PrefillOrder>(got.messages[1].message).room, RoomId{2});
  EXPECT_EQ(prefill->stats().inbox_dropped, 3u);
}

// Seed 003's failure, inverted: the decode worker's consumer does not poll for several
// peer timeouts (a scheduler busy evicting). Its channel thread keeps heartbeating, so the
// prefill worker never declares it dead, and the messages wait in the inbox.
TEST(PdChannel, AConsumerThatDoesNotPollIsNotDeclaredDead) {
  Pair pair;
  ASSERT_TRUE(pair.connect());
  pair.p.changes.clear();
  ASSERT_TRUE(pair.prefill->send("d0", PagesWritten{RoomId{1}, 0, 0}).has_value());
  // The prefill side keeps polling; the decode side does not, for 3 peer timeouts.
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(3 * kPeerTimeoutMs);
  while (std::chrono::steady_clock::now() < until) {
    pair.p.drain();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(pair.p.saw_lost("d0"));
  EXPECT_TRUE(pair.prefill->peer_alive("d0"));
  pair.d.drain();
  EXPECT_FALSE(pair.d.saw_lost("p0"));
  ASSERT_EQ(pair.d.messages.size(), 1u);
}

TEST(PdChannel, NotifyFiresWhenSomethingArrives) {
  Pair pair;
  std::atomic<int> calls{0};
  pair.decode->set_notify([&] { ++calls; });
  ASSERT_TRUE(pair.connect());
  ASSERT_TRUE(pair.prefill->send("d0", PagesWritten{RoomId{1}, 0, 0}).has_value());
  ASSERT_TRUE(pair.d.until([&] { return !pair.d.messages.empty(); }));
  EXPECT_GT(calls.load(), 0);
  pair.decode->set_notify(nullptr);
}

// Many orders from two decode workers to one prefill worker, sent from several threads at
// once (send is thread-safe and never blocks); all arrive, attributed to their sender.
TEST(PdChannel, ConcurrentSendersFromTwoDecodeWorkers) {
  auto prefill = start(prefill_options("p0"));
  auto d0 = start(decode_options("d0"));
  auto d1 = start(decode_options("d1"));
  Collector p{prefill.get(), {}, {}};
  ASSERT_TRUE(d0->connect(prefill->endpoint()).has_value());
  ASSERT_TRUE(d1->connect(prefill->endpoint()).has_value());
  Collector c0{d0.get(), {}, {}};
  Collector c1{d1.get(), {}, {}};
  ASSERT_TRUE(c0.until([&] { return c0.saw_alive("p0"); }));
  ASSERT_TRUE(c1.until([&] { return c1.saw_alive("p0"); }));
  constexpr int kPerThread = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Channel* ch = t % 2 == 0 ? d0.get() : d1.get();
      for (int i = 0; i < kPerThread; ++i) {
        const RoomId room{static_cast<uint64_t>(t) * 1'000'000 + static_cast<uint64_t>(i) + 1};
        ASSERT_TRUE(ch->send("p0", Cancel{room}).has_value());
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(p.until([&] { return p.of<Cancel>().size() == 4 * kPerThread; }));
  for (const Inbound& m : p.messages) {
    const uint64_t t = room_value(std::get<Cancel>(m.message).room) / 1'000'000;
    EXPECT_EQ(m.peer, t % 2 == 0 ? "d0" : "d1");
  }
}

TEST(PdChannel, StartsAndStopsCleanlyManyTimes) {
  for (int i = 0; i < 20; ++i) {
    auto prefill = start(prefill_options("p0"));
    auto decode = start(decode_options("d0"));
    ASSERT_TRUE(decode->connect(prefill->endpoint()).has_value());
    if (i % 2 == 0) decode.reset();  // either order of destruction
  }
}

}  // namespace
}  // namespace strata::pd
