#include "pd/pd_channel.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <zmq.hpp>

#include <fmt/format.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_set>
#include <utility>

#include "common/check.h"
#include "common/log.h"
#include "pd/pd_peers.h"

namespace strata::pd {
namespace {

// The value of `name` in a KV layout of ';'-separated name=value fields (cmd_serve's
// kv_layout: "<namespace>;layers=..;kv_heads=..;head_dim=..;dtype=.."); "" without it.
std::string_view layout_field(std::string_view layout, std::string_view name) {
  size_t at = 0;
  while (at <= layout.size()) {
    const size_t end = std::min(layout.find(';', at), layout.size());
    const std::string_view field = layout.substr(at, end - at);
    if (field.size() > name.size() && field.substr(0, name.size()) == name &&
        field[name.size()] == '=') {
      return field.substr(name.size() + 1);
    }
    at = end + 1;
  }
  return {};
}

// Messages read from one socket per loop turn, so that one chatty peer cannot keep the
// thread from the others and from the heartbeats.
constexpr int kMaxReadsPerTurn = 256;
// Frames queued per peer pipe inside ZeroMQ before a send is refused (then dropped).
constexpr int kPipeHighWater = 10'000;
// At most one warning per this many ms; the rest go to the debug log (counted anyway).
constexpr int64_t kWarnEveryMs = 5'000;

uint64_t random_incarnation() {
  std::random_device entropy;
  for (;;) {
    const uint64_t v = (uint64_t{entropy()} << 32) | entropy();
    if (v != 0) return v;
  }
}

// "tcp://host:0" -> "tcp://host:*": ZeroMQ's spelling of "any free port".
std::string normalize_bind(std::string endpoint) {
  if (endpoint.size() >= 2 && endpoint.ends_with(":0")) {
    endpoint.replace(endpoint.size() - 1, 1, "*");
  }
  return endpoint;
}

bool allowed_from_peer(Role self, const Message& m) {
  if (self == Role::kPrefill) {
    return std::holds_alternative<PrefillOrder>(m) || std::holds_alternative<Cancel>(m);
  }
  return std::holds_alternative<OrderAccepted>(m) || std::holds_alternative<OrderRejected>(m) ||
         std::holds_alternative<PagesWritten>(m) || std::holds_alternative<PrefillDone>(m) ||
         std::holds_alternative<PrefillFailed>(m);
}

}  // namespace

Status ChannelOptions::validate() const {
  const auto bad = [](std::string what) {
    return make_error(ErrorCode::kInvalidArgument, "PD channel: " + std::move(what));
  };
  if (!valid_worker_id(worker_id)) {
    return bad(fmt::format("worker id '{}' must be 1..{} printable ASCII characters, no space",
                           worker_id, kMaxWorkerIdBytes));
  }
  if (role == Role::kPrefill && bind_endpoint.empty()) {
    return bad("a prefill worker needs an endpoint to bind (--pd-bind)");
  }
  if (role == Role::kDecode && !bind_endpoint.empty()) {
    return bad("a decode worker connects to prefill workers and binds nothing");
  }
  if (kv_layout.size() > kMaxKvLayoutBytes) {
    return bad(fmt::format("kv_layout is more than {} bytes", kMaxKvLayoutBytes));
  }
  if (heartbeat_ms < 5 || heartbeat_ms > 60'000) return bad("heartbeat_ms must be 5..60000");
  if (peer_timeout_ms < 2 * heartbeat_ms || peer_timeout_ms > 600'000) {
    return bad("peer_timeout_ms must be 2 * heartbeat_ms..600000");
  }
  if (max_inbox_messages < 1 || max_inbox_messages > (size_t{1} << 20)) {
    return bad("max_inbox_messages must be 1..2^20");
  }
  if (max_outbox_messages < 1 || max_outbox_messages > (size_t{1} << 20)) {
    return bad("max_outbox_messages must be 1..2^20");
  }
  if (max_peers < 1 || max_peers > 65'536) return bad("max_peers must be 1..65536");
  return {};
}

struct Channel::Impl {
  // A DEALER to one prefill worker (decode side).
  struct Dealer {
    std::string endpoint;
    zmq::socket_t socket;
    std::string peer;               // its worker id, from its Hello; empty until then
    uint64_t peer_incarnation = 0;  // from its Hello
  };
  // Where a frame came from, and where its answers go.
  struct Source {
    Dealer* dealer = nullptr;  // decode side
    std::string identity;      // prefill side: the DEALER's identity
  };
  struct Command {
    bool connect = true;  // else disconnect
    std::string endpoint;
    std::promise<Status> done;
  };
  struct Counters {
    std::atomic<uint64_t> messages_sent{0}, messages_received{0}, heartbeats_sent{0},
        heartbeats_received{0}, hellos_sent{0}, send_dropped{0}, outbox_refused{0},
        inbox_dropped{0}, decode_errors{0}, bad_handshakes{0}, unknown_peer{0}, protocol_errors{0},
        peer_deaths{0};
  };

  explicit Impl(ChannelOptions opts)
      : options(std::move(opts)),
        clock(options.clock != nullptr ? options.clock : &SteadyClock::instance()),
        incarnation(random_incarnation()),
        peers(PeerTableOptions{options.peer_timeout_ms, options.max_peers}) {}

  ~Impl() {
    if (wake_fd >= 0) ::close(wake_fd);
  }

  const ChannelOptions options;
  const Clock* const clock;
  const uint64_t incarnation;
  std::string endpoint;  // prefill: resolved at start
  int wake_fd = -1;      // eventfd: send() and commands wake the thread through it

  // Declared before the sockets, so it is destroyed after them.
  zmq::context_t context{1};
  std::optional<zmq::socket_t> router;           // prefill; the channel thread's after start
  std::vector<std::unique_ptr<Dealer>> dealers;  // decode; channel thread only

  mutable std::mutex mutex;
  std::condition_variable events_cv;
  std::deque<std::pair<std::string, std::string>> outbox;  // GUARDED_BY(mutex)
  std::deque<Inbound> inbox;                               // GUARDED_BY(mutex)
  std::map<std::string, PeerChange> changes;               // GUARDED_BY(mutex)
  std::unordered_set<std::string> alive;                   // GUARDED_BY(mutex)
  std::deque<Command> commands;                            // GUARDED_BY(mutex)
  std::function<void()> notify;                            // GUARDED_BY(mutex)
  std::string last_error;                                  // GUARDED_BY(mutex)
  bool stopping = false;                                   // GUARDED_BY(mutex)
  Counters counters;

  // Channel thread only.
  PeerTable peers;
  uint64_t heartbeat_seq = 0;
  int64_t next_heartbeat_ms = 0;
  int64_t last_warn_ms = std::numeric_limits<int64_t>::min() / 2;
  std::thread thread;

  void wake() {
    const uint64_t one = 1;
    // A full counter (2^64 - 2 wakes pending) cannot happen; a failed write only delays
    // the thread to its next heartbeat.
    [[maybe_unused]] const auto n = ::write(wake_fd, &one, sizeof one);
  }

  // ----- channel thread -----

  void run() {
    for (;;) {
      std::vector<zmq::pollitem_t> items;
      items.push_back({nullptr, wake_fd, ZMQ_POLLIN, 0});
      if (router) items.push_back({router->handle(), 0, ZMQ_POLLIN, 0});
      for (auto& d : dealers) items.push_back({d->socket.handle(), 0, ZMQ_POLLIN, 0});
      const int64_t wait_ms =
          std::clamp<int64_t>(next_heartbeat_ms - clock->now_ms(), 0, options.heartbeat_ms);
      try {
        zmq::poll(items, std::chrono::milliseconds(wait_ms));
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) note_error(fmt::format("poll failed: {}", e.what()));
      }
      if (items[0].revents & ZMQ_POLLIN) {
        uint64_t count = 0;
        [[maybe_unused]] const auto n = ::read(wake_fd, &count, sizeof count);
      }
      {
        std::lock_guard lock(mutex);
        if (stopping) break;
      }
      run_commands();
      flush_outbox();
      if (router) receive_router();
      for (size_t i = 0; i < dealers.size(); ++i) receive_dealer(*dealers[i]);
      if (clock->now_ms() >= next_heartbeat_ms) heartbeat_and_check();
    }
    // Linger 0: queued frames are dropped, close never waits on a peer.
    router.reset();
    dealers.clear();
  }

  void note_error(std::string what) {
    const int64_t now = clock->now_ms();
    if (now - last_warn_ms >= kWarnEveryMs) {
      last_warn_ms = now;
      STRATA_LOG_WARN("PD channel {}: {}", options.worker_id, what);
    } else {
      STRATA_LOG_DEBUG("PD channel {}: {}", options.worker_id, what);
    }
    std::lock_guard lock(mutex);
    last_error = std::move(what);
  }

  void run_commands() {
    std::deque<Command> todo;
    {
      std::lock_guard lock(mutex);
      todo.swap(commands);
    }
    for (Command& c : todo) {
      c.done.set_value(c.connect ? do_connect(c.endpoint) : do_disconnect(c.endpoint));
    }
  }

  Status do_connect(const std::string& ep) {
    for (const auto& d : dealers) {
      if (d->endpoint == ep) return {};
    }
    if (dealers.size() >= options.max_peers) {
      return make_error(
          ErrorCode::kResourceExhausted,
          fmt::format("PD channel: {} prefill workers connected already", dealers.size()));
    }
    auto d = std::make_unique<Dealer>();
    d->endpoint = ep;
    try {
      d->socket = zmq::socket_t(context, zmq::socket_type::dealer);
      d->socket.set(zmq::sockopt::linger, 0);
      d->socket.set(zmq::sockopt::routing_id, options.worker_id);
      d->socket.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(kMaxMessageBytes));
      d->socket.set(zmq::sockopt::sndhwm, kPipeHighWater);
      d->socket.set(zmq::sockopt::rcvhwm, kPipeHighWater);
      d->socket.set(zmq::sockopt::reconnect_ivl, 100);
      d->socket.set(zmq::sockopt::reconnect_ivl_max,
                    static_cast<int>(std::max<int64_t>(100, options.heartbeat_ms)));
      d->socket.connect(ep);
    } catch (const zmq::error_t& e) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("PD channel: cannot connect to '{}': {}", ep, e.what()));
    }
    // Queued until the connection is up (ZMQ_IMMEDIATE off), so the handshake starts the
    // moment it is; heartbeats repeat it until answered.
    send_hello(Source{d.get(), {}}, 0);
    dealers.push_back(std::move(d));
    return {};
  }

  Status do_disconnect(const std::string& ep) {
    auto it = std::find_if(dealers.begin(), dealers.end(),
                           [&](const auto& d) { return d->endpoint == ep; });
    if (it == dealers.end()) {
      return make_error(ErrorCode::kNotFound, fmt::format("PD channel: not connected to '{}'", ep));
    }
    const std::string peer = (*it)->peer;
    if (!peer.empty()) {
      const auto info = peers.find(peer);
      if (peers.mark_dead(peer)) {
        ++counters.peer_deaths;
        record_change(peer, info ? info->role : Role::kPrefill, false, true, ep);
      }
    }
    dealers.erase(it);
    return {};
  }

  // Sends one frame without waiting; false (counted by the caller) when ZeroMQ refuses it.
  bool send_raw(const Source& to, const std::string& bytes) {
    try {
      if (to.dealer != nullptr) {
        if (!to.dealer->socket.send(zmq::buffer(bytes), zmq::send_flags::dontwait)) return false;
      } else {
        if (!router) return false;
        if (!router->send(zmq::buffer(to.identity),
                          zmq::send_flags::dontwait | zmq::send_flags::sndmore)) {
          return false;
        }
        // The second part of a message whose first part was taken is always taken.
        (void)router->send(zmq::buffer(bytes), zmq::send_flags::dontwait);
      }
    } catch (const zmq::error_t& e) {
      // EHOSTUNREACH: no connection with that identity (ROUTER_MANDATORY).
      STRATA_LOG_DEBUG("PD channel {}: send failed: {}", options.worker_id, e.what());
      return false;
    }
    ++counters.messages_sent;
    return true;
  }

  void send_hello(const Source& to, uint64_t peer_incarnation) {
    Hello h;
    h.worker_id = options.worker_id;
    h.role = options.role;
    h.incarnation = incarnation;
    h.peer_incarnation = peer_incarnation;
    h.kv_layout = options.kv_layout;
    auto bytes = encode_message(h);
    STRATA_CHECK_MSG(bytes.has_value(), bytes.error().message);
    if (send_raw(to, *bytes)) ++counters.hellos_sent;
  }

  Dealer* dealer_of(std::string_view peer) {
    for (auto& d : dealers) {
      if (d->peer == peer) return d.get();
    }
    return nullptr;
  }

  void flush_outbox() {
    std::deque<std::pair<std::string, std::string>> todo;
    {
      std::lock_guard lock(mutex);
      todo.swap(outbox);
    }
    for (auto& [peer, bytes] : todo) {
      Source to;
      if (options.role == Role::kDecode) {
        to.dealer = dealer_of(peer);
        if (to.dealer == nullptr) {
          ++counters.send_dropped;
          continue;
        }
      } else {
        to.identity = peer;
      }
      if (!send_raw(to, bytes)) ++counters.send_dropped;
    }
  }

  void receive_router() {
    for (int i = 0; i < kMaxReadsPerTurn; ++i) {
      zmq::message_t identity;
      zmq::message_t payload;
      try {
        if (!router->recv(identity, zmq::recv_flags::dontwait)) return;
        if (!identity.more()) {
          ++counters.protocol_errors;
          continue;
        }
        (void)router->recv(payload, zmq::recv_flags::none);  // parts arrive together
        bool extra = false;
        while (payload.more()) {
          extra = true;
          (void)router->recv(payload, zmq::recv_flags::none);
        }
        if (extra) {
          ++counters.protocol_errors;
          note_error("a frame of several parts from " + identity.to_string());
          continue;
        }
      } catch (const zmq::error_t& e) {
        note_error(fmt::format("receive failed: {}", e.what()));
        return;
      }
      handle_frame(Source{nullptr, identity.to_string()}, payload);
    }
  }

  void receive_dealer(Dealer& d) {
    for (int i = 0; i < kMaxReadsPerTurn; ++i) {
      zmq::message_t payload;
      try {
        if (!d.socket.recv(payload, zmq::recv_flags::dontwait)) return;
        if (payload.more()) {
          while (payload.more()) (void)d.socket.recv(payload, zmq::recv_flags::none);
          ++counters.protocol_errors;
          note_error("a frame of several parts from " + d.endpoint);
          continue;
        }
      } catch (const zmq::error_t& e) {
        note_error(fmt::format("receive from {} failed: {}", d.endpoint, e.what()));
        return;
      }
      handle_frame(Source{&d, {}}, payload);
    }
  }

  std::string describe(const Source& from) const {
    return from.dealer != nullptr ? from.dealer->endpoint : "'" + from.identity + "'";
  }

  void handle_frame(const Source& from, const zmq::message_t& payload) {
    ++counters.messages_received;
    auto decoded = decode_message(std::string_view(payload.data<char>(), payload.size()));
    if (!decoded) {
      if (decoded.error().code == ErrorCode::kUnsupported) {
        ++counters.bad_handshakes;
      } else {
        ++counters.decode_errors;
      }
      note_error(
          fmt::format("refused a frame from {}: {}", describe(from), decoded.error().message));
      return;
    }
    const int64_t now = clock->now_ms();
    if (auto* hello = std::get_if<Hello>(&*decoded)) {
      handle_hello(from, *hello, now);
      return;
    }
    const std::string peer = from.dealer != nullptr ? from.dealer->peer : from.identity;
    const HeardOutcome heard = peer.empty() ? HeardOutcome::kUnknown : peers.on_heard(peer, now);
    if (heard == HeardOutcome::kUnknown) {
      // It knows us but we do not know it (we restarted, or its Hello was lost): introduce
      // ourselves, so that it answers with its Hello.
      ++counters.unknown_peer;
      send_hello(from, 0);
      return;
    }
    if (heard == HeardOutcome::kRevived) {
      const auto info = peers.find(peer);
      record_change(peer, info ? info->role : Role::kDecode, true, false, endpoint_of(from));
    }
    if (const auto* hb = std::get_if<Heartbeat>(&*decoded)) {
      if (hb->worker_id != peer) {
        ++counters.protocol_errors;
        note_error(fmt::format("a heartbeat from {} names {}", peer, hb->worker_id));
        return;
      }
      ++counters.heartbeats_received;
      return;
    }
    if (!allowed_from_peer(options.role, *decoded)) {
      ++counters.protocol_errors;
      note_error(fmt::format("{} from {} is not for a {} worker", message_kind(*decoded), peer,
                             role_name(options.role)));
      return;
    }
    if (const auto* order = std::get_if<PrefillOrder>(&*decoded);
        order != nullptr && order->decode_worker_id != peer) {
      ++counters.protocol_errors;
      note_error(
          fmt::format("an order from {} names decode worker {}", peer, order->decode_worker_id));
      return;
    }
    deliver(from, Inbound{peer, now, std::move(*decoded)});
  }

  std::string endpoint_of(const Source& from) const {
    return from.dealer != nullptr ? from.dealer->endpoint : std::string();
  }

  void handle_hello(const Source& from, const Hello& h, int64_t now) {
    const Role want = options.role == Role::kPrefill ? Role::kDecode : Role::kPrefill;
    std::string refusal;
    if (h.role != want) {
      refusal = fmt::format("it is a {} worker, a {} worker needs {} peers", role_name(h.role),
                            role_name(options.role), role_name(want));
    } else if (const std::string_view theirs = layout_field(h.kv_layout, "dtype"),
               ours = layout_field(options.kv_layout, "dtype");
               theirs != ours) {
      // Pages of another element type are other bytes (issue 54): said first and plainly.
      refusal = fmt::format(
          "its KV pages are {} and ours {} (--kv-cache-dtype must be the same on both sides)",
          theirs.empty() ? "unnamed" : theirs, ours.empty() ? "unnamed" : ours);
    } else if (h.kv_layout != options.kv_layout) {
      refusal = fmt::format("its KV layout '{}' is not ours '{}'", h.kv_layout, options.kv_layout);
    } else if (h.worker_id == options.worker_id) {
      refusal = "it has our own worker id";
    } else if (from.dealer == nullptr && h.worker_id != from.identity) {
      refusal =
          fmt::format("it names itself {} on the connection of {}", h.worker_id, from.identity);
    } else if (from.dealer != nullptr) {
      for (const auto& d : dealers) {
        if (d.get() != from.dealer && d->peer == h.worker_id && peers.alive(h.worker_id)) {
          refusal = fmt::format("{} is alive at {} already", h.worker_id, d->endpoint);
        }
      }
    }
    if (!refusal.empty()) {
      ++counters.bad_handshakes;
      note_error(
          fmt::format("refused the Hello of {} from {}: {}", h.worker_id, describe(from), refusal));
      return;
    }
    if (from.dealer != nullptr && !from.dealer->peer.empty() && from.dealer->peer != h.worker_id) {
      // Another worker now answers at this endpoint: the previous one is gone from here.
      const std::string old = from.dealer->peer;
      if (peers.mark_dead(old)) {
        ++counters.peer_deaths;
        record_change(old, Role::kPrefill, false, true, from.dealer->endpoint);
      }
    }
    auto outcome = peers.on_hello(h, now);
    if (!outcome) {
      ++counters.bad_handshakes;
      note_error(fmt::format("refused the Hello of {}: {}", h.worker_id, outcome.error().message));
      return;
    }
    if (from.dealer != nullptr) {
      for (auto& d : dealers) {
        if (d.get() != from.dealer && d->peer == h.worker_id) d->peer.clear();
      }
      from.dealer->peer = h.worker_id;
      from.dealer->peer_incarnation = h.incarnation;
    }
    switch (*outcome) {
      case HelloOutcome::kNew:
      case HelloOutcome::kRevived:
        record_change(h.worker_id, h.role, true, false, endpoint_of(from));
        break;
      case HelloOutcome::kRestarted:
        ++counters.peer_deaths;
        record_change(h.worker_id, h.role, true, true, endpoint_of(from));
        break;
      case HelloOutcome::kUnchanged:
        break;
    }
    if (h.peer_incarnation != incarnation) send_hello(from, h.incarnation);
  }

  // Records a liveness change for poll() and updates the snapshot that send() checks.
  void record_change(const std::string& peer, Role role, bool now_alive, bool lost,
                     const std::string& ep) {
    std::lock_guard lock(mutex);
    const bool was_empty = inbox.empty() && changes.empty();
    auto [it, inserted] = changes.try_emplace(peer);
    PeerChange& c = it->second;
    c.peer = peer;
    c.role = role;
    c.alive = now_alive;
    c.lost = inserted ? lost : (c.lost || lost);
    if (!ep.empty()) c.endpoint = ep;
    if (now_alive) {
      alive.insert(peer);
    } else {
      alive.erase(peer);
    }
    signal_locked(was_empty);
  }

  void deliver(const Source& from, Inbound in) {
    std::unique_lock lock(mutex);
    if (inbox.size() >= options.max_inbox_messages) {
      lock.unlock();
      ++counters.inbox_dropped;
      if (const auto* order = std::get_if<PrefillOrder>(&in.message)) {
        OrderRejected reject{order->room, "the prefill worker's inbox is full",
                             options.heartbeat_ms};
        auto bytes = encode_message(reject);
        STRATA_CHECK_MSG(bytes.has_value(), bytes.error().message);
        if (!send_raw(from, *bytes)) ++counters.send_dropped;
      }
      note_error(fmt::format("inbox full ({} messages): dropped {} from {}",
                             options.max_inbox_messages, message_kind(in.message), in.peer));
      return;
    }
    const bool was_empty = inbox.empty() && changes.empty();
    inbox.push_back(std::move(in));
    signal_locked(was_empty);
  }

  void signal_locked(bool was_empty) {
    events_cv.notify_all();
    // Under the lock, so that once set_notify(nullptr) returns no call is under way.
    if (was_empty && notify) notify();
  }

  void heartbeat_and_check() {
    const int64_t now = clock->now_ms();
    if (options.role == Role::kPrefill) {
      // Only live peers: a dead one that is still there keeps heartbeating us, which
      // revives it, and then hears from us again.
      for (const PeerInfo& p : peers.list()) {
        if (!p.alive) continue;
        send_heartbeat(Source{nullptr, p.worker_id});
      }
    } else {
      for (auto& d : dealers) {
        if (d->peer.empty()) {
          send_hello(Source{d.get(), {}}, 0);
        } else {
          // Even to a peer we think dead: if it is only slow, our heartbeats revive us there.
          send_heartbeat(Source{d.get(), {}});
        }
      }
    }
    for (const std::string& dead : peers.tick(now)) {
      ++counters.peer_deaths;
      const auto info = peers.find(dead);
      std::string ep;
      if (Dealer* d = dealer_of(dead)) ep = d->endpoint;
      record_change(dead, info ? info->role : Role::kDecode, false, true, ep);
      note_error(fmt::format("peer {} is dead: silent for more than {} ms", dead,
                             options.peer_timeout_ms));
    }
    next_heartbeat_ms = now + options.heartbeat_ms;
  }

  void send_heartbeat(const Source& to) {
    Heartbeat hb{options.worker_id, heartbeat_seq++};
    auto bytes = encode_message(hb);
    STRATA_CHECK_MSG(bytes.has_value(), bytes.error().message);
    if (send_raw(to, *bytes)) {
      ++counters.heartbeats_sent;
    } else {
      ++counters.send_dropped;
    }
  }
};

