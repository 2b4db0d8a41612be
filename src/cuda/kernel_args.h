// The kernels' argument blocks and the stream handle: plain data, no other include, so that
// the CUDA translation units (compiled by nvcc, C++17: CMake 3.25 knows no newer CUDA dialect
// flag) and the rest (C++23) share them.
#pragma once

#include <cstdint>

namespace strata::cuda {

// An opaque CUDA stream (cudaStream_t); null is the legacy default stream.
using StreamHandle = void*;

// Paged prefill ("extend") attention: each sequence's new tokens attend causally to its
// keys, a cached prefix included: new token i (0-based) of a sequence with kv_lens[s] keys
// and n_s new tokens sits at position kv_lens[s] - n_s + i and sees keys [0, that
// position]; the new tokens' keys are already written into the pages (qk_norm_rope_store).
// The queries are cut into tiles of extend_attention_tile_tokens(group) tokens of one
// sequence (plan_extend_tiles makes the list), and one block computes one tile for one KV
// head: its group of query heads over every key the tile sees, with an online softmax
// (FlashAttention's), K and V staged in shared memory 32 keys at a time.
struct ExtendAttentionArgs {
  // BF16, rotated: token t's query heads at q + t * q_stride, [num_heads][head_dim] (inside
  // the fused QKV product's rows, q_stride is its row width).
  const uint16_t* q = nullptr;
  int32_t q_stride = 0;                 // elements; 0: num_heads * head_dim
  const uint16_t* k_pages = nullptr;    // BF16 [num_pages][num_kv_heads][page_size][head_dim]
  const uint16_t* v_pages = nullptr;    // the same for V
  const int32_t* page_table = nullptr;  // [num_seqs][page_table_stride], as for decode
  int32_t page_table_stride = 0;
  // [num_seqs + 1]: sequence s's new tokens are rows qo_start[s] .. qo_start[s + 1] - 1 of
  // q and out (device memory).
  const int32_t* qo_start = nullptr;
  const int32_t* kv_lens = nullptr;     // [num_seqs] keys after this step, >= the new tokens
  const int32_t* tile_seq = nullptr;    // [num_tiles] each tile's sequence
  const int32_t* tile_first = nullptr;  // [num_tiles] its first new token, within the sequence
  uint16_t* out = nullptr;              // BF16 [num_tokens][num_heads][head_dim]
  int32_t num_tiles = 0;
  int32_t num_seqs = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;   // 64 or 128
  int32_t page_size = 0;  // >= 1
  float scale = 1.0f;     // applied to q . k
};

// Paged decode attention with grouped-query heads and split-K: one new token per sequence
// attends to the first seq_lens[s] keys of its pages (its own key included, already
// written). Each sequence's keys are cut into num_splits ranges processed in parallel, each
// keeping an online softmax (running max and sum); a second kernel merges the ranges'
// partial results (FlashDecoding). Query heads h of a KV head kv are kv * group ... (kv + 1)
// * group - 1, group = num_heads / num_kv_heads (Hugging Face's repeat_kv order).
struct DecodeAttentionArgs {
  // BF16, rotated: sequence s's query heads at q + s * q_stride, [num_heads][head_dim].
  const uint16_t* q = nullptr;
  int32_t q_stride = 0;               // elements; 0: num_heads * head_dim
  const uint16_t* k_pages = nullptr;  // BF16 [num_pages][num_kv_heads][page_size][head_dim]
  const uint16_t* v_pages = nullptr;  // the same for V
  // [num_seqs][page_table_stride]: entry i of a sequence's row is the page holding its keys
  // [i * page_size, (i + 1) * page_size); pages may be shared between sequences.
  const int32_t* page_table = nullptr;
  int32_t page_table_stride = 0;      // entries per row, >= any sequence's page count
  const int32_t* seq_lens = nullptr;  // [num_seqs] keys each query sees, >= 1 (device memory)
  uint16_t* out = nullptr;            // BF16 [num_seqs][num_heads][head_dim]
  float* workspace = nullptr;         // decode_attention_workspace_floats(...) floats
  int32_t num_seqs = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;    // 64 or 128
  int32_t page_size = 0;   // >= 1
  int32_t num_splits = 1;  // key ranges per sequence, 1 to 64
  float scale = 1.0f;      // applied to q . k
};

}  // namespace strata::cuda

