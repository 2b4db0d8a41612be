#include "cache/block_hash.h"

#include <xxhash.h>

#include <bit>
#include <cstring>

#include "common/check.h"

namespace strata {
namespace {

// Appends `v` to `out` in little-endian order (the hosts we run on are little-endian;
// the static_assert below keeps that assumption honest).
template <typename T>
void put_le(std::string& out, T v) {
  static_assert(std::endian::native == std::endian::little, "big-endian hosts need byte swaps");
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out.append(bytes, sizeof(T));
}

}  // namespace

std::string first_page_extra_keys(std::string_view cache_salt) {
  if (cache_salt.empty()) return {};
  std::string extra = "salt:";
  extra.append(cache_salt);
  return extra;
}

BlockHash hash_block(BlockHash parent, std::span<const TokenId> page_tokens,
                     std::string_view extra_keys) {
  // Small pages hash from a stack buffer; the layout is the documented one.
  constexpr size_t kStackBytes = 8 + 4 + 4 * 64 + 4;
  const size_t bytes = 8 + 4 + 4 * page_tokens.size() + 4 + extra_keys.size();
  if (bytes <= kStackBytes) {
    alignas(8) unsigned char buf[kStackBytes];
    unsigned char* p = buf;
    std::memcpy(p, &parent, 8);
    p += 8;
    const uint32_t n = static_cast<uint32_t>(page_tokens.size());
    std::memcpy(p, &n, 4);
    p += 4;
    std::memcpy(p, page_tokens.data(), 4 * page_tokens.size());
    p += 4 * page_tokens.size();
    const uint32_t e = static_cast<uint32_t>(extra_keys.size());
    std::memcpy(p, &e, 4);
    p += 4;
    if (!extra_keys.empty()) std::memcpy(p, extra_keys.data(), extra_keys.size());
    return XXH3_64bits(buf, bytes);
  }
  std::string buf;
  buf.reserve(bytes);
  put_le<uint64_t>(buf, parent);
  put_le<uint32_t>(buf, static_cast<uint32_t>(page_tokens.size()));
  for (TokenId t : page_tokens) put_le<int32_t>(buf, t);
  put_le<uint32_t>(buf, static_cast<uint32_t>(extra_keys.size()));
  buf.append(extra_keys);
  return XXH3_64bits(buf.data(), buf.size());
}

std::vector<BlockHash> hash_blocks(std::span<const TokenId> tokens, int page_size,
                                   std::string_view cache_salt) {
  STRATA_CHECK(page_size > 0);
  const size_t num_pages = tokens.size() / static_cast<size_t>(page_size);
  std::vector<BlockHash> out;
  out.reserve(num_pages);
  const std::string extra = first_page_extra_keys(cache_salt);
  BlockHash parent = kRootParentHash;
  for (size_t i = 0; i < num_pages; ++i) {
    parent = hash_block(
        parent, tokens.subspan(i * static_cast<size_t>(page_size), static_cast<size_t>(page_size)),
        i == 0 ? std::string_view(extra) : std::string_view());
    out.push_back(parent);
  }
  return out;
}

}  // namespace strata
