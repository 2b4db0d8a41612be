// UcxPageTransport: PageTransport over UcxTransport. The local KV pool is registered once
// (as the target of decode-side transfers and the source of prefill-side ones); its pool
// descriptor carries the pool's shape, the worker's address and the region's descriptor.
// send() plans the page runs between the two pools' layouts (page_runs.h) and puts them;
// receive() only orders the caller after the bytes that the UCX worker wrote (post()).
//
// Threading: thread-safe; destinations are guarded by a mutex. Ownership: the
// UcxTransport and the pool are borrowed and must outlive this object.
#pragma once

#include <memory>
#include <mutex>
#include <unordered_map>

#include "kvtransfer/page_transport.h"
#include "kvtransfer/ucx_transport.h"
#include "memory/kv_pool.h"

namespace strata {

class UcxPageTransport final : public PageTransport {
 public:
  // Registers the pool's memory with `ucx`. Transport errors from register_region.
  static Result<std::unique_ptr<UcxPageTransport>> create(UcxTransport& ucx, KvPool& pool);
  // Disconnects the destinations (their pending sends fail) and deregisters the pool once
  // nothing reads from it.
  ~UcxPageTransport() override;

  UcxPageTransport(const UcxPageTransport&) = delete;
  UcxPageTransport& operator=(const UcxPageTransport&) = delete;

  std::string_view name() const override { return "ucx"; }
  const std::vector<std::byte>& pool_descriptor() const override { return descriptor_; }
  Result<PageDestinationId> open_destination(std::span<const std::byte> descriptor) override;
  void close_destination(PageDestinationId destination) override;
  Status send(PageDestinationId destination, const PageBatch& batch, int64_t timeout_ms,
              TransferDone done) override;
  Status receive(const PageBatch& batch, int64_t timeout_ms, TransferDone done) override;

  UcxRegionId region() const { return region_; }

 private:
  struct Destination {
    UcxPeerId peer{};
    UcxRemoteRegionId remote{};
    KvPoolShape shape;
  };

  UcxPageTransport(UcxTransport& ucx, KvPool& pool, UcxRegionId region,
                   std::vector<std::byte> descriptor);

  UcxTransport& ucx_;
  KvPool& pool_;
  const UcxRegionId region_;
  const std::vector<std::byte> descriptor_;

  std::mutex mutex_;
  std::unordered_map<uint64_t, Destination> destinations_;  // GUARDED_BY(mutex_)
  uint64_t next_destination_ = 1;                           // GUARDED_BY(mutex_)
};

}  // namespace strata
