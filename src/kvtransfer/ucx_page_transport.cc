#include "kvtransfer/ucx_page_transport.h"

#include <fmt/format.h>

#include <chrono>
#include <thread>

#include "common/log.h"
#include "kvtransfer/page_runs.h"
#include "kvtransfer/wire_format.h"

namespace strata {

UcxPageTransport::UcxPageTransport(UcxTransport& ucx, KvPool& pool, UcxRegionId region,
                                   std::vector<std::byte> descriptor)
    : ucx_(ucx), pool_(pool), region_(region), descriptor_(std::move(descriptor)) {}

Result<std::unique_ptr<UcxPageTransport>> UcxPageTransport::create(UcxTransport& ucx,
                                                                   KvPool& pool) {
  auto region = ucx.register_region(kv_pool_base(pool), pool.total_bytes());
  if (!region) return std::unexpected(region.error());
  auto region_descriptor = ucx.region_descriptor(*region);
  if (!region_descriptor) {
    [[maybe_unused]] auto s = ucx.deregister_region(*region);
    return std::unexpected(region_descriptor.error());
  }
  WireWriter w;
  w.pool_shape(pool.shape());
  w.blob(ucx.address());
  w.blob(*region_descriptor);
  return std::unique_ptr<UcxPageTransport>(
      new UcxPageTransport(ucx, pool, *region, frame_wire(WireKind::kUcxPool, w.bytes())));
}

UcxPageTransport::~UcxPageTransport() {
  std::unordered_map<uint64_t, Destination> destinations;
  {
    std::lock_guard lock(mutex_);
    destinations.swap(destinations_);
  }
  for (const auto& [id, d] : destinations) [[maybe_unused]] auto s = ucx_.disconnect(d.peer);
  // The disconnects fail the pending sends on the progress thread; the region is free
  // once their callbacks ran. Waiting is bounded: a transfer outlives a disconnect only
  // if UCX never completes a force close, and the transport's end then unmaps it anyway.
  for (int attempt = 0; attempt < 10'000; ++attempt) {
    auto s = ucx_.deregister_region(region_);
    if (s || s.error().code != ErrorCode::kFailedPrecondition) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  STRATA_LOG_ERROR("UCX page transport: the KV pool is still the source of transfers at exit");
}

Result<PageDestinationId> UcxPageTransport::open_destination(
    std::span<const std::byte> descriptor) {
  auto payload = unframe_wire(WireKind::kUcxPool, descriptor);
  if (!payload) return std::unexpected(payload.error());
  WireReader r(*payload);
  auto shape = r.pool_shape();
  if (!shape) return std::unexpected(shape.error());
  auto address = r.blob("worker address");
  if (!address) return std::unexpected(address.error());
  auto region = r.blob("region descriptor");
  if (!region) return std::unexpected(region.error());
  if (auto f = r.finish("UCX pool descriptor"); !f) return std::unexpected(f.error());
  if (auto s = check_page_compatible(pool_.shape(), *shape); !s) {
    return std::unexpected(s.error());
  }
  auto peer = ucx_.connect(*address);
  if (!peer) return std::unexpected(peer.error());
  auto remote = ucx_.import_region(*peer, *region);
  if (!remote) {
    [[maybe_unused]] auto s = ucx_.disconnect(*peer);
    return std::unexpected(remote.error());
  }
  std::lock_guard lock(mutex_);
  const uint64_t id = next_destination_++;
  destinations_.emplace(id, Destination{*peer, *remote, *shape});
  return PageDestinationId{id};
}

void UcxPageTransport::close_destination(PageDestinationId destination) {
  Destination d;
  {
    std::lock_guard lock(mutex_);
    auto it = destinations_.find(static_cast<uint64_t>(destination));
    if (it == destinations_.end()) return;
    d = it->second;
    destinations_.erase(it);
  }
  [[maybe_unused]] auto s = ucx_.disconnect(d.peer);
}

Status UcxPageTransport::send(PageDestinationId destination, const PageBatch& batch,
                              int64_t timeout_ms, TransferDone done) {
  Destination d;
  {
    std::lock_guard lock(mutex_);
    auto it = destinations_.find(static_cast<uint64_t>(destination));
    if (it == destinations_.end()) {
      return make_error(ErrorCode::kNotFound, fmt::format("unknown page destination {}",
                                                          static_cast<uint64_t>(destination)));
    }
    d = it->second;
  }
  auto runs = plan_page_runs(pool_.shape(), d.shape, batch.src_pages, batch.dst_pages);
  if (!runs) return std::unexpected(runs.error());
  return ucx_.put_runs(d.peer, d.remote, region_, *runs, timeout_ms, std::move(done));
}

Status UcxPageTransport::receive(const PageBatch& batch, int64_t /*timeout_ms*/,
                                 TransferDone done) {
  if (auto s = check_batch_pages(batch, -1, pool_.num_pages()); !s) return s;
  // The bytes are already in the pool (the prefill side's completion said so); going
  // through the progress thread orders the caller after the worker's writes of them.
  ucx_.post([done = std::move(done)]() { done(Status{}); });
  return {};
}

}  // namespace strata
