#include "kvtransfer/page_runs.h"

#include <fmt/format.h>
#include <algorithm>
#include <cstring>
#include <string>

namespace strata {

Status check_page_compatible(const KvPoolShape& src, const KvPoolShape& dst) {
  if (auto s = validate_kv_pool_shape(src); !s) {
    return make_error(ErrorCode::kInvalidArgument, "source pool: " + s.error().message);
  }
  if (auto s = validate_kv_pool_shape(dst); !s) {
    return make_error(ErrorCode::kInvalidArgument, "destination pool: " + s.error().message);
  }
  auto differ = [](const char* field, int64_t a, int64_t b) {
    return make_error(
        ErrorCode::kInvalidArgument,
        fmt::format("KV page shapes differ in {}: source {}, destination {}", field, a, b));
  };
  if (src.num_layers != dst.num_layers) return differ("num_layers", src.num_layers, dst.num_layers);
  if (src.num_kv_heads != dst.num_kv_heads) {
    return differ("num_kv_heads", src.num_kv_heads, dst.num_kv_heads);
  }
  if (src.head_dim != dst.head_dim) return differ("head_dim", src.head_dim, dst.head_dim);
  if (src.page_size != dst.page_size) return differ("page_size", src.page_size, dst.page_size);
  if (src.dtype != dst.dtype) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("KV page shapes differ in dtype: source {}, destination {}",
                                  kv_dtype_name(src.dtype), kv_dtype_name(dst.dtype)));
  }
  return {};
}

KvPoolGeometry kv_pool_geometry(const KvPoolShape& shape) {
  KvPoolGeometry g;
  g.block_bytes =
      kv_block_bytes(shape.dtype, static_cast<size_t>(shape.num_kv_heads),
                     static_cast<size_t>(shape.page_size), static_cast<size_t>(shape.head_dim));
  g.region_bytes = g.block_bytes * static_cast<uint64_t>(shape.num_pages);
  g.num_regions = 2 * shape.num_layers;
  g.num_pages = shape.num_pages;
  return g;
}

Result<std::vector<PageRun>> plan_page_runs(const KvPoolShape& src, const KvPoolShape& dst,
                                            std::span<const PageId> src_pages,
                                            std::span<const PageId> dst_pages) {
  if (auto s = check_page_compatible(src, dst); !s) return std::unexpected(s.error());
  if (src_pages.size() != dst_pages.size()) {
    return make_error(ErrorCode::kInvalidArgument,
                      fmt::format("{} source pages but {} destination pages", src_pages.size(),
                                  dst_pages.size()));
  }
  std::vector<std::pair<int32_t, int32_t>> pairs;  // (source page, destination page)
  pairs.reserve(src_pages.size());
  std::vector<bool> dst_seen(static_cast<size_t>(dst.num_pages), false);
  for (size_t i = 0; i < src_pages.size(); ++i) {
    const int32_t s = page_index(src_pages[i]);
    const int32_t d = page_index(dst_pages[i]);
    if (s < 0 || s >= src.num_pages) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("source page {} outside a pool of {}", s, src.num_pages));
    }
    if (d < 0 || d >= dst.num_pages) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("destination page {} outside a pool of {}", d, dst.num_pages));
    }
    if (dst_seen[static_cast<size_t>(d)]) {
      return make_error(ErrorCode::kInvalidArgument,
                        fmt::format("destination page {} listed twice", d));
    }
    dst_seen[static_cast<size_t>(d)] = true;
    pairs.emplace_back(s, d);
  }
  // Sorting by source page puts every pair that can extend a run next to it: a run needs
  // consecutive source pages, and those sort adjacent (ties, a source page listed twice,
  // break by destination so that the result does not depend on the input order).
  std::sort(pairs.begin(), pairs.end());

  struct PageSpan {
    int32_t src = 0;
    int32_t dst = 0;
    int32_t count = 0;
  };
  std::vector<PageSpan> spans;
  for (const auto& [s, d] : pairs) {
    if (!spans.empty()) {
      PageSpan& last = spans.back();
      if (s == last.src + last.count && d == last.dst + last.count) {
        ++last.count;
        continue;
      }
    }
    spans.push_back(PageSpan{s, d, 1});
  }

  const KvPoolGeometry sg = kv_pool_geometry(src);
  const KvPoolGeometry dg = kv_pool_geometry(dst);
  std::vector<PageRun> runs;
  runs.reserve(spans.size() * static_cast<size_t>(sg.num_regions));
  for (int32_t r = 0; r < sg.num_regions; ++r) {
    const uint64_t src_region = static_cast<uint64_t>(r) * sg.region_bytes;
    const uint64_t dst_region = static_cast<uint64_t>(r) * dg.region_bytes;
    for (const PageSpan& span : spans) {
      PageRun run{src_region + static_cast<uint64_t>(span.src) * sg.block_bytes,
                  dst_region + static_cast<uint64_t>(span.dst) * dg.block_bytes,
                  static_cast<uint64_t>(span.count) * sg.block_bytes};
      if (!runs.empty()) {
        PageRun& last = runs.back();
        if (last.src_offset + last.size_bytes == run.src_offset &&
            last.dst_offset + last.size_bytes == run.dst_offset) {
          last.size_bytes += run.size_bytes;
          continue;
        }
      }
      runs.push_back(run);
    }
  }
  return runs;
}

uint64_t page_runs_bytes(std::span<const PageRun> runs) {
  uint64_t total = 0;
  for (const PageRun& run : runs) total += run.size_bytes;
  return total;
}

void copy_page_runs(const std::byte* src_base, std::byte* dst_base, std::span<const PageRun> runs) {
  for (const PageRun& run : runs) {
    std::memcpy(dst_base + run.dst_offset, src_base + run.src_offset, run.size_bytes);
  }
}

std::byte* kv_pool_base(KvPool& pool) {
  return pool.k_block(0, make_page_id(0));
}

const std::byte* kv_pool_base(const KvPool& pool) {
  return pool.k_block(0, make_page_id(0));
}

}  // namespace strata
