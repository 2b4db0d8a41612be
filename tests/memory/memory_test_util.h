// Helpers shared by the memory tests: a page's bytes, read back from either pool.
#pragma once

#include <cstddef>
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

inline Bytes host_page(const HostKvPool& pool, PageId page) {
  Bytes out(pool.page_bytes());
  pool.read_page(page, out);
  return out;
}

}  // namespace strata
