// The PD control plane's sockets: one Channel per worker, with a thread of its own that
// services the ZeroMQ sockets, the handshakes and the heartbeats (docs/pd-disaggregation.md,
// "Channel").
//
// Why a thread of its own. In seed 003 the transfer engine's control plane ran on the
// decode scheduler's event loop; LRU evictions kept that loop busy for seconds, the
// prefill side heard nothing, its 30 s timeout fired and a one-failure blacklist shut the
// decode worker out. Here the channel thread alone reads and writes the sockets and sends
// heartbeats, so a scheduler busy evicting delays only its own handling of the messages
// (which carry their receive time), never the peer's view of it.
//
// Sockets. A prefill worker binds one ROUTER (options.bind_endpoint, e.g. "tcp://127.0.0.1:0";
// port 0 or * picks a free port, endpoint() reports it). A decode worker connects one
// DEALER per prefill worker (connect()), with its worker id as the ZeroMQ identity. A frame
// is one encoded message (pd_messages.h); frames over kMaxMessageBytes close the
// connection before they are read (ZMQ_MAXMSGSIZE).
//
// Handshake. Each side sends Hello until it has heard the other's Hello (the DEALER every
// heartbeat period; the ROUTER in answer), and Heartbeat every heartbeat_ms afterwards.
// Hello's peer_incarnation makes it end after at most three Hellos, for fresh connections
// and for either side restarting. A Hello is refused (counted in bad_handshakes, the peer
// stays unknown) for another protocol version, a role other than the opposite one, another
// kv_layout, a worker id that is not the connection's identity, or one already alive on
// another connection. A peer that sends anything else before its Hello is answered with our
// Hello (so a restarted worker is re-introduced at once) and its message dropped.
//
// Liveness (pd_peers.h): a peer silent for more than peer_timeout_ms is dead; any message
// from it makes it alive again. poll() reports these changes. Health is heartbeats only: no
// count of failed rooms ever makes a peer unusable.
//
// Direction. A decode worker takes OrderAccepted, OrderRejected, PagesWritten, PrefillDone
// and PrefillFailed; a prefill worker takes PrefillOrder (whose decode_worker_id must be the
// sender) and Cancel. Anything else is dropped and counted (protocol_errors).
//
// Queues and their bounds.
//   - send() encodes on the caller's thread and queues the bytes; it never blocks. A full
//     outbox (max_outbox_messages) answers kResourceExhausted. A message the channel thread
//     cannot hand to ZeroMQ at once (the peer's pipe full, the peer gone) is dropped and
//     counted (send_dropped): the room it was for then fails by its own deadline.
//   - Received messages wait in the inbox for poll(). When max_inbox_messages wait, a new
//     message is dropped and counted (inbox_dropped), except that a dropped PrefillOrder is
//     answered at once with OrderRejected (reason "inbox full", retry_after_ms =
//     heartbeat_ms), so the decode worker prefills locally without waiting for its accept
//     deadline. Every other drop ends in a room deadline (stall, accept) or a lease deadline,
//     never in a leak. Heartbeats never enter the inbox, so a full inbox never kills a peer.
//   - Peer changes are kept per peer (at most max_peers), coalesced until poll().
//
// Thread: every public method is thread-safe and returns without waiting on the network
// (connect() and disconnect() wait for the channel thread to create or close the socket,
// not for the peer). The notify callback runs on the channel thread. Destruction stops the
// thread and closes every socket (linger 0): messages still queued are dropped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/result.h"
#include "pd/pd_messages.h"

namespace strata::pd {

struct ChannelOptions {
  std::string worker_id;  // this worker's id and ZeroMQ identity (valid_worker_id)
  Role role = Role::kDecode;
  // Prefill: the ROUTER's endpoint ("tcp://HOST:PORT"; PORT 0 or * for a free one).
  // Decode: must be empty.
  std::string bind_endpoint;
  // Hello's kv_layout (pd_messages.h): peers that describe their pages otherwise are refused.
  std::string kv_layout;
  int64_t heartbeat_ms = 500;      // heartbeat period, in [5, 60000]
  int64_t peer_timeout_ms = 3000;  // silence that makes a peer dead, >= 2 * heartbeat_ms, <= 600000
  size_t max_inbox_messages = 4096;    // received messages waiting for poll(), in [1, 2^20]
  size_t max_outbox_messages = 16384;  // messages waiting to be sent, in [1, 2^20]
  size_t max_peers = 1024;             // peers known (alive or dead), in [1, 65536]
  // Time for liveness and receive stamps; nullptr: SteadyClock. Must outlive the channel.
  const Clock* clock = nullptr;

