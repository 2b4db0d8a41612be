// The engine's public face: submit requests (token ids in, token ids out through a
// RequestStream) and steer the KV cache through typed commands (engine/cache_control.h).
// Everything the engine owns — the radix tree, the page pools, the tiers, the tool
// sessions — lives behind this class on the scheduler thread (engine/scheduler.h) and is
// reachable only through these calls; the build keeps the engine's internals out of the
// include path of the server and the bench (CMakeLists.txt, strata_module).
//
// Thread-safe: any thread may submit and issue commands; both only enqueue and return.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "cache/kv_event.h"
#include "common/clock.h"
#include "common/result.h"
#include "engine/cache_control.h"
#include "engine/engine_options.h"
#include "engine/request.h"
#include "model/model_config.h"

namespace strata {

class ForwardModel;
class Scheduler;
class EngineTestAccess;

class Engine {
 public:
  // `model` (the CPU engine's Model, a SimulatedModel, any ForwardModel) must outlive the
  // engine. `publish` (may be empty) receives the KV events of each scheduler step as one
  // batch, on the scheduler thread.
  static Result<std::unique_ptr<Engine>> create(ForwardModel* model, EngineOptions options,
                                                std::function<void(std::vector<KvEvent>)> publish,
                                                const Clock* clock = nullptr);
  ~Engine();  // stops the scheduler; unfinished requests end with kCancelled
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates and queues a request. kInvalidArgument for an empty prompt, token ids out
  // of the vocabulary, max_tokens < 1, or a prompt beyond the context; kResourceExhausted
  // for a prompt the device pool can never hold.
  Result<std::shared_ptr<RequestStream>> submit(RequestSpec spec);

  // The cache-control commands.
  CacheControl& cache() { return cache_; }

  const EngineOptions& options() const;
  // How the cache hashes blocks (--prefix-caching-hash-algo): hash a request's blocks with
  // it to name them as the cache does (pins, events, /cache/state). Thread-safe.
  const BlockHasher& block_hasher() const;
  int32_t num_pages() const;  // device pool pages
  const ModelConfig& model_config() const;
  // A copy of the counters (thread-safe).
  EngineCounters counters() const;
  // The worker's prefill/decode disaggregation: role, worker id, endpoint (thread-safe).
  PdInfo pd_info() const;

 private:
  friend class EngineTestAccess;  // tests only (engine/engine_test_access.h)
  explicit Engine(std::unique_ptr<Scheduler> scheduler);

  std::unique_ptr<Scheduler> scheduler_;
  CacheControl cache_;
};

}  // namespace strata
