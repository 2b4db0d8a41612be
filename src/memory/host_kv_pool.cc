#include "memory/host_kv_pool.h"

#include <sys/mman.h>

#include <cstring>
#include <limits>
#include <string>

#include "common/check.h"

namespace strata {

namespace {

// Moves elements as raw words of their size; memcpy keeps unaligned caller buffers legal
// and compiles to a plain load/store.
template <typename Word>
void move_element(const std::byte* src, size_t src_index, std::byte* dst, size_t dst_index) {
  Word w;
  std::memcpy(&w, src + src_index * sizeof(Word), sizeof(Word));
  std::memcpy(dst + dst_index * sizeof(Word), &w, sizeof(Word));
}

// dst[i] = src[index[i]] for i < n, elements of sizeof(Word) bytes.
template <typename Word>
void gather(const std::byte* src, const uint32_t* index, size_t n, std::byte* dst) {
  for (size_t i = 0; i < n; ++i) move_element<Word>(src, index[i], dst, i);
}

void gather_elements(size_t element_bytes, const std::byte* src, const uint32_t* index, size_t n,
                     std::byte* dst) {
  if (element_bytes == 1) {
    gather<uint8_t>(src, index, n, dst);
  } else if (element_bytes == 2) {
    gather<uint16_t>(src, index, n, dst);
  } else {
    gather<uint32_t>(src, index, n, dst);
  }
}

void check_same_length(size_t a, size_t b) {
  STRATA_CHECK_MSG(a == b, "page lists of different lengths: " + std::to_string(a) + " and " +
                               std::to_string(b));
}

}  // namespace

Result<HostLayout> parse_host_layout(std::string_view name) {
  if (name == "layer_first") return HostLayout::kLayerFirst;
  if (name == "page_first") return HostLayout::kPageFirst;
  if (name == "page_first_direct") return HostLayout::kPageFirstDirect;
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown host memory layout '" + std::string(name) +
                        "' (expected layer_first, page_first or page_first_direct)");
}

std::string_view host_layout_name(HostLayout layout) {
  switch (layout) {
    case HostLayout::kLayerFirst:
      return "layer_first";
    case HostLayout::kPageFirst:
      return "page_first";
    case HostLayout::kPageFirstDirect:
      return "page_first_direct";
  }
  return "unknown";
}

HostKvPool::HostKvPool(const KvPoolShape& shape, HostLayout layout, const KvPool& block_layout)
    : shape_(shape), layout_(layout) {
  // The scaled dtypes permute bytes: a code is one, a scale four in a row.
  element_bytes_ = kv_dtype_is_scaled(shape.dtype) ? 1 : block_layout.element_size_bytes();
  block_bytes_ = block_layout.block_bytes();
  layer_page_bytes_ = block_layout.layer_page_bytes();
  page_bytes_ = block_layout.page_bytes();
  // validate_kv_pool_shape has checked that this product fits.
  total_bytes_ = page_bytes_ * static_cast<size_t>(shape.num_pages);
  if (layout == HostLayout::kPageFirst) {
    slot_stride_bytes_ = 2 * static_cast<size_t>(shape.num_layers) * block_bytes_ /
                         static_cast<size_t>(shape.page_size);
    k_map_ = make_block_map(block_layout, 0);
    v_map_ = make_block_map(block_layout, 1);
  }
}

