// The host KV page pool (the L2 tier of the hierarchical cache): page memory beside the
// device pool (KvPool) that keeps blocks evicted from the device, blocks written through
// to it, and blocks prefetched from storage. It provides memory and copies only; which
// host page holds which block is decided by the radix tree, and host page ids come from a
// PageAllocator of this pool's size.
//
// Every move between the two pools is an explicit copy, as on a GPU, even though on this
// CPU build both live in ordinary memory. Pages move between the pools, and to storage,
// unchanged byte for byte: no dtype conversion ever happens here.
//
// Layouts (HiCache's --hicache-mem-layout). L = layers; a "block" is one page's K (or V)
// in one layer, in the device's head/dim-blocked element order (kv_pool.h):
//
//   layer_first        the device pool's own arrangement: per layer, per K/V, all pages'
//                      blocks contiguous. Device <-> host is one memcpy per block (per
//                      page, layer and K/V) and per-layer loads touch one region. A whole
//                      page for storage is a gather of 2 L blocks.
//   page_first         each page contiguous, token-major inside:
//                      [slot][layer][K|V][head][dim]. One token's KV for all layers is
//                      adjacent (SGLang's page_first, good for storage I/O), but the device
//                      wants head/dim-blocked blocks, so every move to or from the device
//                      (and to or from a canonical page buffer) permutes element by
//                      element: the slowest layout (about a fifth of memcpy's speed).
//   page_first_direct  each page contiguous in the canonical page buffer format of
//                      KvPool::copy_page_out: [layer][K block][V block]. Storage I/O is
//                      zero-copy (page_view), and device <-> host is one memcpy per
//                      block, as for layer_first. Per-layer loads gather one slice from
//                      each page.
//
// Memory: one anonymous mapping (zeroed, huge-page advised like KvPool), sized with an
// overflow check.
//
// Thread: the pool holds no metadata that changes (page_first copies use a scratch
// buffer per thread). Copies of distinct pages may run on different threads at once (the
// TransferEngine does so); ordering accesses to the same page, host or device, is the
// caller's job.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "common/result.h"
#include "memory/kv_block_layout.h"
#include "memory/kv_pool.h"
#include "memory/page_id.h"

namespace strata {

enum class HostLayout { kLayerFirst, kPageFirst, kPageFirstDirect };

// "layer_first", "page_first", "page_first_direct".
Result<HostLayout> parse_host_layout(std::string_view name);
std::string_view host_layout_name(HostLayout layout);

class HostKvPool {
 public:
  // `shape` is the device pool's shape with num_pages = the number of host pages.
  // kInvalidArgument for a bad shape, kResourceExhausted when the memory cannot be had.
  static Result<std::unique_ptr<HostKvPool>> create(const KvPoolShape& shape, HostLayout layout);
  ~HostKvPool();

  HostKvPool(const HostKvPool&) = delete;
  HostKvPool& operator=(const HostKvPool&) = delete;

  int32_t num_pages() const { return shape_.num_pages; }
  HostLayout layout() const { return layout_; }
  const KvPoolShape& shape() const { return shape_; }
  // Bytes of one page, all layers: KvPool::page_bytes() of the same shape.
  size_t page_bytes() const { return page_bytes_; }
  size_t total_bytes() const { return total_bytes_; }
  bool is_valid_page(PageId page) const {
    return page_index(page) >= 0 && page_index(page) < shape_.num_pages;
  }

  // Batch copies of all layers between device pages and host pages (pair i:
  // device_pages[i] <-> host_pages[i]). Spans of different lengths, invalid pages or a
  // device pool of another shape (num_pages aside) are caller bugs and fail a check.
  void copy_from_device(const KvPool& device, std::span<const PageId> device_pages,
                        std::span<const PageId> host_pages);
  void copy_to_device(std::span<const PageId> host_pages, KvPool& device,
                      std::span<const PageId> device_pages) const;
  // One layer only, so that layer N+1 loads while layer N computes.
  void copy_layer_to_device(int32_t layer, std::span<const PageId> host_pages, KvPool& device,
                            std::span<const PageId> device_pages) const;

  // A page in the canonical page buffer format of KvPool::copy_page_out (what storage
  // keeps); the buffer must be exactly page_bytes() long (checked).
  void read_page(PageId host_page, std::span<std::byte> dst) const;
  void write_page(PageId host_page, std::span<const std::byte> src);

  // Where every block is (kv_block_layout.h): layer_first and page_first_direct only,
  // nullopt for page_first, whose blocks are not contiguous.
  std::optional<KvBlockLayout> block_layout() const;
  // The whole pool's memory (to register it with a device for fast copies).
  std::byte* data() const { return data_; }

  // page_first_direct: the page's canonical buffer itself, for zero-copy storage I/O.
  // Other layouts: an empty span (use read_page / write_page).
  std::span<const std::byte> page_view(PageId host_page) const;
  std::span<std::byte> page_view(PageId host_page);

 private:
  // page_first only. One layer's K (or V) rows, packed token-major as [slot][head][dim],
  // are permuted into the device block order through tables made once from
  // KvPool::k_index / v_index: the block order stays defined in one place, and both
  // directions are plain gathers that write in order.
  struct BlockMap {
    std::vector<uint32_t> block_of_row;  // packed element -> block element
    std::vector<uint32_t> row_of_block;  // block element -> packed element
  };

  HostKvPool(const KvPoolShape& shape, HostLayout layout, const KvPool& block_layout);
  BlockMap make_block_map(const KvPool& block_layout, int kv) const;

  // Where the K (kv = 0) or V (kv = 1) block of `page` in `layer` starts
  // (layer_first and page_first_direct only: page_first has no contiguous blocks).
  std::byte* block(int32_t layer, PageId page, int kv) const;
  // page_first: where slot 0's K (kv = 0) or V (kv = 1) rows of `layer` start in `page`;
  // slot s's follow at s * slot_stride_bytes_.
  std::byte* rows(int32_t layer, PageId page, int kv) const;
  void check_page(PageId page) const;
  void check_device(const KvPool& device) const;

  // One layer of one host page to (out) or from (in) a K block and a V block in the
  // device order: the device pool's, or a canonical page buffer's.
  void layer_out(PageId page, int32_t layer, std::byte* k, std::byte* v) const;
  void layer_in(PageId page, int32_t layer, const std::byte* k, const std::byte* v);
  // The page_first cases, through a per-thread packed buffer of one block.
  std::span<std::byte> packed_rows() const;
  void page_first_out(PageId page, int32_t layer, std::byte* k, std::byte* v) const;
  void page_first_in(PageId page, int32_t layer, const std::byte* k, const std::byte* v);

  KvPoolShape shape_;
  HostLayout layout_;
  size_t element_bytes_ = 0;
  size_t block_bytes_ = 0;       // one page's K (or V) in one layer
  size_t layer_page_bytes_ = 0;  // K and V blocks of one page in one layer
  size_t page_bytes_ = 0;
  size_t total_bytes_ = 0;
  size_t slot_stride_bytes_ = 0;  // page_first: one token, all layers
  BlockMap k_map_;                // page_first only
  BlockMap v_map_;                // page_first only
  std::byte* data_ = nullptr;     // owned mapping of total_bytes_
};

}  // namespace strata
