// A loaded transformer: config, weights in memory, and the batched forward pass over
// KV pages.
//
// Thread: one thread at a time calls forward() (the engine's scheduler). The model owns
// a compute thread pool for its kernels (like a BLAS library owns its threads); it
// starts no other threads.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/result.h"
#include "memory/kv_pool.h"
#include "model/attention.h"
#include "model/forward.h"
#include "model/forward_model.h"
#include "model/kernels.h"
#include "model/matmul.h"
#include "model/model_config.h"
#include "model/thread_pool.h"
#include "model/weights.h"

namespace strata {

struct ModelOptions {
  // Compute threads; 0: one per hardware thread.
  int num_threads = 0;
  // In-memory dtype of the weight matrices. Empty: the checkpoint's (BF16 stays BF16;
  // F32 and F16 become F32; a GGUF file's types stay). BF16 halves the memory traffic of
  // decoding; forcing it on an F32 checkpoint rounds the weights. Q8_0, Q4_0, Q4_K
  // quantize at load (round to nearest; matrices whose rows are not whole blocks fall
  // back to Q8_0 or F32).
  std::optional<WeightDtype> weight_dtype;
};

// The CPU engine's ForwardModel.
class Model final : public ForwardModel {
 public:
  // Loads a Hugging Face folder (config.json, then model.safetensors or its shards) or a
  // GGUF file (model/gguf_model.h).
  static Result<std::unique_ptr<Model>> load(const std::filesystem::path& dir,
                                             const ModelOptions& options = {});
  // Loads a GGUF file: its weights keep their types unless options.weight_dtype is set.
  static Result<std::unique_ptr<Model>> load_gguf(const std::filesystem::path& path,
                                                  const ModelOptions& options = {});
  // A model over weights already in memory (tests, benchmarks, make-model).
  static Result<std::unique_ptr<Model>> from_tensors(const ModelConfig& config,
                                                     const TensorSource& tensors,
                                                     const ModelOptions& options = {});

  ~Model() override;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const override { return config_; }
  const ModelWeights& weights() const { return weights_; }
  int num_threads() const { return pool_.num_threads(); }

  // The KV pool shape this model needs (layers, KV heads, head_dim) with the given
  // pages, page size and dtype.
  KvPoolShape kv_pool_shape(int32_t num_pages, int32_t page_size, KvDtype dtype) const override;

  // Runs the batch: writes every new token's K and V into its page and, for each
  // sequence with want_logits, the logits of its last token, as consecutive rows of
  // `logits` (resized to rows x vocab_size), in batch order.
  // kInvalidArgument (and nothing computed or written) for an empty sequence, a token
  // id outside the vocabulary, a position beyond max_position_embeddings, a page table
  // that is too short or names a page outside the pool, or a pool of another shape;
  // kResourceExhausted when the scratch for the batch cannot be allocated.
  Status forward(std::span<const ForwardSequence> batch, KvPool& pool, std::vector<float>& logits);
  // ForwardModel's: the same, the rows in out.logits (out.tokens left empty).
  Status forward(std::span<const ForwardSequence> batch, KvPool& pool, ForwardOutput& out) override;

  // Per-phase timing of forward() (off by default: it costs two clock reads a phase).
  void set_profiling(bool enabled) { profiling_ = enabled; }
  const ForwardProfile& profile() const { return profile_; }
  void reset_profile() { profile_ = ForwardProfile{}; }

 private:
  Model(const ModelConfig& config, ModelWeights weights, int num_threads);

  Status validate(std::span<const ForwardSequence> batch, const KvPool& pool) const;
  Status forward_validated(std::span<const ForwardSequence> batch, KvPool& pool,
                           std::vector<float>& logits);
  void grow_scratch(int64_t num_tokens);

  ModelConfig config_;
  ModelWeights weights_;
  ThreadPool pool_;
  Matmul matmul_;
  PagedAttention attention_;
  RopeTable rope_;

  // Scratch, grown to the largest batch seen (row-major, one row per new token).
  AlignedBuffer x_;        // [T][hidden] residual stream
  AlignedBuffer xn_;       // [T][hidden] normed input of a block
  AlignedBuffer qkv_;      // [T][q + 2 kv]
  AlignedBuffer attn_;     // [T][q]
  AlignedBuffer gate_up_;  // [T][2 ffn]; SiLU(gate) * up overwrites the gate half
  AlignedBuffer rope_cs_;  // [T][head_dim]: cos then sin of each token's position
  AlignedBuffer last_;     // [rows wanting logits][hidden]
  int64_t scratch_tokens_ = 0;
  std::vector<int64_t> token_position_;
  std::vector<int32_t> token_sequence_;
  std::vector<AttentionSequence> attention_batch_;

  bool profiling_ = false;
  ForwardProfile profile_;
};

}  // namespace strata
