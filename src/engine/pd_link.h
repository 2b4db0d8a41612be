// The engine's end of prefill/decode disaggregation: the control-plane channel (src/pd),
// the decode side's rooms or the prefill side's leases, and the data plane's page
// transport (src/kvtransfer: UCX or the storage tier), owned together for the scheduler
// (docs/pd-disaggregation.md, "Engine integration").
//
// Threads. The channel and the transport run threads of their own; everything here is
// called on the scheduler thread except the transport's completions, which the transport
// thread hands over through a locked queue (take_completions) and a wake-up callback.
// Ownership: borrows the device pool, which must outlive the link (the scheduler declares
// the link after the pool, so the transport, which reads and writes the pool, goes first).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/result.h"
#include "engine/engine_options.h"
#include "kvtransfer/page_transport.h"
#include "memory/kv_pool.h"
#include "pd/pd_channel.h"
#include "pd/pd_leases.h"
#include "pd/pd_rooms.h"
#include "storage/storage_backend.h"

namespace strata {

class UcxTransport;

// A page transfer that finished on the transport's thread.
struct PdCompletion {
  uint64_t room = 0;
  bool receive = false;  // decode side: receive(); else prefill side: send()
  int32_t first_index = 0;
  int32_t n_pages = 0;
  Status status;
};

class PdLink {
 public:
  // Starts the channel (binding or connecting), the transport, and the rooms or leases.
  // `wake` is called (from other threads) when messages or completions arrive.
  static Result<std::unique_ptr<PdLink>> create(const PdOptions& options, KvPool& pool,
                                                const Clock& clock, std::function<void()> wake);
  ~PdLink();
  PdLink(const PdLink&) = delete;
  PdLink& operator=(const PdLink&) = delete;

  bool prefill() const { return options_.role == WorkerRole::kPrefill; }
  const PdOptions& options() const { return options_; }
  pd::Channel& channel() { return *channel_; }
  pd::DecodeRooms& rooms() { return *rooms_; }
  pd::PrefillLeases& leases() { return *leases_; }
  PageTransport& transport() { return *transport_; }
  PdInfo info() const;

  // Decode side: where the prefill worker writes (the order's transport field).
  const pd::TransportInfo& transport_info() const { return transport_info_; }

  // Prefill side: the destination for decode worker `peer` whose order carried `info`;
  // opened once and reused while the descriptor stays the same. May block for a round
  // trip to the peer the first time (UCX wire-up).
  Result<PageDestinationId> destination(const std::string& peer, const pd::TransportInfo& info);
  // Forgets a peer's destination (it died or restarted; its sends fail).
  void drop_destination(const std::string& peer);

  // Decode side, before an order goes out (the reserved pages held other KV before) and
  // before a failed room's pages are reused (some of its bytes may have landed): orders the
  // scheduler's writes of the pool and the transport thread's writes of received bytes.
  // The network carries that order in fact; this makes it visible to ThreadSanitizer too
  // (one lock of the transport's mutex, which its thread holds while it writes bytes).
  void fence_pages();

  // A TransferDone that queues its outcome for the scheduler thread.
  TransferDone completion(uint64_t room, bool receive, int32_t first_index, int32_t n_pages);
  std::vector<PdCompletion> take_completions();

 private:
  PdLink(const PdOptions& options, std::function<void()> wake);

  PdOptions options_;
  std::function<void()> wake_;
  // Declared before the transport: its completions, run while it is destroyed, land here.
  std::mutex mutex_;
  std::vector<PdCompletion> completions_;  // GUARDED_BY(mutex_)
  std::unique_ptr<StorageBackend> storage_;
  std::unique_ptr<UcxTransport> ucx_;
  std::unique_ptr<PageTransport> transport_;
  std::unique_ptr<pd::Channel> channel_;
  std::unique_ptr<pd::DecodeRooms> rooms_;
  std::unique_ptr<pd::PrefillLeases> leases_;
  pd::TransportInfo transport_info_;
  struct Destination {
    std::vector<std::byte> descriptor;
    PageDestinationId id{};
  };
  std::unordered_map<std::string, Destination> destinations_;  // by decode worker id
};

}  // namespace strata