HostKvPool::BlockMap HostKvPool::make_block_map(const KvPool& block_layout, int kv) const {
  // Units of element_bytes_: elements, or bytes for the scaled dtypes, whose row for a
  // slot is [head][dim] codes then [head] scales.
  const size_t units = block_bytes_ / element_bytes_;
  BlockMap map;
  map.block_of_row.reserve(units);
  map.row_of_block.resize(units);
  auto add = [&map](size_t block) {
    map.row_of_block[block] = static_cast<uint32_t>(map.block_of_row.size());
    map.block_of_row.push_back(static_cast<uint32_t>(block));
  };
  for (int32_t s = 0; s < shape_.page_size; ++s) {
    for (int32_t h = 0; h < shape_.num_kv_heads; ++h) {
      for (int32_t d = 0; d < shape_.head_dim; ++d) {
        add(kv == 0 ? block_layout.k_index(h, s, d) : block_layout.v_index(h, s, d));
      }
    }
    if (kv_dtype_is_scaled(shape_.dtype)) {
      for (int32_t h = 0; h < shape_.num_kv_heads; ++h) {
        for (size_t b = 0; b < kKvScaleBytes; ++b) add(block_layout.scale_offset_bytes(h, s) + b);
      }
    }
  }
  STRATA_CHECK(map.block_of_row.size() == units);
  return map;
}

HostKvPool::~HostKvPool() {
  if (data_ != nullptr) munmap(data_, total_bytes_);
}

Result<std::unique_ptr<HostKvPool>> HostKvPool::create(const KvPoolShape& shape,
                                                       HostLayout layout) {
  if (auto s = validate_kv_pool_shape(shape); !s) return std::unexpected(s.error());
  // A one-page pool of the same shape, for its sizes and index functions only: its
  // mapping is never touched, so it costs address space, not memory.
  KvPoolShape one_page = shape;
  one_page.num_pages = 1;
  auto block_layout = KvPool::create(one_page);
  if (!block_layout) return std::unexpected(block_layout.error());
  if (layout == HostLayout::kPageFirst &&
      (*block_layout)->block_bytes() > std::numeric_limits<uint32_t>::max()) {
    return make_error(ErrorCode::kUnsupported,
                      "the page_first host layout needs blocks of fewer than 2^32 bytes");
  }
  std::unique_ptr<HostKvPool> pool(new HostKvPool(shape, layout, **block_layout));
  // Anonymous mappings arrive zeroed and are only backed when touched.
  void* p =
      mmap(nullptr, pool->total_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return make_error(
        ErrorCode::kResourceExhausted,
        "cannot allocate the host KV pool: " + std::to_string(pool->total_bytes_) + " bytes");
  }
  madvise(p, pool->total_bytes_, MADV_HUGEPAGE);  // advisory; failure is harmless
  pool->data_ = static_cast<std::byte*>(p);
  return pool;
}

void HostKvPool::check_page(PageId page) const {
  STRATA_CHECK_MSG(is_valid_page(page), "host page " + std::to_string(page_index(page)) +
                                            " outside a pool of " +
                                            std::to_string(shape_.num_pages));
}

void HostKvPool::check_device(const KvPool& device) const {
  const KvPoolShape& d = device.shape();
  STRATA_CHECK_MSG(d.num_layers == shape_.num_layers && d.num_kv_heads == shape_.num_kv_heads &&
                       d.head_dim == shape_.head_dim && d.page_size == shape_.page_size &&
                       d.dtype == shape_.dtype,
                   "device pool and host pool have different page shapes");
}

std::optional<KvBlockLayout> HostKvPool::block_layout() const {
  if (layout_ == HostLayout::kPageFirst) return std::nullopt;
  KvBlockLayout l;
  l.base = data_;
  l.num_layers = shape_.num_layers;
  l.num_pages = shape_.num_pages;
  l.block_bytes = block_bytes_;
  if (layout_ == HostLayout::kLayerFirst) {
    l.region_stride = static_cast<size_t>(shape_.num_pages) * block_bytes_;
    l.page_stride = block_bytes_;
  } else {
    l.region_stride = block_bytes_;
    l.page_stride = page_bytes_;
  }
  return l;
}