Result<std::unique_ptr<Channel>> Channel::start(ChannelOptions options) {
  if (auto s = options.validate(); !s) return std::unexpected(s.error());
  auto impl = std::make_unique<Impl>(std::move(options));
  impl->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl->wake_fd < 0) {
    return make_error(ErrorCode::kIoError, "PD channel: eventfd failed");
  }
  if (impl->options.role == Role::kPrefill) {
    const std::string bind = normalize_bind(impl->options.bind_endpoint);
    try {
      impl->router.emplace(impl->context, zmq::socket_type::router);
      impl->router->set(zmq::sockopt::linger, 0);
      impl->router->set(zmq::sockopt::router_mandatory, 1);
      // A restarted decode worker reconnects under its old identity before the old
      // connection is noticed closed: the new connection takes the identity over.
      impl->router->set(zmq::sockopt::router_handover, 1);
      impl->router->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(kMaxMessageBytes));
      impl->router->set(zmq::sockopt::sndhwm, kPipeHighWater);
      impl->router->set(zmq::sockopt::rcvhwm, kPipeHighWater);
      impl->router->bind(bind);
      impl->endpoint = impl->router->get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      return make_error(
          ErrorCode::kInvalidArgument,
          fmt::format("PD channel: cannot bind '{}': {}", impl->options.bind_endpoint, e.what()));
    }
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->run(); });
  return std::unique_ptr<Channel>(new Channel(std::move(impl)));
}

