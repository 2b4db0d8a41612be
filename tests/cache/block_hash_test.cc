#include "cache/block_hash.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace strata {
namespace {

TEST(BlockHash, MatchesTheDocumentedByteLayout) {
  // docs/block-hashes.md: u64le(parent) u32le(n) i32le(tokens...) u32le(len(extra)) extra
  const std::vector<TokenId> page{1, 2, 3, 4};
  std::string bytes;
  auto put = [&](const void* p, size_t n) { bytes.append(static_cast<const char*>(p), n); };
  const uint64_t parent = kRootParentHash;
  const uint32_t n = 4;
  const std::string extra = "salt:abc";
  const uint32_t e = static_cast<uint32_t>(extra.size());
  put(&parent, 8);
  put(&n, 4);
  put(page.data(), 16);
  put(&e, 4);
  bytes += extra;
  EXPECT_EQ(hash_block(kRootParentHash, page, extra), XXH3_64bits(bytes.data(), bytes.size()));
}

TEST(BlockHash, EveryPageSizeHashesTheDocumentedBytes) {
  // hash_block has a word-wise path for small even pages without extra keys and a buffer
  // path for the rest: both must equal XXH3 of the documented bytes, for every size.
  std::mt19937_64 rng(11);
  for (uint32_t n = 1; n <= 80; ++n) {
    for (const std::string extra : {"", "salt:t"}) {
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<TokenId> page(n);
        for (TokenId& t : page) t = static_cast<TokenId>(rng());  // negative ones too
        const uint64_t parent = rng();
        std::string bytes;
        auto put = [&](const void* p, size_t len) {
          bytes.append(static_cast<const char*>(p), len);
        };
        const uint32_t e = static_cast<uint32_t>(extra.size());
        put(&parent, 8);
        put(&n, 4);
        put(page.data(), 4 * page.size());
        put(&e, 4);
        bytes += extra;
        ASSERT_EQ(hash_block(parent, page, extra), XXH3_64bits(bytes.data(), bytes.size()))
            << "page size " << n << ", extra '" << extra << "'";
      }
    }
  }
}

TEST(BlockHash, KnownValuesAreStableAcrossBuilds) {
  // Pinned values: if these change, every router's recomputation breaks.
  const std::vector<TokenId> tokens{1, 2, 3, 4};
  const auto h = hash_blocks(tokens, 2);
  ASSERT_EQ(h.size(), 2u);
  EXPECT_EQ(block_hash_to_wire(h[0]), 7624151575509621161LL);
  EXPECT_EQ(block_hash_to_wire(h[1]), 4293234038245755819LL);
  EXPECT_EQ(kRootParentHash, 0x3130415441525453ULL);
  char seed[9] = {};
  std::memcpy(seed, &kRootParentHash, 8);
  EXPECT_STREQ(seed, "STRATA01");
}

TEST(BlockHash, ChainsFromTheParent) {
  const std::vector<TokenId> tokens{5, 6, 7, 8, 9, 10};
  const auto h = hash_blocks(tokens, 2);
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0], hash_block(kRootParentHash, std::vector<TokenId>{5, 6}));
  EXPECT_EQ(h[1], hash_block(h[0], std::vector<TokenId>{7, 8}));
  EXPECT_EQ(h[2], hash_block(h[1], std::vector<TokenId>{9, 10}));
}

TEST(BlockHash, PartialPageIsIgnored) {
  EXPECT_EQ(hash_blocks(std::vector<TokenId>{1, 2, 3}, 2).size(), 1u);
  EXPECT_TRUE(hash_blocks(std::vector<TokenId>{1}, 2).empty());
}

TEST(BlockHash, SaltChangesEveryHashOfTheChain) {
  const std::vector<TokenId> tokens{1, 2, 3, 4};
  const auto plain = hash_blocks(tokens, 2);
  const auto salted = hash_blocks(tokens, 2, "tenant");
  EXPECT_NE(plain[0], salted[0]);
  EXPECT_NE(plain[1], salted[1]);
  EXPECT_EQ(salted, hash_blocks(tokens, 2, "tenant"));
  EXPECT_EQ(first_page_extra_keys(""), "");
  EXPECT_EQ(first_page_extra_keys("x"), "salt:x");
}

TEST(BlockHash, WireConversionIsLossless) {
  for (BlockHash h : {0ULL, 1ULL, 0x8000000000000000ULL, ~0ULL}) {
    EXPECT_EQ(block_hash_from_wire(block_hash_to_wire(h)), h);
  }
}

// vLLM's sha256_cbor (block_hash.h, BlockHasher). The vectors below were computed with
// vLLM's own recipe and libraries, cbor2.dumps(x, canonical=True) and hashlib.sha256, by
// tests/tools/recompute_vllm_block_hashes.py --vectors, which follows
// vllm/v1/core/kv_cache_utils.py (init_none_hash, hash_block_tokens,
// generate_block_hash_extra_keys, maybe_convert_block_hash) and vllm/utils/hashing.py
// (sha256_cbor); llm-d's kv-cache indexer computed the same before it hashed tokens its own
// way (pkg/kvcache/kvblock/token_processor.go at 994abf2: the seed's CBOR hashed for the
// root, CBOR [parent digest, tokens, extra] per block, the digest's last 8 bytes big-endian).
// The ctest block_hashes_recomputed_like_vllm compares many more against the binary.
BlockHasher vllm_hasher(std::string_view seed) {
  auto h = BlockHasher::make(BlockHashAlgo::kSha256Cbor, seed);
  EXPECT_TRUE(h.has_value());
  return *h;
}

