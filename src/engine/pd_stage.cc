#include "engine/pd_stage.h"

#include <string>
#include <utility>

#include "memory/stream_transfer_engine.h"

namespace strata {

Result<std::unique_ptr<PdStage>> PdStage::create(ForwardModel& model, const ExternalKv& external,
                                                 int32_t num_pages, CopyPath path,
                                                 int64_t stall_timeout_ms, const Clock& clock) {
  if (num_pages < 1) return bad_argument("the P/D stage needs at least one page");
  KvPoolShape shape = external.shape;
  shape.num_pages = num_pages;
  auto pool = KvPool::create(shape);
  if (!pool) return std::unexpected(pool.error());
  std::unique_ptr<PdStage> stage(new PdStage(num_pages));
  stage->pool_ = std::move(*pool);
  const KvBlockLayout blocks = stage->pool_->block_layout();
  auto device =
      model.make_copy_device(std::span<std::byte>(blocks.base, stage->pool_->total_bytes()), path);
  if (!device) {
    return make_error(device.error().code,
                      "the P/D stage's copy device: " + device.error().message);
  }
  stage->device_ = std::move(*device);
  stage->transfers_ = std::make_unique<StreamTransferEngine>(
      *stage->device_, external.blocks, blocks,
      StreamTransferOptions{.stall_timeout_ms = stall_timeout_ms}, clock);
  return stage;
}

PdStage::~PdStage() {
  // The transfer engine waits for its copies before the device and the pool go.
  transfers_.reset();
  device_.reset();
}

TransferTicket PdStage::copy(TransferDirection direction, std::vector<PageId> device_pages,
                             std::vector<PageId> stage_pages) {
  TransferJob job;
  job.direction = direction;
  job.device_pages = std::move(device_pages);
  job.host_pages = std::move(stage_pages);
  ++in_flight_;
  return transfers_->submit(std::move(job));
}

std::vector<TransferOutcome> PdStage::take_outcomes() {
  std::vector<TransferOutcome> out = transfers_->take_outcomes();
  for (const TransferOutcome& o : out) {
    if (o.result != TransferResult::kStalled) --in_flight_;
  }
  return out;
}

}  // namespace strata
