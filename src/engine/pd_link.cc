#include "engine/pd_link.h"

#include <unistd.h>
#include <xxhash.h>

#include <cstdio>
#include <random>

#include "common/log.h"
#include "kvtransfer/page_runs.h"
#include "kvtransfer/storage_page_transport.h"
#include "kvtransfer/ucx_page_transport.h"
#include "kvtransfer/ucx_transport.h"

namespace strata {
namespace {

std::string hex(std::span<const std::byte> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (std::byte b : bytes) {
    out.push_back(kDigits[static_cast<unsigned>(b) >> 4]);
    out.push_back(kDigits[static_cast<unsigned>(b) & 15]);
  }
  return out;
}

std::optional<std::vector<std::byte>> unhex(std::string_view text) {
  if (text.size() % 2 != 0) return std::nullopt;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  std::vector<std::byte> out(text.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = digit(text[2 * i]);
    const int lo = digit(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[i] = static_cast<std::byte>(hi * 16 + lo);
  }
  return out;
}

std::string default_worker_id() {
  char host[64] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '\0';
  std::string id;
  for (char c : std::string_view(host)) {
    if (c > ' ' && c < 127) id.push_back(c);
  }
  if (id.empty()) id = "worker";
  std::random_device entropy;
  char suffix[16];
  std::snprintf(suffix, sizeof suffix, "-%08x", entropy());
  return id.substr(0, 100) + suffix;
}

}  // namespace

PdLink::PdLink(const PdOptions& options, std::function<void()> wake)
    : options_(options), wake_(std::move(wake)) {}

PdLink::~PdLink() {
  // The channel first (no more orders), then the transport (its pending transfers end and
  // report here), then the UCX context it borrows.
  channel_.reset();
  transport_.reset();
  ucx_.reset();
}

Result<std::unique_ptr<PdLink>> PdLink::create(const PdOptions& options, KvPool& pool,
                                               const Clock& clock, std::function<void()> wake) {
  std::unique_ptr<PdLink> link(new PdLink(options, std::move(wake)));
  PdOptions& o = link->options_;
  if (o.worker_id.empty()) o.worker_id = default_worker_id();
  if (!pd::valid_worker_id(o.worker_id)) {
    return make_error(ErrorCode::kInvalidArgument,
                      "--pd-worker-id must be 1..128 printable ASCII characters without spaces");
  }
  // The data plane.
  if (o.transport == "storage") {
    auto cfg = parse_storage_config(o.storage_backend, o.storage_extra_config);
    if (!cfg) return std::unexpected(cfg.error());
    char ns[32];
    std::snprintf(
        ns, sizeof ns, "pd-%016llx",
        static_cast<unsigned long long>(XXH3_64bits(o.kv_layout.data(), o.kv_layout.size())));
    cfg->name_space = ns;
    cfg->page_format = kv_page_format(pool.shape(), false);
    auto backend = make_storage_backend(*cfg, clock);
    if (!backend) return std::unexpected(backend.error());
    link->storage_ = std::move(*backend);
    auto t = StoragePageTransport::create(*link->storage_, pool);
    if (!t) return std::unexpected(t.error());
    link->transport_ = std::move(*t);
    link->transport_info_.kind = pd::TransportKind::kStorage;
    link->transport_info_.storage_prefix = hex(link->transport_->pool_descriptor());
  } else {
    UcxTransportOptions uo;
    uo.data_path = o.ucx_data_path == "put" ? UcxDataPath::kPut : UcxDataPath::kMessages;
    auto ucx = UcxTransport::create(uo);
    if (!ucx) return std::unexpected(ucx.error());
    link->ucx_ = std::move(*ucx);
    auto t = UcxPageTransport::create(*link->ucx_, pool);
    if (!t) return std::unexpected(t.error());
    link->transport_ = std::move(*t);
    link->transport_info_.kind = pd::TransportKind::kUcx;
    link->transport_info_.ucx_worker_address = link->ucx_->address();
    link->transport_info_.ucx_rkey = link->transport_->pool_descriptor();
    link->transport_info_.remote_base =
        static_cast<uint64_t>(reinterpret_cast<uintptr_t>(kv_pool_base(pool)));
    link->transport_info_.region_bytes = pool.total_bytes();
  }
  // The control plane.
  pd::ChannelOptions co;
  co.worker_id = o.worker_id;
  co.role = o.role == WorkerRole::kPrefill ? pd::Role::kPrefill : pd::Role::kDecode;
  co.bind_endpoint = o.role == WorkerRole::kPrefill
                         ? (o.bind.empty() ? std::string("tcp://127.0.0.1:0") : o.bind)
                         : std::string();
  co.kv_layout = o.kv_layout + ";transport=" + o.transport;
  co.heartbeat_ms = o.heartbeat_ms;
  co.peer_timeout_ms = o.peer_timeout_ms;
  co.clock = &clock;
  auto channel = pd::Channel::start(co);
  if (!channel) return std::unexpected(channel.error());
  link->channel_ = std::move(*channel);
  link->channel_->set_notify([raw = link.get()] {
    if (raw->wake_) raw->wake_();
  });
  if (o.role == WorkerRole::kPrefill) {
    link->leases_ = std::make_unique<pd::PrefillLeases>(pd::PrefillLeaseOptions{});
  } else {
    pd::DecodeRoomOptions ro;
    ro.accept_timeout_ms = o.accept_timeout_ms;
    ro.stall_ms = o.stall_ms;
    ro.quarantine_ms = o.quarantine_ms;
    if (auto st = ro.validate(); !st) return std::unexpected(st.error());
    link->rooms_ = std::make_unique<pd::DecodeRooms>(ro);
    for (const std::string& peer : o.prefill_peers) {
      if (auto st = link->channel_->connect(peer); !st) {
        return make_error(ErrorCode::kInvalidArgument,
                          "--pd-prefill-peer " + peer + ": " + st.error().message);
      }
    }
  }
  STRATA_LOG_INFO("disaggregation: role {}, worker id {}, transport {}{}", worker_role_name(o.role),
                  o.worker_id, o.transport,
                  o.role == WorkerRole::kPrefill
                      ? ", control plane on " + link->channel_->endpoint()
                      : std::string());
  return link;
}

PdInfo PdLink::info() const {
  PdInfo i;
  i.role = options_.role;
  i.enabled = true;
  i.worker_id = options_.worker_id;
  i.endpoint = prefill() ? channel_->endpoint() : std::string();
  i.transport = options_.transport;
  i.peers_alive = channel_->alive_peers();
  return i;
}

Result<PageDestinationId> PdLink::destination(const std::string& peer,
                                              const pd::TransportInfo& info) {
  std::vector<std::byte> descriptor;
  if (info.kind == pd::TransportKind::kUcx) {
    if (options_.transport != "ucx") {
      return make_error(ErrorCode::kInvalidArgument, "this worker moves pages through storage");
    }
    descriptor = info.ucx_rkey;
  } else {
    if (options_.transport != "storage") {
      return make_error(ErrorCode::kInvalidArgument, "this worker moves pages over UCX");
    }
    auto bytes = unhex(info.storage_prefix);
    if (!bytes) return make_error(ErrorCode::kCorrupt, "the storage pool descriptor is not hex");
    descriptor = std::move(*bytes);
  }
  if (auto it = destinations_.find(peer); it != destinations_.end()) {
    if (it->second.descriptor == descriptor) return it->second.id;
    transport_->close_destination(it->second.id);
    destinations_.erase(it);
  }
  auto id = transport_->open_destination(descriptor);
  if (!id) return std::unexpected(id.error());
  destinations_[peer] = Destination{std::move(descriptor), *id};
  return *id;
}

void PdLink::drop_destination(const std::string& peer) {
  auto it = destinations_.find(peer);
  if (it == destinations_.end()) return;
  transport_->close_destination(it->second.id);
  destinations_.erase(it);
}

void PdLink::fence_pages() {
  if (ucx_) (void)ucx_->stats();
}

TransferDone PdLink::completion(uint64_t room, bool receive, int32_t first_index, int32_t n_pages) {
  return [this, room, receive, first_index, n_pages](Status st) {
    {
      std::lock_guard lock(mutex_);
      completions_.push_back(PdCompletion{room, receive, first_index, n_pages, std::move(st)});
    }
    if (wake_) wake_();
  };
}

std::vector<PdCompletion> PdLink::take_completions() {
  std::lock_guard lock(mutex_);
  std::vector<PdCompletion> out;
  out.swap(completions_);
  return out;
}

}  // namespace strata
