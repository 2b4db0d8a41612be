// Causal, grouped-query attention over paged KV, flash-attention style: keys and values
// are visited in tiles of kKeyTile positions gathered from the sequence's pages, with an
// online softmax (running max and sum per query row), so the working set of one task
// stays in the L2 cache whatever the context length and no T x T score matrix exists.
//
// Work split: one task = one sequence x one KV head x one block of query tokens. The
// query heads that share the KV head are processed together (their rows form one
// matrix), so every K/V tile is read once per group, not once per head. Tasks go to the
// pool's threads heaviest first.
//
// Keys are read straight from the pages (K is stored dimension-major, kv_pool.h), 16
// keys per vector; scores and outputs come from register-blocked micro-kernels (6 rows
// x 64 keys, 6 rows x 64 dims), F16/BF16 widened in registers. With paired BF16 pages
// both products run on vdpbf16ps instead (q and p rounded to BF16, as GPU flash
// attention does). Page sizes or head dims that are not multiples of 16 take a gather
// path through scratch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "memory/kv_pool.h"
#include "model/aligned_buffer.h"
#include "model/thread_pool.h"

namespace strata {

struct AttentionShape {
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int64_t sliding_window = 0;  // > 0: a query at position p sees keys (p - window, p]
  float scale = 1.0f;          // applied to q . k (1 / sqrt(head_dim))
};

// One sequence of a batch, as attention sees it. Its new tokens' K and V must already
// be in the pool; the query at new token i has position start_position + i and sees
// keys [0, start_position + i] (or the window's tail of it).
struct AttentionSequence {
  int64_t first_row = 0;               // row of the first new token in q and out
  int32_t num_tokens = 0;              // new tokens, >= 1
  int64_t start_position = 0;          // tokens already in the pages before this call
  std::span<const PageId> page_table;  // covers positions [0, start_position + num_tokens)
};

class PagedAttention {
 public:
  static constexpr int32_t kKeyTile = 64;    // keys per tile
  static constexpr int32_t kRowTarget = 64;  // query rows (tokens x group heads) per task

  PagedAttention(const AttentionShape& shape, int num_threads);

  // q: row t, head h at q[t * q_stride + h * head_dim], already rotated. Writes the
  // attention output of row t, head h at out[t * out_stride + h * head_dim].
  void run(ThreadPool& pool, std::span<const AttentionSequence> sequences, const float* q,
           int64_t q_stride, const KvPool& kv, int32_t layer, float* out, int64_t out_stride);

 private:
  struct Task {
    int32_t sequence;
    int32_t kv_head;
    int32_t token_begin;
    int32_t token_end;
    int64_t cost;  // keys x rows, to order tasks heaviest first
  };
  struct Workspace {
    AlignedBuffer q;       // [rows][head_dim], scaled
    AlignedBuffer k;       // wide: [head_dim][kKeyTile] (transposed); narrow: [kKeyTile][head_dim]
    AlignedBuffer v;       // [kKeyTile][head_dim]
    AlignedBuffer scores;  // [rows][kKeyTile]
    AlignedBuffer q_bf16;  // [rows][head_dim], paired BF16 pages only
    AlignedBuffer p_bf16;  // [rows][kKeyTile], paired BF16 pages only
    AlignedBuffer acc;     // [rows][head_dim]
    std::vector<float> row_max;
    std::vector<float> row_sum;
    std::vector<int64_t> row_position;
    std::vector<int64_t> row_low;  // first visible key (sliding window)
  };

  void run_task(const Task& task, std::span<const AttentionSequence> sequences, const float* q,
                int64_t q_stride, const KvPool& kv, int32_t layer, float* out, int64_t out_stride,
                Workspace& ws) const;

  AttentionShape shape_;
  int32_t group_size_;
  int32_t tokens_per_task_;
  std::vector<Workspace> workspaces_;  // one per thread
  std::vector<Task> tasks_;
};

}  // namespace strata
