// The device KV page pool: the bytes of every layer's keys and values for `num_pages`
// pages of `page_size` tokens, addressed by the PageIds that the radix tree hands out.
// On this CPU build "device" memory is ordinary (anonymous, huge-page advised) memory.
//
// Layout (one allocation, layer-first, then K/V, then page, then KV head):
//
//   layer l, K: base + (2 l)     * layer_region_bytes()    [page][kv_head][head_dim][slot]
//   layer l, V: base + (2 l + 1) * layer_region_bytes()    [page][kv_head][slot][head_dim]
//
// One page's K (or V) in one layer is a contiguous block of
// `num_kv_heads * page_size * head_dim` elements; inside it each head has a contiguous
// `page_size * head_dim` sub-block, laid out for the attention kernel:
//
//   F32, F16 (and BF16 with a page size that is not a multiple of 16):
//     K dimension-major: element d of slot s at  d * page_size + s
//     V token-major:     element d of slot s at  s * head_dim + d
//   BF16 with a page size that is a multiple of 16 ("paired"):
//     K in dimension pairs: element d of slot s at  ((d / 2) * page_size + s) * 2 + d % 2
//     V in slot pairs:      element d of slot s at  ((s / 2) * head_dim + d) * 2 + s % 2
//
//   int8, fp8_e4m3 (scaled, kv_quant.h): codes in the F32 order above (one byte each),
//   then one BF16 scale per (head, slot) after all heads' codes, [kv_head][slot]:
//     scale of slot s of head h at  block_elements() + (h * page_size + s) * 2  bytes
//   so the block stays one self-contained run of kv_block_bytes() bytes, and the scales
//   of 16 consecutive keys are one 32-byte vector, like their K codes' dims.
//
// Dimension-major K puts dim d of 16 consecutive keys in one 64-byte vector, so scores
// are computed straight from the page with no transpose (vLLM lays out its K cache for
// the same reason). The paired BF16 layouts put the two values that one vdpbf16ps lane
// multiplies side by side (two dims of a key for q.k, two keys of a dim for p.v).
// Elements are F32, F16, BF16 or 8-bit codes (kv_dtype.h). write_token, read_token and the index
// functions hide the layout from callers that handle single tokens.
//
// Page copies to and from a caller's contiguous buffer (host tier, storage) move the
// bytes unchanged, for all layers of one page (`page_bytes()` bytes):
//
//   for l in 0..num_layers: [K block of page in layer l][V block of page in layer l]
//
// and for one layer of one page (`layer_page_bytes()` bytes): [K block][V block]. A
// page copied out of a pool and into another pool of the same shape restores the same
// keys and values.
//
// Thread: the pool holds no metadata that changes; reading and writing distinct pages
// from different threads is safe. Ordering accesses to the same page (the forward pass
// writing it while a copy reads it) is the caller's job (the scheduler's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "common/result.h"
#include "memory/kv_block_layout.h"
#include "memory/kv_dtype.h"
#include "memory/page_id.h"

namespace strata {

struct KvPoolShape {
  int32_t num_layers = 0;    // transformer layers, >= 1
  int32_t num_kv_heads = 0;  // key/value heads per layer, >= 1
  int32_t head_dim = 0;      // elements per head, >= 1
  int32_t num_pages = 0;     // pages in the pool, >= 1
  int32_t page_size = 0;     // tokens per page, >= 1
  KvDtype dtype = KvDtype::kF32;
};

// Returns an error naming the first invalid field, or a size that overflows.
Status validate_kv_pool_shape(const KvPoolShape& shape);

// Whether pages of `shape` use the paired BF16 block order (the top of this file).
constexpr bool kv_paired_bf16(const KvPoolShape& shape) {
  return shape.dtype == KvDtype::kBF16 && shape.page_size % 16 == 0 && shape.head_dim % 2 == 0;
}

// What the bytes of a page buffer of `shape` are, as the one number that storage frames
// carry (storage_backend.h, StorageConfig::page_format): bits 0..7 the dtype + 1, bit 8
// the paired BF16 block order, bit 9 a model's own block order (`external`: a GPU's
// pages), bits 16..23 the page buffer's format family (1: copy_page_out's).
constexpr uint32_t kv_page_format(const KvPoolShape& shape, bool external) {
  return (static_cast<uint32_t>(shape.dtype) + 1) | (kv_paired_bf16(shape) ? 1u << 8 : 0u) |
         (external ? 1u << 9 : 0u) | (1u << 16);
}

// Bytes of one page of `shape` (all layers, K and V, scales included): KvPool::page_bytes()
// without a pool. The shape's num_pages is not read.
inline size_t kv_page_bytes(const KvPoolShape& shape) {
  return 2 * static_cast<size_t>(shape.num_layers) *
         kv_block_bytes(shape.dtype, static_cast<size_t>(shape.num_kv_heads),
                        static_cast<size_t>(shape.page_size), static_cast<size_t>(shape.head_dim));
}

class KvPool {
 public:
  // Allocates a zeroed pool. An invalid shape or a failed allocation fails a check;
  // use create() to get an error value instead.
  KvPool(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim, int32_t num_pages,
         int32_t page_size, KvDtype dtype);
  explicit KvPool(const KvPoolShape& shape);
  ~KvPool();

  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  // Validates the shape and allocates; kInvalidArgument for a bad shape,
  // kResourceExhausted when the memory cannot be had.
  static Result<std::unique_ptr<KvPool>> create(const KvPoolShape& shape);

