// An allocator for the router index's block table (prefix_index.h): at millions of blocks
// the table is hundreds of MB probed at random, so with 4 KiB pages nearly every probe
// misses the TLB as well as the caches, and the page walk is one more dependent miss.
// Allocations of at least kHugePageBytes are mapped on their own, aligned to 2 MiB and
// advised MADV_HUGEPAGE, so that transparent huge pages back them where the kernel's THP
// setting is "madvise" (the default of many distributions) or "always"; where THP is off
// they are ordinary pages. Smaller allocations go to std::allocator.
//
// Stateless: every instance frees what any other allocated. Thread-safe. A failed mapping
// throws std::bad_alloc, as std::allocator does. mapped_bytes() counts what is mapped here
// (glibc's malloc statistics do not see it): bench_router_index_scale adds it.
#pragma once

#include <sys/mman.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace strata::router {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

namespace huge_pages {
inline std::atomic<uint64_t> mapped{0};

inline size_t rounded(size_t bytes) {
  return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}

// `bytes` rounded up to whole huge pages, aligned to one.
inline void* map(size_t bytes) {
  const size_t size = rounded(bytes);
  // One huge page of slack, so that an aligned start exists; the slack is unmapped again.
  const size_t span = size + kHugePageBytes;
  void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  if (aligned > start) ::munmap(p, aligned - start);
  const uintptr_t end = aligned + size;
  if (start + span > end) ::munmap(reinterpret_cast<void*>(end), start + span - end);
  // Advice only: a kernel without THP keeps 4 KiB pages.
  (void)::madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);
  mapped.fetch_add(size, std::memory_order_relaxed);
  return reinterpret_cast<void*>(aligned);
}

inline void unmap(void* p, size_t bytes) {
  const size_t size = rounded(bytes);
  ::munmap(p, size);
  mapped.fetch_sub(size, std::memory_order_relaxed);
}
}  // namespace huge_pages

// Bytes mapped by HugePageAllocator now, in all.
inline uint64_t huge_page_mapped_bytes() {
  return huge_pages::mapped.load(std::memory_order_relaxed);
}

template <typename T>
struct HugePageAllocator {
  using value_type = T;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: converting, as allocators are

  T* allocate(size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePageBytes) return std::allocator<T>().allocate(n);
    static_assert(alignof(T) <= kHugePageBytes);
    return static_cast<T*>(huge_pages::map(bytes));
  }
  void deallocate(T* p, size_t n) {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePageBytes) {
      std::allocator<T>().deallocate(p, n);
    } else {
      huge_pages::unmap(p, bytes);
    }
  }

  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
};

}  // namespace strata::router
