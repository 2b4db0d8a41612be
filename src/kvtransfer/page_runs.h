// Page runs: the contiguous byte copies that move a set of KV pages from one pool into
// another pool of the same page shape (prefill worker -> decode worker).
//
// The pool (memory/kv_pool.h) is layer-first: region r = 2 * layer + kv (K = 0, V = 1)
// holds that layer's K (or V) blocks of every page, one block per page, pages in id
// order. One page is therefore 2 * num_layers blocks, one per region, each
// `block_bytes` long and strided by the region size; it is never contiguous as a whole.
// Pages p..p+n-1 of one region are contiguous, so a pair list that maps consecutive
// source pages onto consecutive destination pages becomes one copy per region:
//
//   src_offset = r * src_region_bytes + src_page * block_bytes
//   dst_offset = r * dst_region_bytes + dst_page * block_bytes
//   size_bytes = n * block_bytes                       for r in 0 .. 2 * num_layers
//
// The two pools may differ in num_pages (each worker sizes its own pool), hence the two
// region sizes. Inside a block the element order depends only on the page shape (dtype,
// page_size, head_dim: kv_pool.h), which both pools share, so blocks move unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/result.h"
#include "memory/kv_pool.h"
#include "memory/page_id.h"

namespace strata {

struct PageRun {
  uint64_t src_offset = 0;  // bytes from the source pool's base
  uint64_t dst_offset = 0;  // bytes from the destination pool's base
  uint64_t size_bytes = 0;  // > 0
  bool operator==(const PageRun&) const = default;
};

// kInvalidArgument naming the first field, other than num_pages, in which the shapes
// differ (or an invalid shape): pages cannot move between such pools.
Status check_page_compatible(const KvPoolShape& src, const KvPoolShape& dst);

// Byte geometry of a pool, derived from its shape as memory/kv_pool.cc lays it out.
struct KvPoolGeometry {
  uint64_t block_bytes = 0;   // one page's K (or V) in one layer
  uint64_t region_bytes = 0;  // block_bytes * num_pages
  int32_t num_regions = 0;    // 2 * num_layers
  int32_t num_pages = 0;
  uint64_t total_bytes() const { return region_bytes * static_cast<uint64_t>(num_regions); }
};
KvPoolGeometry kv_pool_geometry(const KvPoolShape& shape);

// Plans the copies that move src_pages[i] of a `src` pool into dst_pages[i] of a `dst`
// pool, for every i. Pairs are merged into the longest runs they allow whatever their
// order (they are sorted by source page first), and runs that end where the next begins
// on both sides (a run to the end of one region continuing at the start of the next)
// are joined. Runs come in ascending source order and never overlap on the destination
// side (nor on the source side unless a source page is listed twice).
//
// kInvalidArgument for incompatible shapes, lists of different lengths, a page outside
// its pool, or a destination page listed twice (two sources for one page is a caller
// bug). A source page listed twice is allowed (its bytes go to both destinations). An
// empty list plans no runs.
Result<std::vector<PageRun>> plan_page_runs(const KvPoolShape& src, const KvPoolShape& dst,
                                            std::span<const PageId> src_pages,
                                            std::span<const PageId> dst_pages);

// Sum of size_bytes.
uint64_t page_runs_bytes(std::span<const PageRun> runs);

// Copies each run from src_base to dst_base in this process (the in-process reference and
// the memcpy baseline of the transfer benchmark). The caller guarantees every run lies
// inside both buffers.
void copy_page_runs(const std::byte* src_base, std::byte* dst_base, std::span<const PageRun> runs);

// The first byte of a pool's allocation: layer 0's K block of page 0 (kv_pool.h puts
// region 0 at the base). The transports register [base, base + total_bytes()).
std::byte* kv_pool_base(KvPool& pool);
const std::byte* kv_pool_base(const KvPool& pool);

}  // namespace strata
