#include "kvtransfer/ucx_transport.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <ucs/config/global_opts.h>
#include <unistd.h>

#include <fmt/format.h>
#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#include "common/check.h"
#include "common/log.h"
#include "kvtransfer/wire_format.h"

namespace strata {

namespace {

int64_t steady_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t steady_ms() {
  return steady_us() / 1000;
}

std::string ucs_text(ucs_status_t status) {
  return ucs_status_string(status);
}

// Waiting for the closes of the shutdown is bounded so that a UCX that never completes a
// force close cannot hang the destructor; nothing is expected to get near it.
constexpr int64_t kShutdownBoundMs = 10'000;
// While transfers are pending, the progress thread wakes at least this often even when
// the worker's event fd stays quiet, to check deadlines.
constexpr int kBusyWaitCapMs = 10;
constexpr int kIdleWaitCapMs = 100;

// Sets UCX's log level to errors once per process, unless the user chose one: UCX warns
// about things (unused variables, transports it skips) that are not the server's news.
void quiet_ucx_log_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("UCX_LOG_LEVEL") == nullptr &&
        ucs_global_opts.log_component.log_level > UCS_LOG_LEVEL_ERROR) {
      ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_ERROR;
    }
  });
}

}  // namespace

Status UcxTransportOptions::validate() const {
  if (connect_timeout_ms < 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("connect_timeout_ms must be >= 1, got {}", connect_timeout_ms));
  }
  if (message_chunk_bytes < 4096 || message_chunk_bytes > (int64_t{1} << 30)) {
    return make_error(
        ErrorCode::kInvalidArgument,
        fmt::format("message_chunk_bytes must be in [4096, 2^30], got {}", message_chunk_bytes));
  }
  if (idle_spin_us < 0 || idle_spin_us > 1'000'000) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("idle_spin_us must be in [0, 1000000], got {}", idle_spin_us));
  }
  return {};
}

// ---- state ----

struct UcxTransport::State {
  struct Region {
    std::byte* base = nullptr;
    size_t size_bytes = 0;
    ucp_mem_h memh = nullptr;
    bool allocated = false;
    std::vector<std::byte> descriptor;  // framed (id, base, size, rkey)
    int32_t transfers = 0;              // pending transfers reading from it
  };
  struct Peer {
    State* state = nullptr;
    UcxPeerId id{};
    ucp_ep_h ep = nullptr;
    bool peer_failure_detection = false;
    std::optional<Error> failure;  // set once: the peer failed, timed out or was closed
    bool error_reported = false;   // UCX's error callback ran; close it from the loop
    bool closing = false;
    void* close_request = nullptr;
    bool closed = false;  // the endpoint is released
    int32_t transfers = 0;
    std::vector<UcxRemoteRegionId> remote_regions;
  };
  struct RemoteRegion {
    UcxPeerId peer{};
    uint64_t region = 0;        // the peer's UcxRegionId, named in messages
    ucp_rkey_h rkey = nullptr;  // for the put data path only
    uint64_t base = 0;
    uint64_t size_bytes = 0;
  };
  enum class TransferKind { kMessages, kPuts, kProbe };
  // A transfer: pending -> reported (done called) -> freed. UCX holds requests that point
  // at it (`outstanding`: message sends, or the put path's flush); it is complete when
  // those are all back and, for messages, the peer's ack came (or an error decided the
  // outcome first). It is also reported when its endpoint was released first
  // ("abandoned": the endpoint's requests are purged, UCX holds nothing of it). It is
  // freed once reported with nothing outstanding, or with the transport.
  struct Transfer {
    uint64_t id = 0;
    TransferKind kind = TransferKind::kMessages;
    UcxPeerId peer{};
    UcxRegionId local{};
    int64_t deadline_ms = 0;
    int64_t timeout_ms = 0;
    uint64_t bytes = 0;
    TransferDone done;
    int32_t outstanding = 0;           // UCX requests in flight that point here
    ucs_status_t ucx_status = UCS_OK;  // the first failed request's status
    bool acked = false;                // messages: the peer confirmed every byte landed
    std::optional<Error> error;        // decided early: timeout, peer loss, peer refusal
    // Headers of the messages in flight: UCX 1.13 reads a message's header until the send
    // completes (it has no flag to copy it at once), so they live here, at stable
    // addresses, as long as the transfer (which outlives its requests).
    std::deque<std::array<std::byte, 40>> headers;
    bool timed_out = false;
    bool abandoned = false;
    bool reported = false;

    bool complete() const {
      if (outstanding > 0) return false;
      return kind == TransferKind::kPuts || acked || error || ucx_status != UCS_OK;
    }
  };

  UcxTransportOptions options;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int worker_fd = -1;      // owned by the worker
  int wake_fd = -1;        // eventfd, owned
  int epoll_fd = -1;       // owned
  uint64_t sender_id = 0;  // random: tells our acks from stale ones of an earlier process
  std::thread thread;

  // Every field below, and every call on the worker, its endpoints and remote keys.
  mutable std::mutex mutex;
  std::unordered_map<uint64_t, std::unique_ptr<Region>> regions;               // GUARDED_BY
  std::unordered_map<uint64_t, std::unique_ptr<Peer>> peers;                   // GUARDED_BY
  std::unordered_map<uint64_t, std::unique_ptr<RemoteRegion>> remote_regions;  // GUARDED_BY
  std::unordered_map<uint64_t, std::unique_ptr<Transfer>> transfers;           // GUARDED_BY
  std::vector<std::function<void()>> posted;                                   // GUARDED_BY
  uint64_t next_id = 1;                                                        // GUARDED_BY
  bool stopping = false;                                                       // GUARDED_BY
  int64_t stop_started_ms = 0;                                                 // GUARDED_BY
  // PEER mode found unusable once (shared memory only): later connects go straight to
  // none, so UCX logs its "no peer failure handler" error once, not per peer.
  bool peer_mode_unreachable = false;  // GUARDED_BY
  UcxTransportStats stats;             // GUARDED_BY

