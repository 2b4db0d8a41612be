// A heap buffer aligned to 64 bytes (one cache line, one AVX-512 vector), for weights and
// scratch rows that the kernels read with aligned vector loads.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace strata {

class AlignedBuffer {
 public:
  static constexpr size_t kAlignment = 64;

  AlignedBuffer() = default;
  // Zero-filled. Throws std::bad_alloc like any allocation when memory is exhausted.
  explicit AlignedBuffer(size_t size_bytes) { resize(size_bytes); }

  // Discards the contents; the new bytes are zero.
  void resize(size_t size_bytes) {
    data_.reset();
    size_ = 0;
    if (size_bytes == 0) return;
    const size_t rounded = (size_bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 0, rounded);
    data_.reset(static_cast<std::byte*>(p));
    size_ = size_bytes;
  }

  // Grows (discarding the contents) when smaller than `size_bytes`; never shrinks.
  void reserve(size_t size_bytes) {
    if (size_bytes > size_) resize(size_bytes);
  }

  size_t size_bytes() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(data_.get());
  }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(data_.get());
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t size_ = 0;
};

}  // namespace strata
