// One (query tile, KV head) of an extend batch as both extend kernels read it
// (extend_attention.cuh on CUDA cores, extend_attention_tc.cuh on tensor cores): its
// sequence, its tokens and their positions, and where the KV head's keys and values are.
// Row r of a tile is token r / group of the tile and query head r % group of the KV head's
// group (token-major).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/kernel_args.h"

namespace strata::cuda::detail {

template <int D>
struct ExtendTile {
  int group = 0;
  int first = 0;     // the tile's first new token, within its sequence
  int base_pos = 0;  // the position of the sequence's new token 0
  int tokens = 0;    // the tile's tokens
  int rows = 0;      // tokens x group
  int last_key = 0;  // what the tile's last token sees
  int page_size = 0;
  size_t q0 = 0;  // the sequence's first row of q and out
  size_t q_stride = 0;
  size_t kv_head = 0;
  size_t page_stride = 0;
  const int32_t* pages = nullptr;
  const uint16_t* k_base = nullptr;
  const uint16_t* v_base = nullptr;

  __device__ ExtendTile(const ExtendAttentionArgs& a, int tile, int head, int rows_per_tile) {
    group = a.num_heads / a.num_kv_heads;
    const int seq = a.tile_seq[tile];
    first = a.tile_first[tile];
    q0 = static_cast<size_t>(a.qo_start[seq]);
    const int n_new = a.qo_start[seq + 1] - a.qo_start[seq];
    base_pos = a.kv_lens[seq] - n_new;
    tokens = min(rows_per_tile / group, n_new - first);
    rows = tokens * group;
    last_key = base_pos + first + tokens - 1;
    page_size = a.page_size;
    q_stride = a.q_stride > 0 ? a.q_stride : static_cast<size_t>(a.num_heads) * D;
    kv_head = static_cast<size_t>(head);
    pages = a.page_table + static_cast<size_t>(seq) * a.page_table_stride;
    const size_t head_stride = static_cast<size_t>(a.page_size) * D;
    page_stride = head_stride * a.num_kv_heads;
    k_base = a.k_pages + kv_head * head_stride;
    v_base = a.v_pages + kv_head * head_stride;
  }

  __device__ size_t token_of(int r) const { return q0 + first + r / group; }
  __device__ size_t head_of(int r) const { return kv_head * group + r % group; }
  // The position of row r's token (it sees the keys up to it: causal).
  __device__ int position(int r) const { return base_pos + first + r / group; }
  // Row r's query (D elements) and where its output goes.
  __device__ const uint16_t* query(const ExtendAttentionArgs& a, int r) const {
    return a.q + token_of(r) * q_stride + head_of(r) * D;
  }
  __device__ size_t out_offset(const ExtendAttentionArgs& a, int r) const {
    return (token_of(r) * a.num_heads + head_of(r)) * D;
  }
  // The offset of key `pos` in k_base and v_base (D contiguous elements).
  __device__ size_t key_offset(int pos) const {
    return static_cast<size_t>(pages[pos / page_size]) * page_stride +
           static_cast<size_t>(pos % page_size) * D;
  }
};

}  // namespace strata::cuda::detail
