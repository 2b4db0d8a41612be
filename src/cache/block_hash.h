// Chained 64-bit block hashes, one per full page. The algorithm is specified in
// docs/block-hashes.md precisely enough for another program (a router) to recompute it:
//
//   h(page) = XXH3_64bits( u64le(parent) || u32le(n) || i32le(t_0) .. i32le(t_{n-1})
//                          || u32le(len(extra)) || extra )
//
// where parent is the previous page's hash, or kRootParentHash for the first page;
// n is the page size; extra is empty except on the first page when a cache_salt is
// given, where it is the UTF-8 bytes of "salt:" followed by the salt.
//
// BlockHasher (below) chooses between that (Strata's own, the default) and vLLM's
// sha256_cbor (`--prefix-caching-hash-algo`), which indexers written for vLLM compute from
// a request's tokens themselves (docs/block-hashes.md, "vLLM's sha256_cbor").
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

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

// How blocks are hashed (`--prefix-caching-hash-algo`).
enum class BlockHashAlgo : uint8_t {
  kStrata,      // "strata": the XXH3 chain above
  kSha256Cbor,  // "sha256_cbor": vLLM's, bit for bit (docs/block-hashes.md)
};
std::string_view block_hash_algo_name(BlockHashAlgo algo);
// "strata" or "sha256_cbor"; anything else is kInvalidArgument naming the choices.
Result<BlockHashAlgo> parse_block_hash_algo(std::string_view name);

// What a block's successor is hashed from. Strata's chain needs only the 64-bit hash;
// vLLM's chains the whole 32-byte SHA-256 digest, whose last 8 bytes (big-endian) are the
// 64-bit hash, so `tail` keeps its first 24 bytes (zero for Strata's).
using ChainTail = std::array<uint8_t, 24>;
struct ChainValue {
  BlockHash hash = 0;
  ChainTail tail{};
  bool operator==(const ChainValue&) const = default;
};

// Hashes blocks by one algorithm. A value type, cheap to copy; thread-safe (const).
//
// sha256_cbor is vLLM's (vllm/v1/core/kv_cache_utils.py: init_none_hash, hash_block_tokens,
// maybe_convert_block_hash; vllm/utils/hashing.py: sha256_cbor):
//   root      = SHA-256(CBOR(seed))                  seed: a text string (PYTHONHASHSEED)
//   digest_i  = SHA-256(CBOR([parent_{i}, [t...], extra_i]))
//               parent_0 = root, parent_{i+1} = digest_i: byte strings of 32 bytes;
//               extra_i = [cache_salt] on the first block when salted, else null
//   hash_i    = the last 8 bytes of digest_i read big-endian (the int of vLLM's KV events)
// CBOR is canonical (RFC 8949's core deterministic encoding, as cbor2's canonical=True).
class BlockHasher {
 public:
  BlockHasher() = default;  // Strata's own
  // sha256_cbor needs the seed vLLM reads from PYTHONHASHSEED (without one vLLM draws a
  // random root that no indexer can follow): kInvalidArgument when it is empty. Strata's
  // own takes no seed (kInvalidArgument when one is given).
  static Result<BlockHasher> make(BlockHashAlgo algo, std::string_view seed);

  BlockHashAlgo algo() const { return algo_; }
  // Whether the successor of a block needs its ChainValue's tail (sha256_cbor), not only
  // its hash.
  bool chains_digests() const { return algo_ != BlockHashAlgo::kStrata; }
  // The parent of every sequence's first block.
  const ChainValue& root() const { return root_; }
  // The first block's extra keys for a cache salt, encoded for this algorithm ("" without
  // a salt): Strata's "salt:<salt>", or sha256_cbor's CBOR array [salt].
  std::string first_page_extra_keys(std::string_view cache_salt) const;
  // One block chained from `parent`; `extra` as first_page_extra_keys gives it.
  ChainValue hash(const ChainValue& parent, std::span<const TokenId> page_tokens,
                  std::string_view extra = {}) const;
  // Hashes of every full page of `tokens` (a trailing partial page is ignored).
  std::vector<BlockHash> hash_blocks(std::span<const TokenId> tokens, int page_size,
                                     std::string_view cache_salt = {}) const;

 private:
  BlockHashAlgo algo_ = BlockHashAlgo::kStrata;
  ChainValue root_{.hash = kRootParentHash};
};

}  // namespace strata
