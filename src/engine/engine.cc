#include "engine/engine.h"

#include "engine/scheduler.h"

namespace strata {

Result<std::unique_ptr<Engine>> Engine::create(ForwardModel* model, EngineOptions options,
                                               std::function<void(std::vector<KvEvent>)> publish,
                                               const Clock* clock) {
  auto scheduler = Scheduler::create(model, std::move(options), std::move(publish), clock);
  if (!scheduler) return std::unexpected(scheduler.error());
  return std::unique_ptr<Engine>(new Engine(std::move(*scheduler)));
}

Engine::Engine(std::unique_ptr<Scheduler> scheduler)
    : scheduler_(std::move(scheduler)), cache_(*scheduler_) {}

Engine::~Engine() = default;

Result<std::shared_ptr<RequestStream>> Engine::submit(RequestSpec spec) {
  return scheduler_->submit(std::move(spec));
}

const EngineOptions& Engine::options() const {
  return scheduler_->options();
}
const BlockHasher& Engine::block_hasher() const {
  return scheduler_->block_hasher();
}
int32_t Engine::num_pages() const {
  return scheduler_->num_pages();
}
const ModelConfig& Engine::model_config() const {
  return scheduler_->model().config();
}
EngineCounters Engine::counters() const {
  return scheduler_->counters();
}
PdInfo Engine::pd_info() const {
  return scheduler_->pd_info();
}

}  // namespace strata
