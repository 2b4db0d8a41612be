// Strongly typed page ids. A page holds the KV of `page_size` consecutive tokens in one
// pool (device or host); the id is the page's index in that pool.
#pragma once

#include <cstdint>
#include <functional>

namespace strata {

enum class PageId : int32_t {};

inline constexpr PageId kInvalidPage{-1};

constexpr int32_t page_index(PageId id) {
  return static_cast<int32_t>(id);
}
constexpr PageId make_page_id(int32_t index) {
  return PageId{index};
}

}  // namespace strata