  Status validate() const;
};

// A message received from a peer that passed the handshake.
struct Inbound {
  std::string peer;         // the sender's worker id
  int64_t received_ms = 0;  // the channel's clock when the channel thread read it
  Message message;
};

// A peer's liveness changed since the last poll().
struct PeerChange {
  std::string peer;
  Role role = Role::kDecode;
  bool alive = false;  // now
  // It died (timeout) or restarted since the last poll(), even if alive again now: every
  // room ordered from it before this poll (decode side) or lease it holds (prefill side)
  // is lost. Fail them (DecodeRooms::fail_peer, PrefillLeases::on_peer_dead).
  bool lost = false;
  std::string endpoint;  // decode side: the endpoint it was reached at; empty on prefill
};

struct ChannelEvents {
  std::vector<PeerChange> peers;  // apply these first
  std::vector<Inbound> messages;  // in the order received
};

struct ChannelStats {
  uint64_t messages_sent = 0;      // handed to ZeroMQ, heartbeats and Hellos included
  uint64_t messages_received = 0;  // frames read, before any check
  uint64_t heartbeats_sent = 0;
  uint64_t heartbeats_received = 0;
  uint64_t hellos_sent = 0;
  uint64_t send_dropped = 0;     // could not be handed to ZeroMQ (peer gone or pipe full)
  uint64_t outbox_refused = 0;   // send() answered kResourceExhausted
  uint64_t inbox_dropped = 0;    // received while the inbox was full
  uint64_t decode_errors = 0;    // frames that decode_message refused
  uint64_t bad_handshakes = 0;   // Hellos refused, and frames of another protocol version
  uint64_t unknown_peer = 0;     // messages from a peer before its Hello (answered with Hello)
  uint64_t protocol_errors = 0;  // wrong direction, forged sender fields, bad framing
  uint64_t peers_alive = 0;
  uint64_t peer_deaths = 0;  // deaths and restarts seen
  std::string last_error;    // the latest refused frame or handshake, for diagnostics
};

class Channel {
 public:
  // Validates the options, creates (prefill: binds) the socket and starts the thread.
  // kInvalidArgument for bad options or an endpoint that cannot be bound.
  static Result<std::unique_ptr<Channel>> start(ChannelOptions options);
  ~Channel();

  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  const std::string& worker_id() const;
  Role role() const;
  // Prefill: the bound endpoint with its port resolved ("tcp://127.0.0.1:40123").
  const std::string& endpoint() const;
  uint64_t incarnation() const;

  // Decode only: a DEALER to the prefill worker at `endpoint`; the handshake then runs in
  // the background and poll() reports the peer once it is up. Connecting an endpoint
  // already connected does nothing. kInvalidArgument for a prefill channel or an endpoint
  // ZeroMQ refuses, kResourceExhausted past max_peers connections.
  Status connect(std::string_view endpoint);
  // Decode only: closes the DEALER to `endpoint`; its peer is reported lost. kNotFound when
  // not connected.
  Status disconnect(std::string_view endpoint);

  // Queues `message` for `peer` (a worker id that passed the handshake and is alive).
  // kInvalidArgument for a message validate_message refuses, kNotFound for a peer that is
  // not alive now, kResourceExhausted when the outbox is full. Never blocks.
  Status send(std::string_view peer, const Message& message);

  // Takes the peer changes and up to max_messages received messages. Never blocks.
  ChannelEvents poll(size_t max_messages = std::numeric_limits<size_t>::max());
  // Waits until poll() would return something, or timeout_ms passed; true when it would.
  bool wait(int64_t timeout_ms);
  // Called on the channel thread whenever the inbox or the peer changes go from empty to
  // not empty (e.g. to wake a scheduler). Must be quick and must not call the channel.
  void set_notify(std::function<void()> notify);

  bool peer_alive(std::string_view peer) const;
  std::vector<std::string> alive_peers() const;
  ChannelStats stats() const;

  struct Impl;

 private:
  explicit Channel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::pd
