// Strata's own CUDA kernels, behind plain C++ launchers: device pointers in, a Status out,
// work queued on the caller's stream (nothing here synchronizes). BF16 values travel as
// their bits (uint16_t), F32 as float. Each launcher checks its shape first and refuses what
// the kernels are not built for (kUnsupported: a head size other than 64 or 128, more than
// 8 query heads per KV head) or what makes no sense (kInvalidArgument), launching nothing;
// a launch the device refuses comes back as kInternal with CUDA's own words. In a build
// without CUDA every launcher answers kUnsupported.
//
// The device KV layout these kernels read and write (one layer's K, and its V, each):
//
//   [page][kv_head][slot][head_dim]   BF16, page_size slots per page
//
// FlashInfer's "HND" paged layout: one page's K (or V) for one head is a contiguous
// page_size x head_dim block, so a key is head_dim contiguous values. The CPU pool
// (memory/kv_pool.h) lays its pages out for its own kernels; copies between them go through
// the tier code, which knows both.
//
// References: every kernel has a CPU reference in the CPU engine's own code (model/kernels.h
// for the row kernels, model/attention.h for attention), and tests/cuda checks each against
// it on random inputs (docs/cuda.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/result.h"
#include "cuda/cuda_device.h"
#include "cuda/kernel_args.h"

namespace strata::cuda {

// Residual add and RMSNorm in one pass, row by row (SGLang's fused_add_rmsnorm):
//   residual[r] += x[r]                       (F32, in place)
//   x[r] = residual[r] / rms(residual[r]) * weight     (rounded to BF16, in place)
// where rms(v) = sqrt(mean(v^2) + eps). x, weight: BF16; residual: F32 (the residual
// stream stays in F32, as the CPU engine's does). rows >= 0, dim >= 1.
Status fused_add_rms_norm(uint16_t* x, float* residual, const uint16_t* weight, int32_t rows,
                          int32_t dim, float eps, StreamHandle stream);

// RMSNorm without the residual: y[r] = x[r] / rms(x[r]) * weight, BF16 in and out (y may be
// x). For the final norm and Qwen3's per-head q/k norms (rows = tokens x heads).
Status rms_norm(const uint16_t* x, uint16_t* y, const uint16_t* weight, int32_t rows, int32_t dim,
                float eps, StreamHandle stream);

// The MLP's activation on the fused gate|up product: gate_up row r is [gate (inter) | up
// (inter)], out[r][i] = silu(gate[r][i]) * up[r][i], silu(g) = g / (1 + e^-g). BF16.
Status silu_mul(const uint16_t* gate_up, uint16_t* out, int32_t rows, int32_t inter,
                StreamHandle stream);

// dst[r] = src[index[r]] for r < rows, rows of `cols` BF16 values (the embedding lookup of
// token ids; the rows that want logits). The indices are device memory, each a row of src
// (not checked: the caller's).
Status gather_rows(const uint16_t* src, const int32_t* index, uint16_t* dst, int32_t rows,
                   int32_t cols, StreamHandle stream);

// x[r][c] += bias[c] (x BF16, bias F32): the QKV product's biases (Qwen2), o_proj's.
Status add_bias(uint16_t* x, const float* bias, int32_t rows, int32_t cols, StreamHandle stream);

// Draws each row's token on the device by the Sampler's rules and the row's uniform number
// (SampleRowsArgs and SampleRowArg in kernel_args.h; model/sampler.h's sample_row is its CPU
// reference): greedy, temperature, top-k, top-p, the token's log-probability and up to
// kSampleMaxTop alternatives. A row it cannot draw within kSampleCandidates ranked tokens
// gets token -1 (the caller reads its logits). rows >= 0, cols >= 1; each row's params
// checked on the host by the caller (temperature >= 0, top_p in (0, 1], top_logprobs <=
// kSampleMaxTop: sample_row_args does it).
Status sample_rows(const SampleRowsArgs& args, StreamHandle stream);

// A RowSampling-like rule as the kernel's argument; kInvalidArgument for one out of range.
Result<SampleRowArg> sample_row_arg(double uniform, float temperature, int32_t top_k, float top_p,
                                    int32_t top_logprobs, bool logprob);

// Paged decode attention (DecodeAttentionArgs in kernel_args.h says what each argument is).

// Floats of workspace decode_attention needs: per sequence, head and split, the partial
// output (head_dim), its running max and its sum.
size_t decode_attention_workspace_floats(int32_t num_seqs, int32_t num_heads, int32_t head_dim,
                                         int32_t num_splits);

// How many key ranges to cut the longest sequence into so that the device's `multiprocessors`
// are busy: 1 when num_seqs x num_kv_heads blocks already fill them, else up to 64, no range
// shorter than 256 keys.
int32_t decode_attention_splits(int32_t num_seqs, int32_t num_kv_heads, int32_t max_seq_len,
                                int32_t multiprocessors);

Status decode_attention(const DecodeAttentionArgs& args, StreamHandle stream);

// Paged prefill ("extend") attention over a cached prefix (ExtendAttentionArgs in
// kernel_args.h says what each argument is).

// Which kernel computes it: on CUDA cores in F32 (the first one, kept as the reference on
// the GPU), or on tensor cores (BF16 products with F32 accumulation, FlashAttention-2's loop
// through WMMA: extend_attention_tc.cuh), which the GPU model uses.
enum class ExtendKernel : uint8_t { kCudaCores, kTensorCores };

// Query tokens per tile for `group` query heads per KV head (1 to 8): a tile is at most 32
// (token, query head) rows on CUDA cores, 64 on tensor cores.
int32_t extend_attention_tile_tokens(int32_t group, ExtendKernel kernel = ExtendKernel::kCudaCores);

// The tiles of a batch whose sequence s brings new_tokens[s] new tokens (>= 0): each
// sequence's tokens cut into tiles of extend_attention_tile_tokens(group), in order; for
// each tile its sequence and its first token within it (the args' tile_seq and tile_first,
// to copy to the device).
struct ExtendTiles {
  std::vector<int32_t> seq;
  std::vector<int32_t> first;
};
ExtendTiles plan_extend_tiles(std::span<const int32_t> new_tokens, int32_t group,
                              ExtendKernel kernel = ExtendKernel::kCudaCores);

// The tiles must be planned for the same kernel. The tensor-core kernel also wants q_stride
// (the effective one) a multiple of 8 elements: it reads 16-byte pieces.
Status extend_attention(const ExtendAttentionArgs& args, StreamHandle stream,
                        ExtendKernel kernel = ExtendKernel::kCudaCores);

// Qwen3's q/k norm, RoPE and the K/V write into the layer's pages, for a batch of tokens
// (QkNormRopeStoreArgs in kernel_args.h says what each argument is). Head sizes 64 and 128.
Status qk_norm_rope_store(const QkNormRopeStoreArgs& args, StreamHandle stream);

}  // namespace strata::cuda
