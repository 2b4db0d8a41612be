// UcxTransport: moves page runs (page_runs.h) into a peer's registered memory over UCX,
// the data plane of prefill/decode disaggregation.
//
// Shape. One UCP context and one worker per transport; a process makes one transport
// (tests make two, one per side). The decode side registers its KV pool once
// (register_region, or allocate_region) and hands its address() and the region's
// descriptor() to prefill workers in the control plane. A prefill worker registers its
// own pool as the source, connect()s to the decode worker's address, import_region()s
// the descriptor (a round trip that proves the peer and the region), and put_runs()
// page runs into it, all in flight at once.
//
// Data path (UcxTransportOptions::data_path). kMessages, the default: each run (cut into
// messages of at most message_chunk_bytes) is an eager active message that the
// receiver's progress thread copies into its region after checking the region id and
// bounds; the last one asks for an ack, and the transfer is done when the ack is back and
// every send completed. kPut: one ucp_put_nbx per run and an endpoint flush. Puts are
// one-sided only where the hardware or the memory allows it (RDMA; shared memory);
// UCX 1.13 emulates them over tcp with messages of its own, and that emulation aborts
// the target process (ucs_fatal "unexpected error" in ucp_put_handler) when the initiator
// dies mid-transfer: a dead prefill worker would kill the decode worker. Messages have no
// such failure (the receiver's acks are fire-and-forget), check every write against the
// region, and measure within a few percent of puts on shared memory (docs/kv-transfer.md).
//
// Transports. UCX_TLS (or UcxTransportOptions::transports) picks them with no code
// change: "tcp", "sm" (shared memory on one host), "tcp,sm", "rc,sm" across hosts with
// RDMA, ... The receiver's worker must run to land messages (and emulated puts): each
// transport has a progress thread of its own, so a busy decode scheduler never stalls the
// bytes that arrive for it (the failure of seed 003, where evictions on the scheduler
// thread starved the transfer engine's control plane).
//
// Errors, never hangs. Endpoints use UCX's PEER error handling by default, so a peer that
// dies or becomes unreachable fails its transfers with kIoError. UCX 1.13's shared-memory
// transports cannot report a dead peer: in PEER mode UCX leaves them out (with
// UCX_TLS=tcp,sm a peer on the same host is reached over tcp), and when nothing else
// reaches the peer (UCX_TLS=sm) connect() falls back to no error handling, where the
// transfer deadline alone catches a dead peer (UcxPeerErrorMode). Every transfer has a
// deadline: when it passes, the endpoint is force-closed (a stalled endpoint is never
// reused), and every transfer on it fails, the overdue one with kTimeout. A failed or
// closed peer is gone for good: connect() again to get a new one. Garbage from the
// network (an address or descriptor that is truncated, damaged or foreign) is refused
// with kCorrupt before UCX sees it (wire_format.h).
//
// Leases. TransferDone runs only once UCX holds no reference to the transfer's source
// bytes: every send (or the flush) completed, or the endpoint was closed and its
// requests purged. Until then the caller keeps the source pages (prefill side) from being
// reused. Destination pages are the control plane's business (docs/kv-transfer.md):
// after a failure, bytes already in flight may still land for a short while.
//
// Threading. Every public method is thread-safe. One mutex serializes all use of the
// UCP worker (thread mode SERIALIZED): the progress thread holds it while it progresses
// the worker (message handlers run there), callers while they issue operations. The
// progress thread busy-polls while there is work and for options.idle_spin_us after it,
// then sleeps on the worker's event fd (UCP_FEATURE_WAKEUP) and a wake-up eventfd.
// TransferDone callbacks run on the progress thread with the mutex released.
//
// Ownership. Registered memory stays the caller's and must outlive its registration;
// allocated regions belong to the transport. Ids are never reused; a stale id answers
// kNotFound. Destroying the transport fails its pending transfers (kFailedPrecondition),
// force-closes its endpoints and joins the thread, delivering every TransferDone first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "kvtransfer/page_runs.h"
#include "kvtransfer/transfer_done.h"

namespace strata {

enum class UcxRegionId : uint64_t {};        // a local registered region
enum class UcxPeerId : uint64_t {};          // an endpoint to a peer
enum class UcxRemoteRegionId : uint64_t {};  // a peer's region, unpacked for one endpoint

// How endpoints learn that their peer died (see "Errors, never hangs" above).
enum class UcxPeerErrorMode {
  // UCX's PEER mode, so only transports that detect a dead peer carry the puts (tcp,
  // rc); a peer that no such transport reaches is connected without error handling.
  kPeer,
  // PEER mode or nothing: connect() refuses such a peer with kUnsupported.
  kPeerRequired,
  // No error handling: every transport may carry the puts (sm between processes on one
  // host, the fastest there), and a dead peer is caught by transfer deadlines only.
  kNone,
};

// How the bytes of a transfer travel (see "Data path" above).
enum class UcxDataPath {
  kMessages,  // eager active messages, copied in by the receiver's thread, acked
  kPut,       // ucp_put_nbx one-sided puts and an endpoint flush
};

struct UcxTransportOptions {
  // UCX transports for this context ("tcp", "sm", "tcp,sm", "rc,sm", ...); empty: the
  // UCX_TLS environment variable, else UCX's default (all it finds).
  std::string transports;
  UcxPeerErrorMode peer_error_mode = UcxPeerErrorMode::kPeer;
  UcxDataPath data_path = UcxDataPath::kMessages;
  // Messages of the kMessages path carry at most this many bytes (a run is cut into
  // several), bounding the receiver's reassembly buffers; in [4096, 2^30].
  int64_t message_chunk_bytes = int64_t{1} << 20;
  // Microseconds the progress thread keeps polling after the last event before it sleeps
  // on the event fd, in [0, 1000000]. Polling lowers latency and costs a core meanwhile.
  int32_t idle_spin_us = 50;
  // How long import_region() waits for the peer's answer, >= 1.
  int64_t connect_timeout_ms = 10'000;