std::byte* HostKvPool::block(int32_t layer, PageId page, int kv) const {
  STRATA_CHECK(layer >= 0 && layer < shape_.num_layers);
  check_page(page);
  const size_t p = static_cast<size_t>(page_index(page));
  const size_t region = static_cast<size_t>(2 * layer + kv);
  if (layout_ == HostLayout::kLayerFirst) {
    return data_ + (region * static_cast<size_t>(shape_.num_pages) + p) * block_bytes_;
  }
  STRATA_CHECK(layout_ == HostLayout::kPageFirstDirect);
  return data_ + p * page_bytes_ + region * block_bytes_;
}

std::byte* HostKvPool::rows(int32_t layer, PageId page, int kv) const {
  STRATA_CHECK(layer >= 0 && layer < shape_.num_layers);
  check_page(page);
  const size_t row_bytes = block_bytes_ / static_cast<size_t>(shape_.page_size);
  const size_t offset = static_cast<size_t>(2 * layer + kv) * row_bytes;
  return data_ + static_cast<size_t>(page_index(page)) * page_bytes_ + offset;
}

// page_first moves go through a packed copy of one layer's K (or V) rows, [slot][head][dim]:
// the rows of consecutive slots lie a whole token (all layers) apart, a multiple of 4 KiB
// for common shapes, so gathering straight from them thrashes a few L1 sets (packing first
// was 40 % faster on the bench shape). One buffer per copy thread, the size of one block.
std::span<std::byte> HostKvPool::packed_rows() const {
  thread_local std::vector<std::byte> buffer;
  if (buffer.size() < block_bytes_) buffer.resize(block_bytes_);
  return {buffer.data(), block_bytes_};
}

void HostKvPool::page_first_out(PageId page, int32_t layer, std::byte* k, std::byte* v) const {
  const std::span<std::byte> packed = packed_rows();
  const size_t row_bytes = block_bytes_ / static_cast<size_t>(shape_.page_size);
  for (int kv = 0; kv < 2; ++kv) {
    const std::byte* slot_rows = rows(layer, page, kv);
    for (int32_t s = 0; s < shape_.page_size; ++s) {
      std::memcpy(packed.data() + static_cast<size_t>(s) * row_bytes,
                  slot_rows + static_cast<size_t>(s) * slot_stride_bytes_, row_bytes);
    }
    const std::vector<uint32_t>& order = kv == 0 ? k_map_.row_of_block : v_map_.row_of_block;
    gather_elements(element_bytes_, packed.data(), order.data(), order.size(), kv == 0 ? k : v);
  }
}

void HostKvPool::page_first_in(PageId page, int32_t layer, const std::byte* k, const std::byte* v) {
  const std::span<std::byte> packed = packed_rows();
  const size_t row_bytes = block_bytes_ / static_cast<size_t>(shape_.page_size);
  for (int kv = 0; kv < 2; ++kv) {
    const std::vector<uint32_t>& order = kv == 0 ? k_map_.block_of_row : v_map_.block_of_row;
    gather_elements(element_bytes_, kv == 0 ? k : v, order.data(), order.size(), packed.data());
    std::byte* slot_rows = rows(layer, page, kv);
    for (int32_t s = 0; s < shape_.page_size; ++s) {
      std::memcpy(slot_rows + static_cast<size_t>(s) * slot_stride_bytes_,
                  packed.data() + static_cast<size_t>(s) * row_bytes, row_bytes);
    }
  }
}

void HostKvPool::layer_out(PageId page, int32_t layer, std::byte* k, std::byte* v) const {
  if (layout_ == HostLayout::kPageFirst) {
    page_first_out(page, layer, k, v);
    return;
  }
  std::memcpy(k, block(layer, page, 0), block_bytes_);
  std::memcpy(v, block(layer, page, 1), block_bytes_);
}

void HostKvPool::layer_in(PageId page, int32_t layer, const std::byte* k, const std::byte* v) {
  if (layout_ == HostLayout::kPageFirst) {
    page_first_in(page, layer, k, v);
    return;
  }
  std::memcpy(block(layer, page, 0), k, block_bytes_);
  std::memcpy(block(layer, page, 1), v, block_bytes_);
}

