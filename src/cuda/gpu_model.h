// The model's forward pass on one NVIDIA GPU (issue 30): a ForwardModel, as the CPU engine's
// Model and the simulator are, so that the engine, its scheduler and the radix cache run
// on it unchanged (they deal in page ids).
//
// What lives on the GPU: the weights in BF16 (matrices fused as model/weights.h fuses them:
// q|k|v and gate|up), the KV pages of every layer ([page][kv_head][slot][head_dim] BF16,
// kernels.h), and the scratch of one batch of up to max_batch_tokens tokens and
// max_batch_sequences sequences. Nothing is allocated per forward.
//
// One forward pass, on one stream: the batch's metadata (token ids, the K/V slot of each
// token, rotary angles computed on the host with the CPU engine's RopeTable, page tables,
// the prefill tiles) copied in one piece; the embedding rows gathered; per layer the fused
// residual add + RMSNorm, the QKV product (cuBLASLt), biases, q/k norm + RoPE + the K/V
// write into the pages, attention (decode_attention when every sequence brings one token,
// extend_attention otherwise), o_proj, residual add + RMSNorm, gate|up, SiLU x up, down;
// then the final norm on every row, the rows that want logits gathered, the LM head in F32,
// and the logits copied back. The residual stream stays in F32 on the device, as the CPU
// engine's does; the activations between products are BF16.
//
// The engine's KvPool. The KV is on the GPU, so the pool the engine makes from
// kv_pool_shape() only counts pages (one layer of one head of 2 values a slot, as the
// simulator's); forward() checks that it has the GPU's page count and page size. The host
// tier (and storage behind it) copies the GPU's pages through external_kv() and
// make_copy_device(); so do P/D transfers, through a page-locked stage (engine/pd_stage.h).
//
// Threads: forward() on one thread at a time (the engine's forward thread).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "common/result.h"
#include "model/forward_model.h"
#include "model/model_config.h"
#include "model/weights.h"

