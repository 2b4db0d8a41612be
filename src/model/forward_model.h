// What the engine needs of a model: its config, the shape of the KV pool it reads and
// writes, and the batched forward pass; and, for a model that keeps the KV pages in memory
// of its own (a GPU's), where they are and how to copy them to and from the host. `Model` (the CPU
// engine, model/model.h) and `SimulatedModel` (a timing model that does no arithmetic,
// model/simulated_model.h, docs/simulation.md) implement it; a GPU backend is meant to implement it
// too, so it holds nothing but plain C++ types.
//
// Thread: one thread at a time calls forward() (the engine's forward thread); config() and
// kv_pool_shape() are const and answer the same from any thread for the object's lifetime.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/result.h"
#include "memory/copy_device.h"
#include "memory/kv_block_layout.h"
#include "memory/kv_pool.h"
#include "model/forward.h"
#include "model/model_config.h"

namespace strata {

// What a forward pass gives back for the sequences that want logits, in batch order: either
// dense rows of logits, or, from a backend that decides each next token itself (the
// simulator), the token of each row. Exactly one of the two is filled (the other empty).
struct ForwardOutput {
  std::vector<float> logits;    // rows x vocab_size, row-major
  std::vector<int32_t> tokens;  // one per row: the token the sampler must emit
  // With logits, from a model that draws tokens itself (ForwardSequence::sampling): one entry
  // per row, in row order. An entry whose token is >= 0 is that row's draw, log-probabilities
  // filled as asked (is_stop unset: the engine's Sampler marks it), and its row of `logits`
  // holds anything (a GPU leaves it on the device); token -1: read the row's logits (the row
  // had no sampling, or the device could not draw it). Empty: read every row's logits.
  std::vector<SampledToken> sampled;
};

// KV pages a model keeps in memory of its own (GpuModel: GPU memory), the engine's KvPool
// then only counting them. The host tier copies their bytes through a copy device.
struct ExternalKv {
  // The pages' real shape: layers, KV heads, head_dim and dtype (the host pool takes it);
  // pages and page size are the engine pool's.
  KvPoolShape shape;
  // Where each page's K and V of each layer is, in the model's memory.
  KvBlockLayout blocks;
};

class ForwardModel {
 public:
  virtual ~ForwardModel() = default;

  virtual const ModelConfig& config() const = 0;

  // The KV pool this model reads and writes, with the given pages, page size and dtype.
  // The page accounting (pages, page size) is the caller's; layers, heads and head_dim are
  // the model's (a simulator may choose a minimal shape: it never reads the pool).
  virtual KvPoolShape kv_pool_shape(int32_t num_pages, int32_t page_size, KvDtype dtype) const = 0;
  Result<std::unique_ptr<KvPool>> make_kv_pool(int32_t num_pages, int32_t page_size,
                                               KvDtype dtype) const {
    return KvPool::create(kv_pool_shape(num_pages, page_size, dtype));
  }

  // Runs the batch: writes every new token's K and V into its page (a simulator writes
  // nothing) and fills `out` for each sequence with want_logits, in batch order.
  // kInvalidArgument (nothing computed or written) for a batch the model cannot run: an
  // empty sequence, a token outside the vocabulary, a position beyond the context, a page
  // table too short or naming a page outside the pool, a pool of another shape.
  virtual Status forward(std::span<const ForwardSequence> batch, KvPool& pool,
                         ForwardOutput& out) = 0;

  // The pages' shape and addresses when the model keeps them in memory of its own; nullopt
  // (the default) when they are the engine's KvPool, which forward() reads and writes.
  virtual std::optional<ExternalKv> external_kv() const { return std::nullopt; }
  // For external KV: a copy device between the model's memory and `host` (the host pool's
  // memory, which it may register with the device for its lifetime; `host` outlives it),
  // moving batches by `path`. kUnsupported by default.
  virtual Result<std::unique_ptr<CopyDevice>> make_copy_device(std::span<std::byte> host,
                                                               CopyPath path) {
    (void)host;
    (void)path;
    return make_error(ErrorCode::kUnsupported, "this model keeps no KV memory of its own");
  }

  // Whether forward() fills out.tokens (the model decides each next token, as the simulator
  // does) rather than out.logits. Constant for the object's lifetime.
  virtual bool chooses_tokens() const { return false; }

 protected:
  ForwardModel() = default;
  ForwardModel(const ForwardModel&) = default;
  ForwardModel& operator=(const ForwardModel&) = default;
};

}  // namespace strata