  void wake() const {
    const uint64_t one = 1;
    // A full counter (never in practice) already means "wake up".
    [[maybe_unused]] ssize_t n = ::write(wake_fd, &one, sizeof one);
  }

  // ---- everything below requires `mutex` ----

  Peer* find_peer(UcxPeerId id) {
    auto it = peers.find(static_cast<uint64_t>(id));
    return it == peers.end() ? nullptr : it->second.get();
  }

  Status usable(const Peer* peer, UcxPeerId id) const {
    if (peer == nullptr) {
      return make_error(ErrorCode::kNotFound,
                        fmt::format("unknown UCX peer {}", static_cast<uint64_t>(id)));
    }
    if (peer->failure) return std::unexpected(*peer->failure);
    return {};
  }

  void destroy_rkeys(Peer& peer) {
    for (UcxRemoteRegionId rid : peer.remote_regions) {
      auto it = remote_regions.find(static_cast<uint64_t>(rid));
      if (it == remote_regions.end()) continue;
      if (it->second->rkey != nullptr) ucp_rkey_destroy(it->second->rkey);
      remote_regions.erase(it);
    }
    peer.remote_regions.clear();
  }

  // Fails the peer with `error` (unless it already failed), gives the same error to its
  // pending transfers that have none yet, and force-closes its endpoint: a failed or
  // stalled endpoint is never reused.
  void fail_peer(Peer& peer, const Error& error, bool count_as_failure) {
    if (!peer.failure) peer.failure = error;
    for (auto& [id, t] : transfers) {
      if (t->peer == peer.id && !t->reported && !t->error) t->error = *peer.failure;
    }
    if (peer.closing) return;
    peer.closing = true;
    if (count_as_failure) ++stats.peers_failed;
    // UCX wants remote keys destroyed after their operations are flushed and before the
    // endpoint goes. With nothing pending that is now; otherwise the force close below
    // first purges the pending operations, and the keys go once the close completed
    // (ucp_rkey_destroy touches only the key and the worker's pool, never the endpoint).
    if (peer.transfers == 0) destroy_rkeys(peer);
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* request = ucp_ep_close_nbx(peer.ep, &param);
    if (UCS_PTR_IS_PTR(request)) {
      peer.close_request = request;
    } else {
      peer.closed = true;  // closed at once (or failed to, which leaves nothing to wait for)
    }
  }

  // Flushes the peer's endpoint for a put transfer whose puts are issued.
  void start_flush(Peer& peer, Transfer& t);
  // Takes a started transfer in; the peer counts it until it is reported.
  void add_transfer(Peer& peer, std::unique_ptr<Transfer> t) {
    ++peer.transfers;
    // A peer error reported while the requests were issued: the loop closes the peer.
    if (peer.failure && !t->error) t->error = *peer.failure;
    transfers.emplace(t->id, std::move(t));
  }

  void close_errored_peers() {
    for (auto& [id, peer] : peers) {
      if (peer->error_reported && !peer->closing) fail_peer(*peer, *peer->failure, true);
    }
  }

  void expire_transfers(int64_t now_ms) {
    for (auto& [id, t] : transfers) {
      if (t->reported || t->complete() || t->timed_out || now_ms < t->deadline_ms) continue;
      t->timed_out = true;
      t->error =
          Error{ErrorCode::kTimeout,
                t->kind == TransferKind::kProbe
                    ? fmt::format("the UCX peer did not answer a read of its region "
                                  "within {} ms",
                                  t->timeout_ms)
                    : fmt::format("KV transfer {} ({} bytes) to UCX peer {} did not complete "
                                  "within {} ms; its endpoint is closed",
                                  t->id, t->bytes, static_cast<uint64_t>(t->peer), t->timeout_ms)};
      if (Peer* peer = find_peer(t->peer); peer != nullptr) {
        fail_peer(*peer,
                  Error{ErrorCode::kTimeout,
                        fmt::format("UCX peer {} closed: transfer {} to it timed out after {} ms",
                                    static_cast<uint64_t>(t->peer), t->id, t->timeout_ms)},
                  true);
      }
    }
  }

  void reap_peers() {
    for (auto it = peers.begin(); it != peers.end();) {
      Peer& peer = *it->second;
      if (peer.close_request != nullptr &&
          ucp_request_check_status(peer.close_request) != UCS_INPROGRESS) {
        ucp_request_free(peer.close_request);
        peer.close_request = nullptr;
        peer.closed = true;
      }
      if (!peer.closed) {
        ++it;
        continue;
      }
      for (auto& [id, t] : transfers) {
        if (t->peer == peer.id && !t->complete()) t->abandoned = true;
      }
      destroy_rkeys(peer);
      it = peers.erase(it);
    }
  }