namespace strata::cuda {

struct GpuModelOptions {
  int32_t num_pages = 0;              // KV pages on the GPU, >= 1
  int32_t page_size = 16;             // tokens a page, >= 1
  int32_t max_batch_tokens = 8192;    // tokens one forward may carry, >= 1
  int32_t max_batch_sequences = 256;  // sequences one forward may carry, >= 1
  // Prefill attention on tensor cores (kernels.h ExtendKernel); false: the CUDA-core kernel,
  // the tensor-core one's reference (tests).
  bool tensor_core_prefill = true;
  // Decode steps (every sequence one token, no prefix still landing) replayed as CUDA graphs,
  // one captured per decode shape (gpu_decode_shape: batch-size bucket x context bucket) on
  // its first step; false: every step launched kernel by kernel (the graphs' reference, in
  // the same padded shape, so the two give the same bits).
  bool cuda_graphs = true;
};

// The options for an engine of these sizes (EngineOptions' fields of the same names): its
// pool's pages (kv_cache_tokens / page_size), and room for the largest step its scheduler
// forms: up to 2 × max_running_requests sequences (the running requests and the prompts
// admitted beside them) carrying a prefill chunk of chunked_prefill_size tokens and one
// token each besides. What `strata serve --device cuda`, `strata bench tiers` and the
// engine tests (tests/engine/test_device.h) make the GPU model with.
GpuModelOptions gpu_options_for_engine(int32_t page_size, int32_t kv_cache_tokens,
                                       int32_t max_running_requests, int32_t chunked_prefill_size);

// The batch sizes decode steps are padded to; a step takes the smallest that holds it
// (above the largest, or above the options' limits, it runs at its own size, eagerly).
inline constexpr int32_t kGraphBuckets[] = {1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256};

// The shape a decode step (every sequence one token, each wanting logits) runs in, whether
// replayed from a CUDA graph or launched kernel by kernel: it depends on the step's bucket
// only, so a graph captured for it fits every step of the bucket and an eager step gives the
// same bits as a replay (the same products at the same M, the same key ranges).
//   seqs         the batch padded to the smallest of kGraphBuckets that holds it
//   table_pages  the page table's width: the longest context's pages rounded up to a power
//                of two, at most max_position_embeddings' pages (a short context copies and
//                reads a short table)
//   num_splits   decode attention's key ranges for `seqs` sequences of table_pages pages
//                (decode_attention_splits): a short context is not cut as a long one is
// seqs == 0: not a bucketed step (more sequences than the largest bucket or the options'
// limits, or a sequence bringing more than one token or no logits row): it runs eagerly at
// its own size.
struct DecodeShape {
  int32_t seqs = 0;
  int32_t table_pages = 0;
  int32_t num_splits = 1;
  bool operator==(const DecodeShape&) const = default;
};
// `context_tokens[s]`: sequence s's keys once its token is written (start_position + 1).
DecodeShape gpu_decode_shape(const ModelConfig& config, const GpuModelOptions& options,
                             int32_t multiprocessors, std::span<const int64_t> context_tokens);

// Device bytes a model of `config` needs besides its weights for `options`: the KV pages
// and the batch scratch (what --mem-fraction-static sizes the pages from).
int64_t gpu_kv_page_bytes(const ModelConfig& config, int32_t page_size);
int64_t gpu_weight_bytes(const ModelConfig& config);
// The batch scratch create() allocates for `options` on a device of `multiprocessors`: the
// activations of the largest batch, the logits rows, the decode kernel's split workspace and
// the metadata. Nothing else is allocated per forward, so this is the forward's activation
// peak besides cuBLASLt's workspace (cuda/gemm.h kGemmWorkspaceBytes).
int64_t gpu_scratch_bytes(const ModelConfig& config, const GpuModelOptions& options,
                          int32_t multiprocessors);

class GpuModel final : public ForwardModel {
 public:
  // Uploads `weights` (F32 or BF16, converted to BF16) and allocates the KV pages and the
  // scratch. kUnsupported naming what is missing: a build without CUDA, no usable GPU,
  // cuBLASLt, a head size other than 64 or 128, more than 8 query heads per KV head, a
  // sliding window; kResourceExhausted when the device has not the room (with the sizes);
  // kInvalidArgument for options out of range.
  // Synchronizes the device before it returns: the uploads from pageable memory have landed
  // before the (non-blocking) compute stream reads them.
  static Result<std::unique_ptr<GpuModel>> create(const ModelConfig& config,
                                                  const ModelWeights& weights,
                                                  const GpuModelOptions& options);
  // The refusals create() makes before any device work (the errors it would return for
  // them), in every build and on every machine: what the tests check their models against
  // where there is no GPU.
  static Status check(const ModelConfig& config, const GpuModelOptions& options);
  ~GpuModel() override;

  const ModelConfig& config() const override;
  // The page-counting pool (see the top): 1 layer, 1 KV head, head_dim 2.
  KvPoolShape kv_pool_shape(int32_t num_pages, int32_t page_size, KvDtype dtype) const override;
  // kInvalidArgument (nothing run) for a batch the model cannot run: as Model's checks, plus
  // more tokens or sequences than the options allow, or a pool whose page count or size is
  // not the GPU's. kInternal (the batch's requests fail; the server goes on) when the
  // device reports an error.
  Status forward(std::span<const ForwardSequence> batch, KvPool& pool, ForwardOutput& out) override;
  // The KV pages on the GPU: BF16, layer-first ([layer][K, V][page] blocks of
  // [kv_head][slot][head_dim]), so each page's K or V of a layer is one contiguous block and
  // consecutive pages are adjacent.
  std::optional<ExternalKv> external_kv() const override;
  // The GPU's copy streams (cuda/cuda_copy_device.h) by `path`, `host` page-locked for the
  // device's lifetime; loads land before the forward pass that needs them is issued (the
  // scheduler waits for their events).
  Result<std::unique_ptr<CopyDevice>> make_copy_device(std::span<std::byte> host,
                                                       CopyPath path) override;

  const GpuModelOptions& options() const;
  int64_t weight_bytes() const;  // on the device
  // How the forward passes ran: graphs captured (one per DecodeShape met), decode steps
  // replayed from one, and steps launched kernel by kernel (prefill, mixed, or no graph).
  // Forward thread only.
  struct Counters {
    int64_t graphs_captured = 0;
    int64_t graph_replays = 0;
    int64_t eager_steps = 0;
  };
  Counters counters() const;
  int64_t kv_bytes() const;  // on the device

 private:
  GpuModel();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::cuda
