#include "cache/block_hash.h"

// Inlined (XXH_INLINE_ALL): hash_small_page below runs XXH3's own steps with its secret,
// which only the inlined header exposes. g++ 12 reports the header's AVX-512 intrinsics
// (used for inputs over 240 bytes) as uninitialized when inlined: a known false positive
// of that compiler, silenced for the header only.
#define XXH_INLINE_ALL
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <xxhash.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <openssl/evp.h>

#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>

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

// XXH3_64bits of the documented bytes of a page without extra keys whose size is even and
// at most 28 tokens (17 to 128 bytes, whole 8-byte words): XXH3's own steps for that
// length (XXH3_len_17to128_64b, seed 0), fed with words read straight from the parent and
// the tokens. Hashing a buffer written just before waits on store forwarding for most of
// the time it takes; this does not. The test compares it with XXH3_64bits of the bytes.
BlockHash hash_small_page(BlockHash parent, const TokenId* t, size_t n) {
  const size_t len = 16 + 4 * n;
  // The 8 bytes at `off` (a multiple of 8) of u64(parent) u32(n) i32(t_0..t_{n-1}) u32(0).
  const auto word = [&](size_t off) -> uint64_t {
    if (off == 0) return parent;
    if (off == 8) return uint64_t{n} | uint64_t{static_cast<uint32_t>(t[0])} << 32;
    if (off == len - 8) return static_cast<uint32_t>(t[n - 1]);
    uint64_t w;
    std::memcpy(&w, t + (off / 4 - 3), 8);
    return w;
  };
  const auto mix = [&](size_t off, size_t secret_off) {
    return XXH3_mul128_fold64(word(off) ^ XXH_readLE64(XXH3_kSecret + secret_off),
                              word(off + 8) ^ XXH_readLE64(XXH3_kSecret + secret_off + 8));
  };
  uint64_t acc = len * XXH_PRIME64_1;
  if (len > 32) {
    if (len > 64) {
      if (len > 96) {
        acc += mix(48, 96);
        acc += mix(len - 64, 112);
      }
      acc += mix(32, 64);
      acc += mix(len - 48, 80);
    }
    acc += mix(16, 32);
    acc += mix(len - 32, 48);
  }
  acc += mix(0, 0);
  acc += mix(len - 16, 16);
  return XXH3_avalanche(acc);
}

using Digest = std::array<uint8_t, 32>;

Digest sha256(const std::vector<uint8_t>& bytes) {
  Digest out{};
  unsigned int size = 0;
  // EVP_Digest fails only without memory or without SHA-256 (a broken libcrypto).
  STRATA_CHECK(EVP_Digest(bytes.data(), bytes.size(), out.data(), &size, EVP_sha256(), nullptr) ==
                   1 &&
               size == out.size());
  return out;
}

// The digest as vLLM's events carry it: its last 8 bytes read big-endian (vLLM's
// maybe_convert_block_hash), the first 24 kept for chaining.
ChainValue chain_value_of(const Digest& d) {
  ChainValue v;
  std::memcpy(v.tail.data(), d.data(), v.tail.size());
  for (size_t i = v.tail.size(); i < d.size(); ++i) v.hash = v.hash << 8 | d[i];
  return v;
}

Digest digest_of(const ChainValue& v) {
  Digest d{};
  std::memcpy(d.data(), v.tail.data(), v.tail.size());
  for (size_t i = 0; i < 8; ++i)
    d[v.tail.size() + i] = static_cast<uint8_t>(v.hash >> (56 - 8 * i));
  return d;
}

// SHA-256 of CBOR([parent digest, [tokens...], extra or null]): vLLM's hash_block_tokens
// with sha256_cbor. The array's items are encoded one by one (nlohmann's to_cbor writes the
// shortest forms, as canonical CBOR wants) and concatenated after the array's head, which
// is how CBOR encodes a definite-length array; `extra` is already CBOR.
ChainValue sha256_cbor_block(const ChainValue& parent, std::span<const TokenId> tokens,
                             std::string_view extra) {
  std::vector<uint8_t> cbor;
  cbor.reserve(48 + 5 * tokens.size() + extra.size());
  cbor.push_back(0x83);  // an array of 3 items
  const Digest p = digest_of(parent);
  nlohmann::json::to_cbor(nlohmann::json::binary(std::vector<uint8_t>(p.begin(), p.end())), cbor);
  nlohmann::json ids = nlohmann::json::array();
  ids.get_ref<nlohmann::json::array_t&>().reserve(tokens.size());
  for (TokenId t : tokens) ids.push_back(t);
  nlohmann::json::to_cbor(ids, cbor);
  if (extra.empty()) {
    cbor.push_back(0xf6);  // null: vLLM's extra_keys of a block without any
  } else {
    cbor.insert(cbor.end(), extra.begin(), extra.end());
  }
  return chain_value_of(sha256(cbor));
}

}  // namespace