std::vector<TokenId> iota_tokens(int n) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = i + 1;
  return t;
}

std::vector<BlockHash> wire(std::initializer_list<int64_t> values) {
  std::vector<BlockHash> out;
  for (int64_t v : values) out.push_back(block_hash_from_wire(v));
  return out;
}

TEST(VllmBlockHash, TheRootIsTheSeedsDigest) {
  // NONE_HASH = sha256(cbor("0")) = sha256(0x61 0x30): 4e1195df...f2e61c3e.
  const ChainValue root = vllm_hasher("0").root();
  const ChainTail head{0x4e, 0x11, 0x95, 0xdf, 0x02, 0x0d, 0xe5, 0x9e, 0x0d, 0x65, 0xa3, 0x3a,
                       0x42, 0x79, 0xf1, 0x18, 0x3e, 0x7a, 0xe4, 0xe5, 0xd9, 0x80, 0xe3, 0x09};
  EXPECT_EQ(root.tail, head);
  EXPECT_EQ(root.hash, 0xf8b55adff2e61c3eULL);  // the last 8 bytes, big-endian
}

TEST(VllmBlockHash, KnownValuesOfVllmsRecipe) {
  EXPECT_EQ(vllm_hasher("0").hash_blocks(std::vector<TokenId>{1, 2, 3, 4}, 2),
            wire({-6437397689344758433, -6556709731552270000}));
  EXPECT_EQ(vllm_hasher("0").hash_blocks(iota_tokens(32), 16),
            wire({3236607068019569386, 2758186210834249151}));
  // A salt enters the first block as extra_keys = ("tenant-a",), and the chain after it.
  EXPECT_EQ(vllm_hasher("0").hash_blocks(iota_tokens(32), 16, "tenant-a"),
            wire({-7511961412455777693, 4663726050606482124}));
  // Token ids at the edges of CBOR's integer widths; another seed.
  EXPECT_EQ(vllm_hasher("42").hash_blocks(
                std::vector<TokenId>{0, 23, 24, 255, 256, 65535, 65536, 151643}, 4),
            wire({8385220927864532888, 5583601237130849505}));
}

TEST(VllmBlockHash, ExtraKeysAreTheSaltsCborArray) {
  const BlockHasher h = vllm_hasher("0");
  EXPECT_EQ(h.first_page_extra_keys(""), "");
  // RFC 8949: an array of one item (0x81), a text string of 8 bytes (0x68).
  EXPECT_EQ(h.first_page_extra_keys("tenant-a"), std::string("\x81\x68tenant-a"));
}

TEST(VllmBlockHash, ChainsTheWholeDigestNotTheHash) {
  const BlockHasher h = vllm_hasher("0");
  const std::vector<TokenId> tokens = iota_tokens(48);
  const std::vector<BlockHash> all = h.hash_blocks(tokens, 16);
  ChainValue parent = h.root();
  for (size_t i = 0; i < all.size(); ++i) {
    parent = h.hash(parent, std::span<const TokenId>(tokens).subspan(16 * i, 16));
    EXPECT_EQ(parent.hash, all[i]);
  }
  // The same 64-bit hash with another tail is another parent.
  ChainValue forged = h.hash(h.root(), std::span<const TokenId>(tokens).first(16));
  forged.tail[0] ^= 1;
  EXPECT_NE(h.hash(forged, std::span<const TokenId>(tokens).subspan(16, 16)).hash, all[1]);
}

TEST(VllmBlockHash, BadChoicesAreRefusedClearly) {
  auto no_seed = BlockHasher::make(BlockHashAlgo::kSha256Cbor, "");
  ASSERT_FALSE(no_seed.has_value());
  EXPECT_NE(no_seed.error().message.find("PYTHONHASHSEED"), std::string::npos);
  EXPECT_FALSE(BlockHasher::make(BlockHashAlgo::kStrata, "0").has_value());
  auto unknown = parse_block_hash_algo("sha256");
  ASSERT_FALSE(unknown.has_value());
  EXPECT_NE(unknown.error().message.find("strata or sha256_cbor"), std::string::npos);
  EXPECT_EQ(parse_block_hash_algo("sha256_cbor").value(), BlockHashAlgo::kSha256Cbor);
  EXPECT_EQ(block_hash_algo_name(BlockHashAlgo::kStrata), "strata");
}

TEST(VllmBlockHash, StratasOwnThroughTheHasherIsUnchanged) {
  const BlockHasher h;
  const std::vector<TokenId> tokens = iota_tokens(40);
  EXPECT_EQ(h.hash_blocks(tokens, 16, "s"), hash_blocks(tokens, 16, "s"));
  EXPECT_EQ(h.root().hash, kRootParentHash);
  EXPECT_EQ(h.first_page_extra_keys("s"), first_page_extra_keys("s"));
}

}  // namespace
}  // namespace strata