  void finish_transfers(std::vector<std::function<void()>>& ready) {
    for (auto it = transfers.begin(); it != transfers.end();) {
      Transfer& t = *it->second;
      if (!t.reported && (t.complete() || t.abandoned)) {
        Status status;
        if (t.error) {
          status = std::unexpected(*t.error);
        } else if (t.ucx_status != UCS_OK) {
          status = make_error(ErrorCode::kIoError,
                              fmt::format("KV transfer {} to UCX peer {} failed: {}", t.id,
                                          static_cast<uint64_t>(t.peer), ucs_text(t.ucx_status)));
        } else if (!t.complete()) {
          status = make_error(ErrorCode::kIoError,
                              fmt::format("KV transfer {}: its UCX endpoint was released "
                                          "before the transfer completed",
                                          t.id));
        }
        if (t.kind != TransferKind::kProbe) {
          if (status) {
            ++stats.transfers_ok;
            stats.bytes_put += t.bytes;
          } else {
            ++stats.transfers_failed;
            if (status.error().code == ErrorCode::kTimeout) ++stats.transfers_timed_out;
          }
        }
        if (auto r = regions.find(static_cast<uint64_t>(t.local)); r != regions.end()) {
          --r->second->transfers;
        }
        if (Peer* peer = find_peer(t.peer); peer != nullptr) --peer->transfers;
        t.reported = true;
        ready.push_back([done = std::move(t.done), status = std::move(status)]() mutable {
          done(std::move(status));
        });
      }
      if (t.reported && t.outstanding == 0) {
        it = transfers.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Sends the peer one message of a transfer: `size_bytes` from `data` to `offset` of its
  // region, eager (the receiver copies it in its handler and keeps nothing), asking for an
  // ack when `last`.
  void send_message(Peer& peer, Transfer& t, uint64_t remote_region, uint64_t offset,
                    const std::byte* data, uint64_t size_bytes, bool last);

  bool has_pending_transfers() const {
    for (const auto& [id, t] : transfers) {
      if (!t->reported) return true;
    }
    return false;
  }

  // How long the progress thread may sleep: until the next deadline, capped.
  int wait_ms(int64_t now_ms) const {
    int64_t wait = kIdleWaitCapMs;
    bool busy = false;
    for (const auto& [id, t] : transfers) {
      if (t->reported) continue;
      busy = true;
      wait = std::min(wait, std::max<int64_t>(0, t->deadline_ms - now_ms + 1));
    }
    for (const auto& [id, peer] : peers) busy = busy || peer->closing;
    if (busy) wait = std::min<int64_t>(wait, kBusyWaitCapMs);
    return static_cast<int>(wait);
  }
};

namespace {

// Message headers, in the sender's byte order (peers run the same build on the same
// architecture; the magic catches a mismatch).
constexpr unsigned kAmData = 0x53;  // ids of this transport's active messages
constexpr unsigned kAmAck = 0x54;
constexpr uint32_t kAmMagic = 0x4B565831;  // "KVX1"
constexpr uint32_t kAmFlagLast = 1;        // ack once this message landed

struct AmDataHeader {
  uint32_t magic;
  uint32_t flags;
  uint64_t sender;    // the sender's sender_id
  uint64_t transfer;  // the sender's transfer id
  uint64_t region;    // the receiver's UcxRegionId
  uint64_t offset;    // bytes from the region's base
};

enum class AmStatus : uint32_t { kOk = 0, kBadRegion = 1, kOutOfBounds = 2, kBadMessage = 3 };

struct AmAckHeader {
  uint32_t magic;
  uint32_t status;  // AmStatus
  uint64_t sender;
  uint64_t transfer;
};

// Counts a request of a transfer back (message send or flush).
void on_request_done(void* request, ucs_status_t status, void* user_data) {
  auto* t = static_cast<UcxTransport::State::Transfer*>(user_data);  // freed only after
  --t->outstanding;
  if (status != UCS_OK && t->ucx_status == UCS_OK) t->ucx_status = status;
  ucp_request_free(request);
}

void on_peer_error(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  auto* peer = static_cast<UcxTransport::State::Peer*>(arg);
  if (!peer->failure) {
    peer->failure = Error{
        ErrorCode::kIoError,
        fmt::format("UCX peer {} failed: {}", static_cast<uint64_t>(peer->id), ucs_text(status))};
  }
  // The endpoint must still be closed; the progress loop does it outside UCX's callback.
  peer->error_reported = true;
}

}  // namespace

void UcxTransport::State::start_flush(Peer& peer, Transfer& t) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = on_request_done;
  param.user_data = &t;
  void* flush = ucp_ep_flush_nbx(peer.ep, &param);
  if (UCS_PTR_IS_ERR(flush)) {
    if (t.ucx_status == UCS_OK) t.ucx_status = UCS_PTR_STATUS(flush);
  } else if (flush != nullptr) {
    ++t.outstanding;
  }
}

void UcxTransport::State::send_message(Peer& peer, Transfer& t, uint64_t remote_region,
                                       uint64_t offset, const std::byte* data, uint64_t size_bytes,
                                       bool last) {
  const AmDataHeader header{kAmMagic, last ? kAmFlagLast : 0u, sender_id,
                            t.id,     remote_region,           offset};
  static_assert(sizeof header == std::tuple_size_v<decltype(t.headers)::value_type>);
  std::byte* stored = t.headers.emplace_back().data();  // see Transfer::headers
  std::memcpy(stored, &header, sizeof header);
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  // Eager: the receiver gets the whole message in its handler and acks from there, with no
  // rendezvous state to outlive the sender. REPLY: the ack needs a way back.
  param.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
  param.cb.send = on_request_done;
  param.user_data = &t;
  void* request =
      ucp_am_send_nbx(peer.ep, kAmData, stored, sizeof header, data, size_bytes, &param);
  ++stats.messages;
  if (UCS_PTR_IS_ERR(request)) {
    if (t.ucx_status == UCS_OK) t.ucx_status = UCS_PTR_STATUS(request);
  } else if (request != nullptr) {
    ++t.outstanding;
  }
}

namespace {

void on_ack_sent(void* request, ucs_status_t /*status*/, void* user_data) {
  delete static_cast<AmAckHeader*>(user_data);
  ucp_request_free(request);
}

// The receiver's side of a message: copy it into the region, ack the last one.
ucs_status_t on_am_data(void* arg, const void* header, size_t header_length, void* data,
                        size_t length, const ucp_am_recv_param_t* param) {
  auto& s = *static_cast<UcxTransport::State*>(arg);  // progress thread, mutex held
  AmStatus status = AmStatus::kOk;
  AmDataHeader h{};
  if (header_length != sizeof h) {
    status = AmStatus::kBadMessage;
  } else {
    std::memcpy(&h, header, sizeof h);
    if (h.magic != kAmMagic) status = AmStatus::kBadMessage;
  }
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
    // Senders of this transport send eagerly; a rendezvous is someone else's: drop it.
    ucp_am_data_release(s.worker, data);
    if (status == AmStatus::kOk) status = AmStatus::kBadMessage;
  } else if (status == AmStatus::kOk) {
    auto it = s.regions.find(h.region);
    if (it == s.regions.end()) {
      status = AmStatus::kBadRegion;
    } else if (h.offset > it->second->size_bytes || length > it->second->size_bytes - h.offset) {
      status = AmStatus::kOutOfBounds;
    } else if (length > 0) {
      std::memcpy(it->second->base + h.offset, data, length);
      s.stats.bytes_received += length;
    }
  }
  ++s.stats.messages_received;
  if (status != AmStatus::kOk) ++s.stats.messages_refused;
  // An ack for the last message, or at once for a refused one (the sender then fails the
  // transfer and ignores the rest).
  const bool ack = status != AmStatus::kOk || (h.flags & kAmFlagLast) != 0;
  if (ack && (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0 &&
      param->reply_ep != nullptr && header_length == sizeof h) {
    // On the heap until the send completes (UCX 1.13 reads the header until then).
    auto* reply = new AmAckHeader{kAmMagic, static_cast<uint32_t>(status), h.sender, h.transfer};
    ucp_request_param_t rp{};
    rp.op_attr_mask =
        UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.flags = UCP_AM_SEND_FLAG_EAGER;
    rp.cb.send = on_ack_sent;
    rp.user_data = reply;
    // Fire and forget: a lost ack shows as the sender's timeout; an error here (the
    // sender died) is not ours to handle.
    void* request = ucp_am_send_nbx(param->reply_ep, kAmAck, reply, sizeof *reply, nullptr, 0, &rp);
    if (!UCS_PTR_IS_PTR(request)) delete reply;  // done at once, or failed
  }
  return UCS_OK;
}

// The sender's side: the receiver confirms (or refuses) a transfer.
ucs_status_t on_am_ack(void* arg, const void* header, size_t header_length, void* data,
                       size_t /*length*/, const ucp_am_recv_param_t* param) {
  auto& s = *static_cast<UcxTransport::State*>(arg);  // progress thread, mutex held
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) {
    ucp_am_data_release(s.worker, data);
    return UCS_OK;
  }
  AmAckHeader h{};
  if (header_length != sizeof h) return UCS_OK;
  std::memcpy(&h, header, sizeof h);
  if (h.magic != kAmMagic || h.sender != s.sender_id) return UCS_OK;
  auto it = s.transfers.find(h.transfer);
  if (it == s.transfers.end() || it->second->reported) return UCS_OK;  // late: ignore
  UcxTransport::State::Transfer& t = *it->second;
  if (h.status == static_cast<uint32_t>(AmStatus::kOk)) {
    t.acked = true;
  } else if (!t.error) {
    const char* why = h.status == static_cast<uint32_t>(AmStatus::kBadRegion) ? "unknown region"
                      : h.status == static_cast<uint32_t>(AmStatus::kOutOfBounds)
                          ? "bytes outside the region"
                          : "malformed message";
    t.error = Error{ErrorCode::kIoError, fmt::format("KV transfer {}: UCX peer {} refused it ({})",
                                                     t.id, static_cast<uint64_t>(t.peer), why)};
  }
  return UCS_OK;
}

}  // namespace

// ---- life cycle ----

UcxTransport::UcxTransport(std::unique_ptr<State> state) : state_(std::move(state)) {}

Result<std::unique_ptr<UcxTransport>> UcxTransport::create(const UcxTransportOptions& options) {
  if (auto s = options.validate(); !s) return std::unexpected(s.error());
  quiet_ucx_log_once();
  auto state = std::make_unique<State>();
  state->options = options;

  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) {
    return make_error(ErrorCode::kIoError, "cannot read the UCX configuration: " + ucs_text(st));
  }
  if (!options.transports.empty()) {
    st = ucp_config_modify(config, "TLS", options.transports.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return make_error(ErrorCode::kInvalidArgument, fmt::format("bad UCX transports \"{}\": {}",
                                                                 options.transports, ucs_text(st)));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  st = ucp_init(&params, config, &state->context);
  ucp_config_release(config);
  if (st != UCS_OK) {
    const char* tls = options.transports.empty() ? std::getenv("UCX_TLS") : nullptr;
    return make_error(ErrorCode::kIoError,
                      fmt::format("cannot initialize UCX (transports \"{}\"): {}",
                                  !options.transports.empty() ? options.transports
                                                              : (tls != nullptr ? tls : "default"),
                                  ucs_text(st)));
  }
  // From here on the destructor of the half-built transport releases what exists.
  std::unique_ptr<UcxTransport> transport(new UcxTransport(std::move(state)));
  State& s = *transport->state_;

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // our mutex serializes all calls
  st = ucp_worker_create(s.context, &worker_params, &s.worker);
  if (st != UCS_OK) {
    return make_error(ErrorCode::kIoError, "cannot create the UCX worker: " + ucs_text(st));
  }
  st = ucp_worker_get_efd(s.worker, &s.worker_fd);
  if (st != UCS_OK) {
    return make_error(ErrorCode::kIoError,
                      "the UCX worker has no event fd to sleep on: " + ucs_text(st));
  }
  s.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  s.epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  if (s.wake_fd < 0 || s.epoll_fd < 0) {
    return make_error(
        ErrorCode::kIoError,
        fmt::format("eventfd/epoll for the UCX progress thread: {}", std::strerror(errno)));
  }
  for (int fd : {s.worker_fd, s.wake_fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return make_error(
          ErrorCode::kIoError,
          fmt::format("epoll_ctl for the UCX progress thread: {}", std::strerror(errno)));
    }
  }

  for (auto [id, cb] : {std::pair{kAmData, &on_am_data}, std::pair{kAmAck, &on_am_ack}}) {
    ucp_am_handler_param_t handler{};
    handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                         UCP_AM_HANDLER_PARAM_FIELD_ARG;
    handler.id = id;
    handler.cb = cb;
    handler.arg = &s;
    st = ucp_worker_set_am_recv_handler(s.worker, &handler);
    if (st != UCS_OK) {
      return make_error(ErrorCode::kIoError,
                        "cannot set the UCX active message handlers: " + ucs_text(st));
    }
  }
  s.sender_id = std::random_device{}();
  s.sender_id = (s.sender_id << 32) ^ std::random_device{}() ^ static_cast<uint64_t>(steady_us());

  ucp_address_t* address = nullptr;
  size_t address_bytes = 0;
  st = ucp_worker_get_address(s.worker, &address, &address_bytes);
  if (st != UCS_OK) {
    return make_error(ErrorCode::kIoError, "cannot get the UCX worker address: " + ucs_text(st));
  }
  if (address_bytes > kMaxWirePayloadBytes) {
    ucp_worker_release_address(s.worker, address);
    return make_error(ErrorCode::kUnsupported,
                      fmt::format("UCX worker address of {} bytes", address_bytes));
  }
  transport->address_ = frame_wire(
      WireKind::kUcxWorkerAddress,
      std::span<const std::byte>(reinterpret_cast<const std::byte*>(address), address_bytes));
  ucp_worker_release_address(s.worker, address);

  s.thread = std::thread([t = transport.get()] { t->run_progress_thread(); });
  return transport;
}

UcxTransport::~UcxTransport() {
  State& s = *state_;
  if (s.thread.joinable()) {
    {
      std::lock_guard lock(s.mutex);
      s.stopping = true;
      s.stop_started_ms = steady_ms();
      for (auto& [id, peer] : s.peers) {
        s.fail_peer(*peer, Error{ErrorCode::kFailedPrecondition, "the UCX transport is shut down"},
                    false);
      }
    }
    s.wake();
    s.thread.join();
  }
  // The thread is gone: nothing else touches the state.
  for (auto& [id, remote] : s.remote_regions) {
    if (remote->rkey != nullptr) ucp_rkey_destroy(remote->rkey);
  }
  s.remote_regions.clear();
  // The worker goes before the memory: its destruction purges what its endpoints still
  // hold (the internal endpoints that peers' connections created included), and purging a
  // request may touch the registration of its buffer. It may also run request callbacks:
  // the transfers they point at are freed after it.
  if (s.worker != nullptr) ucp_worker_destroy(s.worker);
  for (auto& [id, region] : s.regions) ucp_mem_unmap(s.context, region->memh);
  s.regions.clear();
  s.transfers.clear();
  s.peers.clear();
  if (s.context != nullptr) ucp_cleanup(s.context);
  if (s.epoll_fd >= 0) ::close(s.epoll_fd);
  if (s.wake_fd >= 0) ::close(s.wake_fd);
}

void UcxTransport::run_progress_thread() {
  State& s = *state_;
  std::vector<std::function<void()>> ready;
  int64_t last_event_us = steady_us();
  const int64_t spin_us = s.options.idle_spin_us;
  for (;;) {
    int sleep_ms = -1;  // -1: poll again at once
    bool exit_now = false;
    {
      std::lock_guard lock(s.mutex);
      unsigned events = 0;
      // Bounded, so that callers waiting for the mutex get their turn.
      for (int i = 0; i < 64; ++i) {
        const unsigned n = ucp_worker_progress(s.worker);
        if (n == 0) break;
        events += n;
      }
      const int64_t now_ms = steady_ms();
      s.close_errored_peers();
      s.expire_transfers(now_ms);
      s.reap_peers();
      s.finish_transfers(ready);
      for (auto& fn : s.posted) ready.push_back(std::move(fn));
      s.posted.clear();
      if (s.stopping) {
        if (s.peers.empty() && !s.has_pending_transfers()) {
          exit_now = true;
        } else if (now_ms - s.stop_started_ms > kShutdownBoundMs) {
          STRATA_LOG_ERROR(
              "UCX transport: {} endpoint closes did not complete in {} ms at "
              "shutdown; failing their transfers",
              s.peers.size(), kShutdownBoundMs);
          for (auto& [id, t] : s.transfers) t->abandoned = true;
          s.finish_transfers(ready);
          exit_now = true;
        }
      }
      const int64_t now_us = steady_us();
      if (events > 0 || !ready.empty()) {
        last_event_us = now_us;
      } else if (!exit_now && now_us - last_event_us >= spin_us) {
        // Arm only when UCX has nothing left to do; BUSY means "progress again".
        if (ucp_worker_arm(s.worker) == UCS_OK) sleep_ms = s.wait_ms(now_ms);
      }
    }
    for (auto& fn : ready) fn();
    ready.clear();
    if (exit_now) return;
    if (sleep_ms >= 0) {
      epoll_event events[2];
      ::epoll_wait(s.epoll_fd, events, 2, sleep_ms);  // EINTR is a wake-up like any other
      uint64_t count = 0;
      [[maybe_unused]] ssize_t n = ::read(s.wake_fd, &count, sizeof count);
      last_event_us = steady_us();
    }
  }
}

// ---- regions ----

namespace {

Result<std::vector<std::byte>> pack_region_descriptor(ucp_context_h context, ucp_mem_h memh,
                                                      uint64_t id, const std::byte* base,
                                                      size_t size_bytes) {
  void* rkey = nullptr;
  size_t rkey_bytes = 0;
  const ucs_status_t st = ucp_rkey_pack(context, memh, &rkey, &rkey_bytes);
  if (st != UCS_OK) {
    return make_error(ErrorCode::kIoError, "cannot pack the UCX remote key: " + ucs_text(st));
  }
  if (rkey_bytes > kMaxWirePayloadBytes / 2) {
    ucp_rkey_buffer_release(rkey);
    return make_error(ErrorCode::kUnsupported,
                      fmt::format("UCX remote key of {} bytes", rkey_bytes));
  }
  WireWriter w;
  w.u64(id);
  w.u64(reinterpret_cast<uint64_t>(base));
  w.u64(size_bytes);
  w.blob(std::span<const std::byte>(static_cast<const std::byte*>(rkey), rkey_bytes));
  ucp_rkey_buffer_release(rkey);
  return frame_wire(WireKind::kUcxRegion, w.bytes());
}

}  // namespace

Result<UcxRegionId> UcxTransport::register_region(void* base, size_t size_bytes) {
  if (base == nullptr || size_bytes == 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "a UCX region needs a non-null base and a non-zero size");
  }
  State& s = *state_;
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = base;
  params.length = size_bytes;
  std::lock_guard lock(s.mutex);
  ucp_mem_h memh = nullptr;
  const ucs_status_t st = ucp_mem_map(s.context, &params, &memh);
  if (st != UCS_OK) {
    return make_error(ErrorCode::kIoError, fmt::format("cannot register {} bytes with UCX: {}",
                                                       size_bytes, ucs_text(st)));
  }
  const uint64_t id = s.next_id++;
  auto descriptor =
      pack_region_descriptor(s.context, memh, id, static_cast<std::byte*>(base), size_bytes);
  if (!descriptor) {
    ucp_mem_unmap(s.context, memh);
    return std::unexpected(descriptor.error());
  }
  auto region = std::make_unique<State::Region>();
  region->base = static_cast<std::byte*>(base);
  region->size_bytes = size_bytes;
  region->memh = memh;
  region->descriptor = std::move(*descriptor);
  s.regions.emplace(id, std::move(region));
  return UcxRegionId{id};
}

Result<UcxRegionId> UcxTransport::allocate_region(size_t size_bytes) {
  if (size_bytes == 0) {
    return make_error(ErrorCode::kInvalidArgument, "a UCX region needs a non-zero size");
  }
  State& s = *state_;
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  params.address = nullptr;
  params.length = size_bytes;
  params.flags = UCP_MEM_MAP_ALLOCATE;
  std::lock_guard lock(s.mutex);
  ucp_mem_h memh = nullptr;
  ucs_status_t st = ucp_mem_map(s.context, &params, &memh);
  if (st != UCS_OK) {
    return make_error(ErrorCode::kResourceExhausted,
                      fmt::format("UCX cannot allocate {} bytes: {}", size_bytes, ucs_text(st)));
  }
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  st = ucp_mem_query(memh, &attr);
  if (st != UCS_OK || attr.address == nullptr || attr.length < size_bytes) {
    ucp_mem_unmap(s.context, memh);
    return make_error(ErrorCode::kIoError, "cannot query UCX-allocated memory: " + ucs_text(st));
  }
  auto* base = static_cast<std::byte*>(attr.address);
  // Allocators differ on zeroing (shared-memory segments are, heap fallbacks need not be).
  std::memset(base, 0, size_bytes);
  const uint64_t id = s.next_id++;
  auto descriptor = pack_region_descriptor(s.context, memh, id, base, size_bytes);
  if (!descriptor) {
    ucp_mem_unmap(s.context, memh);
    return std::unexpected(descriptor.error());
  }
  auto region = std::make_unique<State::Region>();
  region->base = base;
  region->size_bytes = size_bytes;
  region->memh = memh;
  region->allocated = true;
  region->descriptor = std::move(*descriptor);
  s.regions.emplace(id, std::move(region));
  return UcxRegionId{id};
}

Result<std::byte*> UcxTransport::region_base(UcxRegionId region) const {
  std::lock_guard lock(state_->mutex);
  auto it = state_->regions.find(static_cast<uint64_t>(region));
  if (it == state_->regions.end()) {
    return make_error(ErrorCode::kNotFound,
                      fmt::format("unknown UCX region {}", static_cast<uint64_t>(region)));
  }
  return it->second->base;
}

Result<std::vector<std::byte>> UcxTransport::region_descriptor(UcxRegionId region) const {
  std::lock_guard lock(state_->mutex);
  auto it = state_->regions.find(static_cast<uint64_t>(region));
  if (it == state_->regions.end()) {
    return make_error(ErrorCode::kNotFound,
                      fmt::format("unknown UCX region {}", static_cast<uint64_t>(region)));
  }
  return it->second->descriptor;
}

Status UcxTransport::deregister_region(UcxRegionId region) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  auto it = s.regions.find(static_cast<uint64_t>(region));
  if (it == s.regions.end()) {
    return make_error(ErrorCode::kNotFound,
                      fmt::format("unknown UCX region {}", static_cast<uint64_t>(region)));
  }
  if (it->second->transfers > 0) {
    return make_error(ErrorCode::kFailedPrecondition,
                      fmt::format("UCX region {} is the source of {} pending transfers",
                                  static_cast<uint64_t>(region), it->second->transfers));
  }
  ucp_mem_unmap(s.context, it->second->memh);
  s.regions.erase(it);
  return {};
}