  Status validate() const;
};

struct UcxTransportStats {
  uint64_t transfers_started = 0;
  uint64_t transfers_ok = 0;
  uint64_t transfers_failed = 0;     // failed for any reason, timeouts included
  uint64_t transfers_timed_out = 0;  // of transfers_failed
  uint64_t puts = 0;                 // ucp_put_nbx calls (put path: one per run)
  uint64_t messages = 0;             // active messages sent (message path, probes)
  uint64_t bytes_put = 0;            // bytes of the transfers that completed ok
  // The receiving side (the decode worker's transport):
  uint64_t messages_received = 0;
  uint64_t messages_refused = 0;  // unknown region, out of bounds, malformed
  uint64_t bytes_received = 0;
  uint64_t peers_failed = 0;  // endpoints lost to a peer error or a timeout
};

class UcxTransport {
 public:
  // Makes the context, the worker and the progress thread. kInvalidArgument for bad
  // options (an unknown transport name included); kIoError when UCX cannot start.
  // Unless UCX_LOG_LEVEL is set, UCX's own log is set to errors only (process-wide).
  static Result<std::unique_ptr<UcxTransport>> create(const UcxTransportOptions& options = {});
  ~UcxTransport();

  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  // This worker's address, framed (wire_format.h), for peers' connect().
  const std::vector<std::byte>& address() const { return address_; }

  // Registers [base, base + size_bytes) of caller-owned memory as a put target and
  // source. The memory must stay mapped until deregister_region or the transport's end.
  Result<UcxRegionId> register_region(void* base, size_t size_bytes);
  // Allocates size_bytes through UCX's allocator (a shared-memory segment when sm is
  // among the transports, which same-host peers can map for puts; zeroed) and registers
  // it; the transport owns it.
  Result<UcxRegionId> allocate_region(size_t size_bytes);
  Result<std::byte*> region_base(UcxRegionId region) const;
  // The framed (base, size, packed remote key) that a peer's import_region() takes.
  Result<std::vector<std::byte>> region_descriptor(UcxRegionId region) const;
  // kFailedPrecondition while a transfer reads from the region.
  Status deregister_region(UcxRegionId region);

  // An endpoint to the worker whose framed address() is `peer_address`. Does not wait:
  // wire-up goes on in the background (import_region waits for it). kIoError when UCX
  // finds no way to the peer at once.
  Result<UcxPeerId> connect(std::span<const std::byte> peer_address);
  // Whether the peer's endpoint reports a dead peer (false: deadlines only, see above).
  Result<bool> peer_failure_detection(UcxPeerId peer) const;
  // Force-closes the endpoint; its pending transfers fail with kFailedPrecondition.
  Status disconnect(UcxPeerId peer);
  // Unpacks a peer's framed region descriptor for puts through `peer` (freed with it),
  // then reads one byte of the region and waits for it: the endpoint is then wired up
  // both ways and the key works. A peer that does not answer within
  // options.connect_timeout_ms (kTimeout) or fails (kIoError) is disconnected. Blocks,
  // so it must not be called from the progress thread (a TransferDone or a post():
  // kFailedPrecondition).
  Result<UcxRemoteRegionId> import_region(UcxPeerId peer, std::span<const std::byte> descriptor);

  // Moves every run from the local region (src_offset from its base) into the remote
  // region (dst_offset from its base) by the configured data path. Non-blocking. A bad
  // argument (a run outside either region, a timeout_ms < 1, unknown ids) or a peer
  // already failed returns the error and never calls `done`; otherwise `done` gets ok
  // once every byte landed, kTimeout when timeout_ms passed first, kIoError when the peer
  // failed or refused a message, or kFailedPrecondition when the peer was disconnected or
  // the transport destroyed.
  Status put_runs(UcxPeerId peer, UcxRemoteRegionId remote, UcxRegionId local,
                  std::span<const PageRun> runs, int64_t timeout_ms, TransferDone done);

  // Runs `fn` on the progress thread, like a TransferDone: ordered after every worker
  // progress made so far, so memory that the worker wrote (emulated puts landing) is
  // visible to `fn` and to whatever it hands the bytes to.
  void post(std::function<void()> fn);

  UcxTransportStats stats() const;

  // The implementation's state (ucx_transport.cc); public only so that UCX's C callbacks
  // there can name it.
  struct State;

 private:
  explicit UcxTransport(std::unique_ptr<State> state);
  void run_progress_thread();

  std::unique_ptr<State> state_;
  std::vector<std::byte> address_;
};

}  // namespace strata
