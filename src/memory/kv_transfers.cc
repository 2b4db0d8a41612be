#include "memory/kv_transfers.h"

#include <algorithm>

namespace strata {

bool shares_a_page(const TransferJob& a, const TransferJob& b) {
  auto overlap = [](const std::vector<PageId>& x, const std::vector<PageId>& y) {
    for (PageId p : x) {
      if (std::find(y.begin(), y.end(), p) != y.end()) return true;
    }
    return false;
  };
  return overlap(a.device_pages, b.device_pages) || overlap(a.host_pages, b.host_pages);
}

}  // namespace strata