namespace strata::cuda {

// The attention block's step between the QKV product and attention, for a batch of tokens:
// each query and key head normalized (Qwen3's q_norm / k_norm; skipped when the weights are
// null, as for Llama), rotated by the token's position (RoPE, Hugging Face's rotate_half:
// element i pairs with element i + head_dim / 2), and the token's key and value written into
// its slot of the layer's pages. The query (and the key) are rotated in place in `qkv`.
struct QkNormRopeStoreArgs {
  // BF16 [num_tokens][(num_heads + 2 * num_kv_heads) * head_dim]: each token's q heads, then
  // its k heads, then its v heads (the fused QKV product, biases added).
  uint16_t* qkv = nullptr;
  const uint16_t* q_norm_weight = nullptr;  // BF16 [head_dim], or null: no q/k norm
  const uint16_t* k_norm_weight = nullptr;  // BF16 [head_dim], null with q_norm_weight
  // F32 [num_tokens][head_dim]: cos of the token's angles [0, head_dim / 2), then their sin
  // (the host computes them, with model/kernels.h's RopeTable, so CPU and GPU rotate alike).
  const float* cos_sin = nullptr;
  // [num_tokens]: where each token's K and V go, page * page_size + slot; -1: nowhere (a
  // padding row).
  const int32_t* slots = nullptr;
  uint16_t* k_pages = nullptr;  // BF16 [num_pages][num_kv_heads][page_size][head_dim]
  uint16_t* v_pages = nullptr;  // the same for V
  int32_t num_tokens = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;   // 64 or 128
  int32_t page_size = 0;  // >= 1
  float eps = 1e-6f;
};

// One contiguous copy for the copy kernel (copy_spans.cu): memory/copy_device.h's CopySpan
// as the kernel reads it. The host side of a span is page-locked host memory that the device
// addresses directly.
struct CopySpanArg {
  void* dst = nullptr;
  const void* src = nullptr;
  uint64_t bytes = 0;
};

}  // namespace strata::cuda

namespace strata::cuda {

// Sampling on the device (sample_rows.cu): one row's rules, model/sampler.h's RowSampling
// as the kernel reads it, and the batch's arguments. The kernel draws as the Sampler does:
// argmax at temperature 0; else the top_k largest (by value, then the smaller id), then the
// shortest ranked prefix whose weight exp((logit - max) / T) reaches top_p of theirs, walked in
// token-id order until the running sum exceeds uniform x their total.
inline constexpr int32_t kSampleDraw = 1;           // draw this row (else its token is -1)
inline constexpr int32_t kSampleLogprob = 2;        // and report its token's log-probability
inline constexpr int32_t kSampleMaxTop = 20;        // alternatives a row may ask for
inline constexpr int32_t kSampleCandidates = 2048;  // ranked tokens the kernel holds at most

struct SampleRowArg {
  double uniform = 0.0;  // in [0, 1), drawn on the host by the request's generator
  float temperature = 0.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;         // <= 0 or >= cols: no limit
  int32_t top_logprobs = 0;  // 0 .. kSampleMaxTop
  int32_t flags = 0;         // kSampleDraw | kSampleLogprob
  int32_t pad = 0;
};

struct SampleRowsArgs {
  const float* logits = nullptr;         // F32 [rows][cols]
  const SampleRowArg* params = nullptr;  // [rows] (device memory)
  // [rows]: each row's token; -1 when not drawn: no kSampleDraw, or a row the kernel cannot
  // draw within kSampleCandidates ranked tokens (top_k above it, a top_p nucleus or ties
  // wider than it): the caller then reads the row's logits and draws on the host by the same
  // rules and number.
  int32_t* tokens = nullptr;
  float* logprobs = nullptr;      // [rows]: log-softmax of the raw logits at the token
  int32_t* top_ids = nullptr;     // [rows][kSampleMaxTop]: the most likely tokens, ties by id
  float* top_logprobs = nullptr;  // [rows][kSampleMaxTop]: their log-probabilities
  int32_t rows = 0;
  int32_t cols = 0;
};

}  // namespace strata::cuda
