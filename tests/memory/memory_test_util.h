// Helpers shared by the memory tests: a page's bytes, read back from either pool.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <random>
#include <vector>

#include "memory/host_kv_pool.h"
#include "memory/kv_pool.h"

namespace strata {

using Bytes = std::vector<std::byte>;

inline Bytes device_page(const KvPool& pool, PageId page) {
  Bytes out(pool.page_bytes());
  pool.copy_page_out(page, out);
  return out;
}

// Every page of `pool` filled with random bytes.
inline void fill_random(KvPool& pool, uint32_t seed) {
  std::mt19937 gen(seed);
  Bytes page(pool.page_bytes());
  for (int32_t p = 0; p < pool.num_pages(); ++p) {
    for (std::byte& b : page) b = static_cast<std::byte>(gen() & 0xff);
    pool.copy_page_in(make_page_id(p), page);
  }
}

inline std::vector<PageId> pages(std::initializer_list<int32_t> ids) {
  std::vector<PageId> out;
  for (int32_t id : ids) out.push_back(make_page_id(id));
  return out;
}

inline Bytes host_page(const HostKvPool& pool, PageId page) {
  Bytes out(pool.page_bytes());
  pool.read_page(page, out);
  return out;
}

}  // namespace strata
