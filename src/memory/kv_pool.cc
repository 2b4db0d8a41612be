#include "memory/kv_pool.h"

#include <sys/mman.h>

#include <cstring>
#include <string>

#include "common/check.h"
#include "memory/kv_quant.h"

namespace strata {

namespace {

// Multiplies with an overflow check; false when the product does not fit.
bool checked_mul(size_t a, size_t b, size_t& out) {
  return !__builtin_mul_overflow(a, b, &out);
}

}  // namespace

Status validate_kv_pool_shape(const KvPoolShape& shape) {
  auto positive = [](const char* name, int32_t value) -> Status {
    if (value < 1) {
      return make_error(
          ErrorCode::kInvalidArgument,
          std::string("KV pool ") + name + " must be >= 1, got " + std::to_string(value));
    }
    return {};
  };
  if (auto s = positive("num_layers", shape.num_layers); !s) return s;
  if (auto s = positive("num_kv_heads", shape.num_kv_heads); !s) return s;
  if (auto s = positive("head_dim", shape.head_dim); !s) return s;
  if (auto s = positive("num_pages", shape.num_pages); !s) return s;
  if (auto s = positive("page_size", shape.page_size); !s) return s;
  // Bytes per (head, slot) row: its codes, and its scale for the scaled dtypes.
  size_t total = 0;
  if (!checked_mul(kv_dtype_size_bytes(shape.dtype), static_cast<size_t>(shape.head_dim), total)) {
    return make_error(ErrorCode::kInvalidArgument, "KV pool size overflows");
  }
  if (kv_dtype_is_scaled(shape.dtype)) total += kKvScaleBytes;
  for (int32_t factor :
       {shape.num_layers, shape.num_kv_heads, shape.num_pages, shape.page_size, int32_t{2}}) {
    if (!checked_mul(total, static_cast<size_t>(factor), total)) {
      return make_error(ErrorCode::kInvalidArgument, "KV pool size overflows");
    }
  }
  return {};
}

KvPool::KvPool(const KvPoolShape& shape, NoAllocate) : shape_(shape) {
  paired_bf16_ = kv_paired_bf16(shape);
  head_block_elements_ = static_cast<size_t>(shape.page_size) * static_cast<size_t>(shape.head_dim);
  block_elements_ = head_block_elements_ * static_cast<size_t>(shape.num_kv_heads);
  block_bytes_ =
      kv_block_bytes(shape.dtype, static_cast<size_t>(shape.num_kv_heads),
                     static_cast<size_t>(shape.page_size), static_cast<size_t>(shape.head_dim));
  layer_region_bytes_ = block_bytes_ * static_cast<size_t>(shape.num_pages);
  total_bytes_ = layer_region_bytes_ * 2 * static_cast<size_t>(shape.num_layers);
}

KvPool::KvPool(const KvPoolShape& shape) : KvPool(shape, NoAllocate{}) {
  const Status valid = validate_kv_pool_shape(shape);
  STRATA_CHECK_MSG(valid.has_value(), valid.error().message);
  STRATA_CHECK_MSG(allocate(),
                   "KV pool allocation of " + std::to_string(total_bytes_) + " bytes failed");
}

KvPool::KvPool(int32_t num_layers, int32_t num_kv_heads, int32_t head_dim, int32_t num_pages,
               int32_t page_size, KvDtype dtype)
    : KvPool(KvPoolShape{num_layers, num_kv_heads, head_dim, num_pages, page_size, dtype}) {}

KvPool::~KvPool() {
  if (data_ != nullptr) munmap(data_, total_bytes_);
}

bool KvPool::allocate() {
  // Anonymous mappings arrive zeroed and are only backed when touched.
  void* p = mmap(nullptr, total_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  madvise(p, total_bytes_, MADV_HUGEPAGE);  // advisory; failure is harmless
  data_ = static_cast<std::byte*>(p);
  return true;
}

Result<std::unique_ptr<KvPool>> KvPool::create(const KvPoolShape& shape) {
  if (auto s = validate_kv_pool_shape(shape); !s) return std::unexpected(s.error());
  std::unique_ptr<KvPool> pool(new KvPool(shape, NoAllocate{}));
  if (!pool->allocate()) {
    return make_error(
        ErrorCode::kResourceExhausted,
        "cannot allocate the KV pool: " + std::to_string(pool->total_bytes_) + " bytes");
  }
  return pool;
}

std::byte* KvPool::block(int32_t layer, PageId page, int kv) const {
  STRATA_CHECK(layer >= 0 && layer < shape_.num_layers);
  STRATA_CHECK_MSG(is_valid_page(page), "page " + std::to_string(page_index(page)) +
                                            " outside a pool of " +
                                            std::to_string(shape_.num_pages));
  const size_t region = static_cast<size_t>(2 * layer + kv);
  return data_ + region * layer_region_bytes_ +
         static_cast<size_t>(page_index(page)) * block_bytes_;
}

KvBlockLayout KvPool::block_layout() const {
  KvBlockLayout l;
  l.base = data_;
  l.num_layers = shape_.num_layers;
  l.num_pages = shape_.num_pages;
  l.block_bytes = block_bytes_;
  l.region_stride = layer_region_bytes_;
  l.page_stride = l.block_bytes;
  return l;
}

namespace {

// Stores / loads one element of `dtype` at element offset `index` of `block`.
void store_element(KvDtype dtype, std::byte* block, size_t index, float value) {
  switch (dtype) {
    case KvDtype::kF32:
      std::memcpy(block + index * 4, &value, 4);
      return;
    case KvDtype::kF16: {
      const uint16_t x = f32_to_f16(value);
      std::memcpy(block + index * 2, &x, 2);
      return;
    }
    case KvDtype::kBF16: {
      const uint16_t x = f32_to_bf16(value);
      std::memcpy(block + index * 2, &x, 2);
      return;
    }
    case KvDtype::kInt8:
    case KvDtype::kFp8E4M3:
      break;
  }
  STRATA_CHECK_MSG(false, "store_element on a scaled KV dtype");
}

float load_element(KvDtype dtype, const std::byte* block, size_t index) {
  float out;
  kv_to_f32_row(dtype, block + index * kv_dtype_size_bytes(dtype), &out, 1);
  return out;
}

}  // namespace

void KvPool::write_token(int32_t layer, PageId page, int32_t slot, const float* k, const float* v) {
  STRATA_CHECK(slot >= 0 && slot < shape_.page_size);
  std::byte* kb = k_block(layer, page);
  std::byte* vb = v_block(layer, page);
  const int32_t hd = shape_.head_dim;
  for (int32_t h = 0; h < shape_.num_kv_heads; ++h) {
    const float* kh = k + static_cast<size_t>(h) * static_cast<size_t>(hd);
    const float* vh = v + static_cast<size_t>(h) * static_cast<size_t>(hd);
    if (kv_dtype_is_scaled(shape_.dtype)) {
      // K's codes are dimension-major (page_size apart), V's one contiguous row.
      const float k_scale = quantize_kv_row(shape_.dtype, kh, static_cast<size_t>(hd),
                                            reinterpret_cast<uint8_t*>(kb + k_index(h, slot, 0)),
                                            static_cast<size_t>(shape_.page_size));
      const float v_scale = quantize_kv_row(shape_.dtype, vh, static_cast<size_t>(hd),
                                            reinterpret_cast<uint8_t*>(vb + v_index(h, slot, 0)));
      // Scales are BF16 values already (kv_quant.h): the conversion is exact.
      const uint16_t k_bits = f32_to_bf16(k_scale), v_bits = f32_to_bf16(v_scale);
      std::memcpy(kb + scale_offset_bytes(h, slot), &k_bits, kKvScaleBytes);
      std::memcpy(vb + scale_offset_bytes(h, slot), &v_bits, kKvScaleBytes);
      continue;
    }
    for (int32_t d = 0; d < hd; ++d) store_element(shape_.dtype, kb, k_index(h, slot, d), kh[d]);
    if (paired_bf16_) {
      for (int32_t d = 0; d < hd; ++d) store_element(shape_.dtype, vb, v_index(h, slot, d), vh[d]);
    } else {
      // Token-major V: one contiguous row.
      f32_to_kv_row(shape_.dtype, vh, vb + v_index(h, slot, 0) * element_size_bytes(),
                    static_cast<size_t>(hd));
    }
  }
}

void KvPool::read_head(int32_t layer, PageId page, int32_t slot, int32_t head, float* k,
                       float* v) const {
  STRATA_CHECK(slot >= 0 && slot < shape_.page_size);
  STRATA_CHECK(head >= 0 && head < shape_.num_kv_heads);
  const std::byte* kb = k_block(layer, page);
  const std::byte* vb = v_block(layer, page);
  if (kv_dtype_is_scaled(shape_.dtype)) {
    uint16_t k_bits, v_bits;
    std::memcpy(&k_bits, kb + scale_offset_bytes(head, slot), kKvScaleBytes);
    std::memcpy(&v_bits, vb + scale_offset_bytes(head, slot), kKvScaleBytes);
    const float k_scale = bf16_to_f32(k_bits), v_scale = bf16_to_f32(v_bits);
    const size_t hd = static_cast<size_t>(shape_.head_dim);
    dequantize_kv_row(shape_.dtype, reinterpret_cast<const uint8_t*>(kb + k_index(head, slot, 0)),
                      k_scale, k, hd, static_cast<size_t>(shape_.page_size));
    dequantize_kv_row(shape_.dtype, reinterpret_cast<const uint8_t*>(vb + v_index(head, slot, 0)),
                      v_scale, v, hd);
    return;
  }
  for (int32_t d = 0; d < shape_.head_dim; ++d) {
    k[d] = load_element(shape_.dtype, kb, k_index(head, slot, d));
    v[d] = load_element(shape_.dtype, vb, v_index(head, slot, d));
  }
}

void KvPool::read_token(int32_t layer, PageId page, int32_t slot, float* k, float* v) const {
  const size_t hd = static_cast<size_t>(shape_.head_dim);
  for (int32_t h = 0; h < shape_.num_kv_heads; ++h) {
    read_head(layer, page, slot, h, k + static_cast<size_t>(h) * hd,
              v + static_cast<size_t>(h) * hd);
  }
}

void KvPool::copy_layer_page_out(int32_t layer, PageId page, std::span<std::byte> dst) const {
  STRATA_CHECK_MSG(dst.size() == layer_page_bytes(), "layer page buffer has the wrong size");
  const size_t block_bytes = block_bytes_;
  std::memcpy(dst.data(), k_block(layer, page), block_bytes);
  std::memcpy(dst.data() + block_bytes, v_block(layer, page), block_bytes);
}

void KvPool::copy_layer_page_in(int32_t layer, PageId page, std::span<const std::byte> src) {
  STRATA_CHECK_MSG(src.size() == layer_page_bytes(), "layer page buffer has the wrong size");
  const size_t block_bytes = block_bytes_;
  std::memcpy(k_block(layer, page), src.data(), block_bytes);
  std::memcpy(v_block(layer, page), src.data() + block_bytes, block_bytes);
}

void KvPool::copy_page_out(PageId page, std::span<std::byte> dst) const {
  STRATA_CHECK_MSG(dst.size() == page_bytes(), "page buffer has the wrong size");
  const size_t per_layer = layer_page_bytes();
  for (int32_t layer = 0; layer < shape_.num_layers; ++layer) {
    copy_layer_page_out(layer, page,
                        dst.subspan(static_cast<size_t>(layer) * per_layer, per_layer));
  }
}

void KvPool::copy_page_in(PageId page, std::span<const std::byte> src) {
  STRATA_CHECK_MSG(src.size() == page_bytes(), "page buffer has the wrong size");
  const size_t per_layer = layer_page_bytes();
  for (int32_t layer = 0; layer < shape_.num_layers; ++layer) {
    copy_layer_page_in(layer, page, src.subspan(static_cast<size_t>(layer) * per_layer, per_layer));
  }
}

}  // namespace strata
