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

}  // namespace
}  // namespace strata