std::string_view block_hash_algo_name(BlockHashAlgo algo) {
  switch (algo) {
    case BlockHashAlgo::kStrata:
      return "strata";
    case BlockHashAlgo::kSha256Cbor:
      return "sha256_cbor";
  }
  return "?";
}

Result<BlockHashAlgo> parse_block_hash_algo(std::string_view name) {
  if (name == "strata") return BlockHashAlgo::kStrata;
  if (name == "sha256_cbor") return BlockHashAlgo::kSha256Cbor;
  return bad_argument("unknown block-hash algorithm '" + std::string(name) +
                      "' (strata or sha256_cbor)");
}

Result<BlockHasher> BlockHasher::make(BlockHashAlgo algo, std::string_view seed) {
  BlockHasher h;
  h.algo_ = algo;
  if (algo == BlockHashAlgo::kStrata) {
    if (!seed.empty()) {
      return bad_argument("a block-hash seed is for sha256_cbor; Strata's own hash takes none");
    }
    return h;
  }
  if (seed.empty()) {
    return bad_argument(
        "sha256_cbor needs the seed of the vLLM workers it matches (their PYTHONHASHSEED: "
        "--prefix-caching-hash-seed, or PYTHONHASHSEED in the environment); without one "
        "vLLM draws a random root that no indexer can follow");
  }
  // vLLM's init_none_hash: NONE_HASH = sha256_cbor(PYTHONHASHSEED), the seed a text string.
  std::vector<uint8_t> cbor;
  nlohmann::json::to_cbor(nlohmann::json(std::string(seed)), cbor);
  h.root_ = chain_value_of(sha256(cbor));
  return h;
}

std::string BlockHasher::first_page_extra_keys(std::string_view cache_salt) const {
  if (algo_ == BlockHashAlgo::kStrata) return strata::first_page_extra_keys(cache_salt);
  if (cache_salt.empty()) return {};
  // vLLM's generate_block_hash_extra_keys for a salted request's first block: (salt,).
  std::vector<uint8_t> cbor;
  nlohmann::json::to_cbor(nlohmann::json::array({std::string(cache_salt)}), cbor);
  return std::string(cbor.begin(), cbor.end());
}

ChainValue BlockHasher::hash(const ChainValue& parent, std::span<const TokenId> page_tokens,
                             std::string_view extra) const {
  if (algo_ == BlockHashAlgo::kStrata) {
    return ChainValue{.hash = hash_block(parent.hash, page_tokens, extra)};
  }
  return sha256_cbor_block(parent, page_tokens, extra);
}

std::vector<BlockHash> BlockHasher::hash_blocks(std::span<const TokenId> tokens, int page_size,
                                                std::string_view cache_salt) const {
  if (algo_ == BlockHashAlgo::kStrata) return strata::hash_blocks(tokens, page_size, cache_salt);
  STRATA_CHECK(page_size > 0);
  const size_t n = static_cast<size_t>(page_size);
  const size_t num_pages = tokens.size() / n;
  std::vector<BlockHash> out;
  out.reserve(num_pages);
  const std::string extra = first_page_extra_keys(cache_salt);
  ChainValue parent = root_;
  for (size_t i = 0; i < num_pages; ++i) {
    parent = hash(parent, tokens.subspan(i * n, n), i == 0 ? std::string_view(extra) : "");
    out.push_back(parent.hash);
  }
  return out;
}

std::string first_page_extra_keys(std::string_view cache_salt) {
  if (cache_salt.empty()) return {};
  std::string extra = "salt:";
  extra.append(cache_salt);
  return extra;
}

BlockHash hash_block(BlockHash parent, std::span<const TokenId> page_tokens,
                     std::string_view extra_keys) {
  const size_t n = page_tokens.size();
  if (extra_keys.empty() && n >= 2 && n <= 28 && n % 2 == 0) {
    return hash_small_page(parent, page_tokens.data(), n);
  }
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
