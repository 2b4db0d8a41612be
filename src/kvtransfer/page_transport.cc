#include "kvtransfer/page_transport.h"

#include <fmt/format.h>

namespace strata {

Status check_batch_pages(const PageBatch& batch, int32_t src_num_pages, int32_t dst_num_pages) {
  if (batch.src_pages.size() != batch.dst_pages.size()) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("room {}: {} source pages but {} destination pages",
                                  batch.room_id, batch.src_pages.size(), batch.dst_pages.size()));
  }
  if (batch.first_index < 0) {
    return make_error(
        ErrorCode::kInvalidArgument,
        fmt::format("room {}: negative first page index {}", batch.room_id, batch.first_index));
  }
  if (src_num_pages >= 0) {
    for (PageId p : batch.src_pages) {
      if (page_index(p) < 0 || page_index(p) >= src_num_pages) {
        return make_error(ErrorCode::kInvalidArgument,
                          fmt::format("room {}: source page {} outside a pool of {}", batch.room_id,
                                      page_index(p), src_num_pages));
      }
    }
  }
  if (dst_num_pages >= 0) {
    std::vector<bool> seen(static_cast<size_t>(dst_num_pages), false);
    for (PageId p : batch.dst_pages) {
      const int32_t i = page_index(p);
      if (i < 0 || i >= dst_num_pages) {
        return make_error(ErrorCode::kInvalidArgument,
                          fmt::format("room {}: destination page {} outside a pool of {}",
                                      batch.room_id, i, dst_num_pages));
      }
      if (seen[static_cast<size_t>(i)]) {
        return make_error(
            ErrorCode::kInvalidArgument,
            fmt::format("room {}: destination page {} listed twice", batch.room_id, i));
      }
      seen[static_cast<size_t>(i)] = true;
    }
  }
  return {};
}

}  // namespace strata