Channel::Channel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Channel::~Channel() {
  std::deque<Impl::Command> orphaned;
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->wake();
  impl_->thread.join();
  // Commands that arrived after the thread's last turn (only possible while the channel is
  // being destroyed, i.e. a caller's bug) are answered rather than left hanging.
  {
    std::lock_guard lock(impl_->mutex);
    orphaned.swap(impl_->commands);
    impl_->events_cv.notify_all();
  }
  for (auto& c : orphaned) {
    c.done.set_value(make_error(ErrorCode::kFailedPrecondition, "PD channel: stopped"));
  }
}

const std::string& Channel::worker_id() const {
  return impl_->options.worker_id;
}
Role Channel::role() const {
  return impl_->options.role;
}
const std::string& Channel::endpoint() const {
  return impl_->endpoint;
}
uint64_t Channel::incarnation() const {
  return impl_->incarnation;
}

Status Channel::connect(std::string_view endpoint) {
  if (impl_->options.role != Role::kDecode) {
    return make_error(ErrorCode::kInvalidArgument, "PD channel: only a decode worker connects");
  }
  if (endpoint.empty()) return make_error(ErrorCode::kInvalidArgument, "PD channel: no endpoint");
  std::future<Status> done;
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->stopping) {
      return make_error(ErrorCode::kFailedPrecondition, "PD channel: stopped");
    }
    impl_->commands.push_back(Impl::Command{true, std::string(endpoint), {}});
    done = impl_->commands.back().done.get_future();
  }
  impl_->wake();
  return done.get();
}