// ---- peers ----

Result<UcxPeerId> UcxTransport::connect(std::span<const std::byte> peer_address) {
  auto payload = unframe_wire(WireKind::kUcxWorkerAddress, peer_address);
  if (!payload) return std::unexpected(payload.error());
  if (payload->empty()) return make_error(ErrorCode::kCorrupt, "empty UCX worker address");
  State& s = *state_;
  UcxPeerId id{};
  {
    std::lock_guard lock(s.mutex);
    if (s.stopping) {
      return make_error(ErrorCode::kFailedPrecondition, "the UCX transport is shut down");
    }
    auto peer = std::make_unique<State::Peer>();
    peer->state = &s;
    peer->id = UcxPeerId{s.next_id++};
    auto try_create = [&](bool peer_mode) {
      ucp_ep_params_t params{};
      params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
      params.address = reinterpret_cast<const ucp_address_t*>(payload->data());
      params.err_mode = peer_mode ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE;
      if (peer_mode) {
        params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
        params.err_handler.cb = on_peer_error;
        params.err_handler.arg = peer.get();
      }
      return ucp_ep_create(s.worker, &params, &peer->ep);
    };
    const UcxPeerErrorMode mode = s.options.peer_error_mode;
    const bool try_peer_mode = mode == UcxPeerErrorMode::kPeerRequired ||
                               (mode == UcxPeerErrorMode::kPeer && !s.peer_mode_unreachable);
    ucs_status_t st = try_peer_mode ? try_create(true) : UCS_ERR_UNREACHABLE;
    peer->peer_failure_detection = st == UCS_OK;
    if (st == UCS_ERR_UNREACHABLE && mode != UcxPeerErrorMode::kPeerRequired) {
      // In PEER mode UCX 1.13 also answers UNREACHABLE when the only transports that
      // reach the peer cannot detect its death (shared memory). Only if the endpoint can
      // be made without error handling is that the reason (a dead or wrong peer fails
      // both ways); then later connects skip the PEER attempt, and its UCX error line.
      st = try_create(false);
      if (st == UCS_OK && try_peer_mode) {
        s.peer_mode_unreachable = true;
        STRATA_LOG_INFO(
            "UCX: the transports that reach the peer cannot report its death; endpoints go "
            "without error handling and rely on transfer deadlines");
      }
    }
    if (st == UCS_ERR_UNREACHABLE && mode == UcxPeerErrorMode::kPeerRequired) {
      return make_error(ErrorCode::kUnsupported,
                        "no UCX transport reaches the peer with peer failure detection (UCX "
                        "1.13's shared memory has none): use tcp or rc, or a peer error mode "
                        "that accepts deadlines only");
    }
    if (st != UCS_OK) {
      return make_error(ErrorCode::kIoError,
                        fmt::format("cannot connect to the UCX peer: {}", ucs_text(st)));
    }
    id = peer->id;
    s.peers.emplace(static_cast<uint64_t>(id), std::move(peer));
  }
  s.wake();  // wire-up goes on on the progress thread
  return id;
}