// Batch copies walk the host pool roughly in address order: layer by layer for layer_first
// (one region per layer and K/V, as the per-layer loads do), page by page for the
// page-contiguous layouts.
void HostKvPool::copy_from_device(const KvPool& device, std::span<const PageId> device_pages,
                                  std::span<const PageId> host_pages) {
  check_device(device);
  check_same_length(device_pages.size(), host_pages.size());
  if (layout_ == HostLayout::kLayerFirst) {
    for (int32_t layer = 0; layer < shape_.num_layers; ++layer) {
      for (size_t i = 0; i < host_pages.size(); ++i) {
        layer_in(host_pages[i], layer, device.k_block(layer, device_pages[i]),
                 device.v_block(layer, device_pages[i]));
      }
    }
    return;
  }
  for (size_t i = 0; i < host_pages.size(); ++i) {
    for (int32_t layer = 0; layer < shape_.num_layers; ++layer) {
      layer_in(host_pages[i], layer, device.k_block(layer, device_pages[i]),
               device.v_block(layer, device_pages[i]));
    }
  }
}

void HostKvPool::copy_to_device(std::span<const PageId> host_pages, KvPool& device,
                                std::span<const PageId> device_pages) const {
  check_device(device);
  check_same_length(device_pages.size(), host_pages.size());
  if (layout_ == HostLayout::kLayerFirst) {
    for (int32_t layer = 0; layer < shape_.num_layers; ++layer) {
      copy_layer_to_device(layer, host_pages, device, device_pages);
    }
    return;
  }
  for (size_t i = 0; i < host_pages.size(); ++i) {
    for (int32_t layer = 0; layer < shape_.num_layers; ++layer) {
      layer_out(host_pages[i], layer, device.k_block(layer, device_pages[i]),
                device.v_block(layer, device_pages[i]));
    }
  }
}

void HostKvPool::copy_layer_to_device(int32_t layer, std::span<const PageId> host_pages,
                                      KvPool& device, std::span<const PageId> device_pages) const {
  check_device(device);
  check_same_length(device_pages.size(), host_pages.size());
  STRATA_CHECK(layer >= 0 && layer < shape_.num_layers);
  for (size_t i = 0; i < host_pages.size(); ++i) {
    layer_out(host_pages[i], layer, device.k_block(layer, device_pages[i]),
              device.v_block(layer, device_pages[i]));
  }
}

void HostKvPool::read_page(PageId host_page, std::span<std::byte> dst) const {
  STRATA_CHECK_MSG(dst.size() == page_bytes_, "page buffer has the wrong size");
  for (int32_t layer = 0; layer < shape_.num_layers; ++layer) {
    std::byte* k = dst.data() + static_cast<size_t>(layer) * layer_page_bytes_;
    layer_out(host_page, layer, k, k + block_bytes_);
  }
}

void HostKvPool::write_page(PageId host_page, std::span<const std::byte> src) {
  STRATA_CHECK_MSG(src.size() == page_bytes_, "page buffer has the wrong size");
  for (int32_t layer = 0; layer < shape_.num_layers; ++layer) {
    const std::byte* k = src.data() + static_cast<size_t>(layer) * layer_page_bytes_;
    layer_in(host_page, layer, k, k + block_bytes_);
  }
}

std::span<const std::byte> HostKvPool::page_view(PageId host_page) const {
  check_page(host_page);
  if (layout_ != HostLayout::kPageFirstDirect) return {};
  return {data_ + static_cast<size_t>(page_index(host_page)) * page_bytes_, page_bytes_};
}

std::span<std::byte> HostKvPool::page_view(PageId host_page) {
  check_page(host_page);
  if (layout_ != HostLayout::kPageFirstDirect) return {};
  return {data_ + static_cast<size_t>(page_index(host_page)) * page_bytes_, page_bytes_};
}

}  // namespace strata