Status Channel::disconnect(std::string_view endpoint) {
  if (impl_->options.role != Role::kDecode) {
    return make_error(ErrorCode::kInvalidArgument, "PD channel: only a decode worker connects");
  }
  std::future<Status> done;
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->stopping) {
      return make_error(ErrorCode::kFailedPrecondition, "PD channel: stopped");
    }
    impl_->commands.push_back(Impl::Command{false, std::string(endpoint), {}});
    done = impl_->commands.back().done.get_future();
  }
  impl_->wake();
  return done.get();
}

Status Channel::send(std::string_view peer, const Message& message) {
  auto bytes = encode_message(message);
  if (!bytes) return std::unexpected(bytes.error());
  {
    std::lock_guard lock(impl_->mutex);
    if (!impl_->alive.contains(std::string(peer))) {
      return make_error(ErrorCode::kNotFound,
                        fmt::format("PD channel: peer '{}' is not connected (no handshake yet, "
                                    "or dead)",
                                    peer));
    }
    if (impl_->outbox.size() >= impl_->options.max_outbox_messages) {
      ++impl_->counters.outbox_refused;
      return make_error(
          ErrorCode::kResourceExhausted,
          fmt::format("PD channel: {} messages waiting to be sent", impl_->outbox.size()));
    }
    impl_->outbox.emplace_back(std::string(peer), std::move(*bytes));
  }
  impl_->wake();
  return {};
}

