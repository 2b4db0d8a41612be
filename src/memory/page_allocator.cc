#include "memory/page_allocator.h"

#include <string>

#include "common/check.h"

namespace strata {

PageAllocator::PageAllocator(int32_t num_pages) {
  STRATA_CHECK(num_pages >= 0);
  allocated_.assign(static_cast<size_t>(num_pages), 0);
  reset();
}

void PageAllocator::reset() {
  const int32_t n = num_pages();
  free_list_.clear();
  free_list_.reserve(static_cast<size_t>(n));
  // Highest id at the bottom so that allocation hands out 0, 1, 2, ... first.
  for (int32_t i = n - 1; i >= 0; --i) free_list_.push_back(make_page_id(i));
  std::fill(allocated_.begin(), allocated_.end(), 0);
}

Status PageAllocator::allocate(int32_t count, std::vector<PageId>& out) {
  if (count < 0) return make_error(ErrorCode::kInvalidArgument, "negative page count");
  if (count > num_free()) {
    return make_error(ErrorCode::kOutOfPages, "need " + std::to_string(count) + " pages, " +
                                                  std::to_string(num_free()) + " free");
  }
  for (int32_t i = 0; i < count; ++i) {
    const PageId id = free_list_.back();
    free_list_.pop_back();
    allocated_[static_cast<size_t>(page_index(id))] = 1;
    out.push_back(id);
  }
  return {};
}

void PageAllocator::free(std::span<const PageId> pages) {
  for (PageId id : pages) {
    const int32_t i = page_index(id);
    STRATA_CHECK_MSG(i >= 0 && i < num_pages(), "page id out of range: " + std::to_string(i));
    STRATA_CHECK_MSG(allocated_[static_cast<size_t>(i)] == 1,
                     "double free of page " + std::to_string(i));
    allocated_[static_cast<size_t>(i)] = 0;
    free_list_.push_back(id);
  }
}

bool PageAllocator::is_allocated(PageId page) const {
  const int32_t i = page_index(page);
  return i >= 0 && i < num_pages() && allocated_[static_cast<size_t>(i)] == 1;
}

Status PageAllocator::audit(std::span<const PageId> owned) const {
  std::vector<uint8_t> seen(allocated_.size(), 0);
  for (PageId id : owned) {
    const int32_t i = page_index(id);
    if (i < 0 || i >= num_pages()) {
      return make_error(ErrorCode::kInternal, "owned page id out of range: " + std::to_string(i));
    }
    if (!allocated_[static_cast<size_t>(i)]) {
      return make_error(ErrorCode::kInternal, "page " + std::to_string(i) + " is owned but free");
    }
    if (seen[static_cast<size_t>(i)]++) {
      return make_error(ErrorCode::kInternal, "page " + std::to_string(i) + " is owned twice");
    }
  }
  if (static_cast<int32_t>(owned.size()) != num_allocated()) {
    return make_error(ErrorCode::kInternal,
                      std::to_string(num_allocated() - static_cast<int32_t>(owned.size())) +
                          " allocated pages have no owner (leak)");
  }
  return {};
}

}  // namespace strata