Result<bool> UcxTransport::peer_failure_detection(UcxPeerId peer) const {
  std::lock_guard lock(state_->mutex);
  auto it = state_->peers.find(static_cast<uint64_t>(peer));
  if (it == state_->peers.end()) {
    return make_error(ErrorCode::kNotFound,
                      fmt::format("unknown UCX peer {}", static_cast<uint64_t>(peer)));
  }
  return it->second->peer_failure_detection;
}

Status UcxTransport::disconnect(UcxPeerId peer) {
  State& s = *state_;
  {
    std::lock_guard lock(s.mutex);
    State::Peer* p = s.find_peer(peer);
    if (p == nullptr) {
      return make_error(ErrorCode::kNotFound,
                        fmt::format("unknown UCX peer {}", static_cast<uint64_t>(peer)));
    }
    s.fail_peer(*p,
                Error{ErrorCode::kFailedPrecondition,
                      fmt::format("UCX peer {} was disconnected", static_cast<uint64_t>(peer))},
                false);
  }
  s.wake();
  return {};
}

Result<UcxRemoteRegionId> UcxTransport::import_region(UcxPeerId peer,
                                                      std::span<const std::byte> descriptor) {
  auto payload = unframe_wire(WireKind::kUcxRegion, descriptor);
  if (!payload) return std::unexpected(payload.error());
  WireReader r(*payload);
  auto region = r.u64("region id");
  if (!region) return std::unexpected(region.error());
  auto base = r.u64("region base");
  if (!base) return std::unexpected(base.error());
  auto size = r.u64("region size");
  if (!size) return std::unexpected(size.error());
  auto rkey_bytes = r.blob("remote key");
  if (!rkey_bytes) return std::unexpected(rkey_bytes.error());
  if (auto f = r.finish("UCX region descriptor"); !f) return std::unexpected(f.error());
  if (*region == 0 || *size == 0 || *base + *size < *base) {
    return make_error(
        ErrorCode::kCorrupt,
        fmt::format("bad UCX region: id {}, base {:#x}, {} bytes", *region, *base, *size));
  }
  if (rkey_bytes->empty()) return make_error(ErrorCode::kCorrupt, "empty UCX remote key");
  State& s = *state_;
  if (std::this_thread::get_id() == s.thread.get_id()) {
    return make_error(ErrorCode::kFailedPrecondition,
                      "UcxTransport::import_region waits for the progress thread and cannot be "
                      "called from it (a TransferDone or a post())");
  }
  std::unique_lock lock(s.mutex);
  State::Peer* p = s.find_peer(peer);
  if (auto u = s.usable(p, peer); !u) return std::unexpected(u.error());
  ucp_rkey_h rkey = nullptr;
  if (s.options.data_path == UcxDataPath::kPut) {
    const ucs_status_t st = ucp_ep_rkey_unpack(p->ep, rkey_bytes->data(), &rkey);
    if (st != UCS_OK) {
      return make_error(ErrorCode::kIoError,
                        fmt::format("cannot unpack the UCX remote key of peer {}: {}",
                                    static_cast<uint64_t>(peer), ucs_text(st)));
    }
  }
  auto remote = std::make_unique<State::RemoteRegion>();
  remote->peer = peer;
  remote->region = *region;
  remote->rkey = rkey;
  remote->base = *base;
  remote->size_bytes = *size;
  const UcxRemoteRegionId id{s.next_id++};
  p->remote_regions.push_back(id);
  s.remote_regions.emplace(static_cast<uint64_t>(id), std::move(remote));

  // An empty message to the region, acked by the peer: once the ack is here the endpoint
  // is wired up both ways and the peer knows the region. Besides telling the caller now
  // whether the peer answers, this keeps out of the transfers' way the window in which
  // UCX 1.13 aborts when an endpoint with wire-up messages still queued is purged (an
  // assertion removed upstream by openucx/ucx#8175).
  auto answered = std::make_shared<std::promise<Status>>();
  auto t = std::make_unique<State::Transfer>();
  t->id = s.next_id++;
  t->kind = State::TransferKind::kProbe;
  t->peer = peer;
  t->timeout_ms = s.options.connect_timeout_ms;
  t->deadline_ms = steady_ms() + t->timeout_ms;
  t->done = [answered](Status status) { answered->set_value(std::move(status)); };
  s.send_message(*p, *t, *region, 0, nullptr, 0, true);
  s.add_transfer(*p, std::move(t));
  lock.unlock();
  s.wake();
  Status status = answered->get_future().get();  // bounded by its deadline
  if (!status) {
    // A peer that does not answer or does not know the region is of no use: close it.
    [[maybe_unused]] auto closed = disconnect(peer);
    return make_error(status.error().code,
                      "the UCX peer's region is not reachable: " + status.error().message);
  }
  return id;
}

