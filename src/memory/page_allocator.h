// Free-list allocator of the page ids of one pool. It hands out ids, never bytes: the
// pool that owns the bytes is addressed by these ids.
//
// Ownership: a page is either free (on the free list) or allocated. The owner of an
// allocated page (one tree node or one running request) is tracked by the caller;
// audit() checks the global invariant "every page is free or owned exactly once"
// against the caller's list of owned pages.
//
// Thread: not thread-safe; the scheduler thread owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "common/result.h"
#include "memory/page_id.h"

namespace strata {

class PageAllocator {
 public:
  explicit PageAllocator(int32_t num_pages);

  int32_t num_pages() const { return static_cast<int32_t>(allocated_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_list_.size()); }
  int32_t num_allocated() const { return num_pages() - num_free(); }

  // Appends `count` page ids to `out`, all or nothing. Fails with kOutOfPages when
  // fewer than `count` pages are free (then `out` is unchanged).
  Status allocate(int32_t count, std::vector<PageId>& out);

  // Returns pages to the free list. Freeing a page that is not allocated (double free,
  // out-of-range id) is a bug in the caller and fails a check.
  void free(std::span<const PageId> pages);
  void free(PageId page) { free(std::span<const PageId>(&page, 1)); }

  bool is_allocated(PageId page) const;

  // Checks that `owned` lists every allocated page exactly once and no free page.
  // Returns a description of the first violation.
  Status audit(std::span<const PageId> owned) const;

  // Frees everything.
  void reset();

 private:
  std::vector<PageId> free_list_;   // LIFO: recently freed pages are reused first
  std::vector<uint8_t> allocated_;  // per page: 1 when allocated
};

}  // namespace strata
