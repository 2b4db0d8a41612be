// Chained 64-bit block hashes, one per full page. The algorithm is specified in
// docs/block-hashes.md precisely enough for another program (a router) to recompute it:
//
//   h(page) = XXH3_64bits( u64le(parent) || u32le(n) || i32le(t_0) .. i32le(t_{n-1})
//                          || u32le(len(extra)) || extra )
//
// where parent is the previous page's hash, or kRootParentHash for the first page;
// n is the page size; extra is empty except on the first page when a cache_salt is
// given, where it is the UTF-8 bytes of "salt:" followed by the salt.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace strata {

using BlockHash = uint64_t;
using TokenId = int32_t;

// The parent of the first page of every sequence: the ASCII bytes "STRATA01" read as a
// little-endian u64.
inline constexpr BlockHash kRootParentHash = 0x3130415441525453ULL;

// Extra keys of the first page for a cache salt ("" when there is no salt).
std::string first_page_extra_keys(std::string_view cache_salt);

// Hash of one page.
BlockHash hash_block(BlockHash parent, std::span<const TokenId> page_tokens,
                     std::string_view extra_keys = {});

// Hashes of every full page of `tokens` (a trailing partial page is ignored).
std::vector<BlockHash> hash_blocks(std::span<const TokenId> tokens, int page_size,
                                   std::string_view cache_salt = {});

// Block hashes cross JSON and msgpack as signed 64-bit integers (the convention of the
// routers that consume vLLM/SGLang events); these convert without loss.
inline int64_t block_hash_to_wire(BlockHash h) {
  return static_cast<int64_t>(h);
}
inline BlockHash block_hash_from_wire(int64_t v) {
  return static_cast<BlockHash>(v);
}

}  // namespace strata
