// Where a pool keeps its KV blocks, as plain addresses: the form in which a copy engine
// that moves bytes between two memories (a GPU's and the host's) sees a pool.
//
// A "block" is one page's K (kv = 0) or V (kv = 1) in one layer (kv_pool.h). In the pools
// this applies to, every block is contiguous and blocks are placed affinely: block
// (layer, page, kv) starts at
//
//   base + (2 * layer + kv) * region_stride + page * page_stride
//
// The device pool (KvPool, layer-first: region_stride = a layer's K or V for all pages,
// page_stride = block_bytes), the host pool in layer_first (the same arrangement) and in
// page_first_direct (region_stride = block_bytes, page_stride = a whole page) all are; the
// host pool's page_first is not (a page's rows are interleaved token by token) and has no
// block layout. The GPU pool uses the same form with device addresses.
//
// The layout borrows the memory; it does not own it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "memory/page_id.h"

namespace strata {

struct KvBlockLayout {
  std::byte* base = nullptr;
  int32_t num_layers = 0;
  int32_t num_pages = 0;
  size_t block_bytes = 0;    // one page's K (or V) in one layer
  size_t region_stride = 0;  // from (layer, K) to (layer, V), and from (layer, V) to (layer + 1, K)
  size_t page_stride = 0;    // from page p to page p + 1 in one layer and K/V

  // The block's first byte; the caller has checked layer, page and kv.
  std::byte* block(int32_t layer, PageId page, int kv) const {
    return base + static_cast<size_t>(2 * layer + kv) * region_stride +
           static_cast<size_t>(page_index(page)) * page_stride;
  }
  // Whether the blocks of consecutive pages (same layer and K/V) are adjacent, so that a
  // run of consecutive pages is one contiguous range.
  bool pages_adjacent() const { return page_stride == block_bytes; }
};

}  // namespace strata