// ---- transfers ----

Status UcxTransport::put_runs(UcxPeerId peer, UcxRemoteRegionId remote, UcxRegionId local,
                              std::span<const PageRun> runs, int64_t timeout_ms,
                              TransferDone done) {
  if (timeout_ms < 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("a KV transfer needs a timeout >= 1 ms, got {}", timeout_ms));
  }
  STRATA_CHECK(done != nullptr);
  State& s = *state_;
  {
    std::lock_guard lock(s.mutex);
    if (s.stopping) {
      return make_error(ErrorCode::kFailedPrecondition, "the UCX transport is shut down");
    }
    State::Peer* p = s.find_peer(peer);
    if (auto u = s.usable(p, peer); !u) return std::unexpected(u.error());
    auto rit = s.remote_regions.find(static_cast<uint64_t>(remote));
    if (rit == s.remote_regions.end() || rit->second->peer != peer) {
      return make_error(ErrorCode::kNotFound,
                        fmt::format("unknown UCX remote region {} of peer {}",
                                    static_cast<uint64_t>(remote), static_cast<uint64_t>(peer)));
    }
    const State::RemoteRegion& dst = *rit->second;
    auto lit = s.regions.find(static_cast<uint64_t>(local));
    if (lit == s.regions.end()) {
      return make_error(ErrorCode::kNotFound,
                        fmt::format("unknown UCX region {}", static_cast<uint64_t>(local)));
    }
    State::Region& src = *lit->second;
    uint64_t bytes = 0;
    for (const PageRun& run : runs) {
      const bool src_ok = run.size_bytes > 0 && run.src_offset <= src.size_bytes &&
                          run.size_bytes <= src.size_bytes - run.src_offset;
      const bool dst_ok =
          run.dst_offset <= dst.size_bytes && run.size_bytes <= dst.size_bytes - run.dst_offset;
      if (!src_ok || !dst_ok) {
        return make_error(
            ErrorCode::kInvalidArgument,
            fmt::format("run (src {}, dst {}, {} bytes) outside the {} region "
                        "({} bytes)",
                        run.src_offset, run.dst_offset, run.size_bytes, src_ok ? "remote" : "local",
                        src_ok ? dst.size_bytes : src.size_bytes));
      }
      bytes += run.size_bytes;
    }

    auto t = std::make_unique<State::Transfer>();
    t->id = s.next_id++;
    t->peer = peer;
    t->local = local;
    t->timeout_ms = timeout_ms;
    t->deadline_ms = steady_ms() + timeout_ms;
    t->bytes = bytes;
    t->done = std::move(done);
    if (s.options.data_path == UcxDataPath::kMessages) {
      // Runs cut into messages of at most message_chunk_bytes; the last one (an empty one
      // for an empty transfer) asks for the ack.
      const uint64_t chunk = static_cast<uint64_t>(s.options.message_chunk_bytes);
      size_t pieces = 0;
      for (const PageRun& run : runs) pieces += (run.size_bytes + chunk - 1) / chunk;
      if (pieces == 0) {
        s.send_message(*p, *t, dst.region, 0, nullptr, 0, true);
      }
      size_t sent = 0;
      for (const PageRun& run : runs) {
        for (uint64_t off = 0; off < run.size_bytes && t->ucx_status == UCS_OK; off += chunk) {
          const uint64_t n = std::min(chunk, run.size_bytes - off);
          s.send_message(*p, *t, dst.region, run.dst_offset + off, src.base + run.src_offset + off,
                         n, ++sent == pieces);
        }
      }
    } else {
      t->kind = State::TransferKind::kPuts;
      // No memh with the requests: UCX 1.13 crashes purging a put that carries a user
      // memory handle (ucp_request_memory_dereg at worker destruction); it registers what
      // a transport needs itself.
      ucp_request_param_t put_param{};
      for (const PageRun& run : runs) {
        void* request = ucp_put_nbx(p->ep, src.base + run.src_offset, run.size_bytes,
                                    dst.base + run.dst_offset, dst.rkey, &put_param);
        ++s.stats.puts;
        if (UCS_PTR_IS_ERR(request)) {
          // The endpoint has failed; the flush below still orders the completion after
          // whatever earlier puts UCX holds.
          t->ucx_status = UCS_PTR_STATUS(request);
          break;
        }
        // A put's own completion is not needed: the flush completes after all of them.
        if (request != nullptr) ucp_request_free(request);
      }
      s.start_flush(*p, *t);
    }
    ++s.stats.transfers_started;
    ++src.transfers;
    s.add_transfer(*p, std::move(t));
  }
  s.wake();
  return {};
}

void UcxTransport::post(std::function<void()> fn) {
  State& s = *state_;
  {
    std::lock_guard lock(s.mutex);
    s.posted.push_back(std::move(fn));
  }
  s.wake();
}

UcxTransportStats UcxTransport::stats() const {
  std::lock_guard lock(state_->mutex);
  return state_->stats;
}

}  // namespace strata