  const KvPoolShape& shape() const { return shape_; }
  int32_t num_layers() const { return shape_.num_layers; }
  int32_t num_kv_heads() const { return shape_.num_kv_heads; }
  int32_t head_dim() const { return shape_.head_dim; }
  int32_t num_pages() const { return shape_.num_pages; }
  int32_t page_size() const { return shape_.page_size; }
  KvDtype dtype() const { return shape_.dtype; }
  size_t element_size_bytes() const { return kv_dtype_size_bytes(shape_.dtype); }

  // Elements of one head's K (or V) in one page: page_size * head_dim.
  size_t head_block_elements() const { return head_block_elements_; }
  // Elements of one page's K (or V) in one layer: num_kv_heads * page_size * head_dim.
  size_t block_elements() const { return block_elements_; }
  // Bytes of one page's K (or V) in one layer, scales included (kv_block_bytes).
  size_t block_bytes() const { return block_bytes_; }
  // Bytes of one page's K and V in one layer (the per-layer copy unit).
  size_t layer_page_bytes() const { return 2 * block_bytes_; }
  // Bytes of one page's K and V in all layers (the page copy unit).
  size_t page_bytes() const { return layer_page_bytes() * static_cast<size_t>(num_layers()); }
  // Bytes of one layer's K (or V) for all pages.
  size_t layer_region_bytes() const { return layer_region_bytes_; }
  size_t total_bytes() const { return total_bytes_; }

  bool is_valid_page(PageId page) const {
    return page_index(page) >= 0 && page_index(page) < shape_.num_pages;
  }

  // Whether the paired BF16 layout is in use (see the top of this file).
  bool paired_bf16() const { return paired_bf16_; }
  // Offsets, in elements from the start of a K (or V) block, of element d of `slot` of
  // `head`.
  size_t k_index(int32_t head, int32_t slot, int32_t d) const {
    const size_t h = static_cast<size_t>(head) * head_block_elements_;
    const size_t ps = static_cast<size_t>(shape_.page_size);
    return paired_bf16_ ? h + (static_cast<size_t>(d / 2) * ps + static_cast<size_t>(slot)) * 2 +
                              static_cast<size_t>(d % 2)
                        : h + static_cast<size_t>(d) * ps + static_cast<size_t>(slot);
  }
  size_t v_index(int32_t head, int32_t slot, int32_t d) const {
    const size_t h = static_cast<size_t>(head) * head_block_elements_;
    const size_t hd = static_cast<size_t>(shape_.head_dim);
    return paired_bf16_ ? h + (static_cast<size_t>(slot / 2) * hd + static_cast<size_t>(d)) * 2 +
                              static_cast<size_t>(slot % 2)
                        : h + static_cast<size_t>(slot) * hd + static_cast<size_t>(d);
  }

  // Scaled dtypes: the byte offset, from the start of a K (or V) block, of the BF16 scale
  // of `slot` of `head`.
  size_t scale_offset_bytes(int32_t head, int32_t slot) const {
    return block_elements_ + (static_cast<size_t>(head) * static_cast<size_t>(shape_.page_size) +
                              static_cast<size_t>(slot)) *
                                 kKvScaleBytes;
  }

  // The K or V block of `page` in `layer` (all heads), elements of dtype() laid out as
  // described at the top of this file. The layer and page must be valid (checked).
  std::byte* k_block(int32_t layer, PageId page) { return block(layer, page, 0); }
  std::byte* v_block(int32_t layer, PageId page) { return block(layer, page, 1); }
  const std::byte* k_block(int32_t layer, PageId page) const { return block(layer, page, 0); }
  const std::byte* v_block(int32_t layer, PageId page) const { return block(layer, page, 1); }

  // Where every block is, for a copy engine that moves blocks by address
  // (kv_block_layout.h).
  KvBlockLayout block_layout() const;
  // Writes one token's keys and values (F32, [num_kv_heads][head_dim] each, converted
  // to dtype(); quantized per head for the scaled dtypes) into `slot` of `page` in `layer`.
  void write_token(int32_t layer, PageId page, int32_t slot, const float* k, const float* v);
  // Reads them back (widened to F32).
  void read_token(int32_t layer, PageId page, int32_t slot, float* k, float* v) const;
  // Reads one head's key and value of one token (head_dim F32 values each).
  void read_head(int32_t layer, PageId page, int32_t slot, int32_t head, float* k, float* v) const;

  // Page copies in the buffer format described at the top of this file. The buffer
  // must be exactly page_bytes() (or layer_page_bytes()) long and the page valid;
  // anything else is a bug in the caller and fails a check.
  void copy_page_out(PageId page, std::span<std::byte> dst) const;
  void copy_page_in(PageId page, std::span<const std::byte> src);
  void copy_layer_page_out(int32_t layer, PageId page, std::span<std::byte> dst) const;
  void copy_layer_page_in(int32_t layer, PageId page, std::span<const std::byte> src);

 private:
  struct NoAllocate {};
  KvPool(const KvPoolShape& shape, NoAllocate);
  bool allocate();
  std::byte* block(int32_t layer, PageId page, int kv) const;

  KvPoolShape shape_;
  bool paired_bf16_ = false;
  size_t head_block_elements_ = 0;
  size_t block_elements_ = 0;
  size_t block_bytes_ = 0;
  size_t layer_region_bytes_ = 0;
  size_t total_bytes_ = 0;
  std::byte* data_ = nullptr;  // owned mapping of total_bytes_
};

}  // namespace strata