ChannelEvents Channel::poll(size_t max_messages) {
  ChannelEvents out;
  std::lock_guard lock(impl_->mutex);
  out.peers.reserve(impl_->changes.size());
  for (auto& [peer, change] : impl_->changes) out.peers.push_back(std::move(change));
  impl_->changes.clear();
  const size_t n = std::min(max_messages, impl_->inbox.size());
  out.messages.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    out.messages.push_back(std::move(impl_->inbox.front()));
    impl_->inbox.pop_front();
  }
  return out;
}

bool Channel::wait(int64_t timeout_ms) {
  std::unique_lock lock(impl_->mutex);
  return impl_->events_cv.wait_for(
      lock, std::chrono::milliseconds(std::max<int64_t>(0, timeout_ms)),
      [this] { return !impl_->inbox.empty() || !impl_->changes.empty(); });
}

void Channel::set_notify(std::function<void()> notify) {
  std::lock_guard lock(impl_->mutex);
  impl_->notify = std::move(notify);
}

bool Channel::peer_alive(std::string_view peer) const {
  std::lock_guard lock(impl_->mutex);
  return impl_->alive.contains(std::string(peer));
}

std::vector<std::string> Channel::alive_peers() const {
  std::lock_guard lock(impl_->mutex);
  std::vector<std::string> out(impl_->alive.begin(), impl_->alive.end());
  std::sort(out.begin(), out.end());
  return out;
}

ChannelStats Channel::stats() const {
  const auto& c = impl_->counters;
  ChannelStats s;
  s.messages_sent = c.messages_sent;
  s.messages_received = c.messages_received;
  s.heartbeats_sent = c.heartbeats_sent;
  s.heartbeats_received = c.heartbeats_received;
  s.hellos_sent = c.hellos_sent;
  s.send_dropped = c.send_dropped;
  s.outbox_refused = c.outbox_refused;
  s.inbox_dropped = c.inbox_dropped;
  s.decode_errors = c.decode_errors;
  s.bad_handshakes = c.bad_handshakes;
  s.unknown_peer = c.unknown_peer;
  s.protocol_errors = c.protocol_errors;
  s.peer_deaths = c.peer_deaths;
  std::lock_guard lock(impl_->mutex);
  s.peers_alive = impl_->alive.size();
  s.last_error = impl_->last_error;
  return s;
}

}  // namespace strata::pd
