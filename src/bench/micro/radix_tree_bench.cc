// Micro-benchmarks of the radix tree's hot paths, on a tree holding about 1M tokens in
// 10K sequences that share prefixes (page size 16):
//   - 100 "system prompts" of 1,024 tokens, each the stem of 100 conversations whose
//     own parts add 576 tokens on average (every sequence is 16-token aligned);
//   - one extra 16K-token prompt for the full-match case.
// The benchmarks share the tree and run in order; MatchSplitsFreshBranch and
// LookupSettles16Branches come after the pin benchmarks so as not to change their tree.
// Run: build/src/bench/micro/bench_radix_tree
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <random>

#include "cache/radix_tree.h"

namespace strata {
namespace {

constexpr int32_t kPage = 16;

struct Fixture {
  std::unique_ptr<PageAllocator> alloc;
  std::unique_ptr<RadixTree> tree;
  std::vector<TokenId> long_prompt;  // 16K tokens, fully cached
  std::mt19937 rng{7};

  explicit Fixture(int32_t extra_pages) {
    alloc = std::make_unique<PageAllocator>(1'000'000 / kPage + 2'048 + extra_pages);
    tree = std::make_unique<RadixTree>(RadixTreeOptions{kPage}, alloc.get(), nullptr);
    std::uniform_int_distribution<TokenId> tok(0, 150'000);
    int64_t cached = 0;
    for (int s = 0; s < 100; ++s) {
      std::vector<TokenId> stem(1024);
      for (auto& t : stem) t = tok(rng);
      for (int c = 0; c < 100; ++c) {
        std::vector<TokenId> seq = stem;
        const int own = 16 * std::uniform_int_distribution<int>(2, 9)(rng);
        for (int k = 0; k < own; ++k) seq.push_back(tok(rng));
        put(seq);
        cached += own;
      }
      cached += 1024;
    }
    long_prompt.resize(16 * 1024);
    for (auto& t : long_prompt) t = tok(rng);
    put(long_prompt);
  }

  InsertResult put(const std::vector<TokenId>& seq) {
    MatchResult m = tree->match_prefix(seq);
    std::vector<PageId> pages = m.device_pages;
    const int32_t need = static_cast<int32_t>(seq.size()) / kPage - m.num_pages;
    if (!alloc->allocate(need, pages).has_value()) {
      tree->evict(need);
      (void)alloc->allocate(need, pages);
    }
    return tree->insert(seq, pages);
  }
};

Fixture& shared_fixture() {
  static Fixture f(64 * 1024);
  return f;
}

void BM_MatchPrefix16K(benchmark::State& state) {
  Fixture& f = shared_fixture();
  for (auto _ : state) {
    MatchResult m = f.tree->match_prefix(f.long_prompt);
    benchmark::DoNotOptimize(m.num_pages);
  }
  state.counters["tokens"] = static_cast<double>(f.long_prompt.size());
  state.counters["tree_pages"] = static_cast<double>(f.tree->stats().cached_pages);
}
BENCHMARK(BM_MatchPrefix16K)->Unit(benchmark::kMicrosecond);

void BM_Insert1KBranch(benchmark::State& state) {
  Fixture& f = shared_fixture();
  std::uniform_int_distribution<TokenId> tok(0, 150'000);
  // A new 1K-token branch below a cached 1K-token system prompt.
  std::vector<TokenId> base(f.long_prompt.begin(), f.long_prompt.begin() + 1024);
  for (auto _ : state) {
    state.PauseTiming();
    std::vector<TokenId> seq = base;
    for (int k = 0; k < 1024; ++k) seq.push_back(tok(f.rng));
    std::vector<PageId> pages = f.tree->match_prefix(seq).device_pages;
    if (!f.alloc->allocate(64, pages).has_value()) {
      f.tree->evict(64);
      (void)f.alloc->allocate(64, pages);
    }
    state.ResumeTiming();
    InsertResult r = f.tree->insert(seq, pages);
    benchmark::DoNotOptimize(r.num_new_pages);
  }
}
BENCHMARK(BM_Insert1KBranch)->Unit(benchmark::kMicrosecond);

void BM_Evict1000Pages(benchmark::State& state) {
  Fixture& f = shared_fixture();
  std::uniform_int_distribution<TokenId> tok(0, 150'000);
  for (auto _ : state) {
    state.PauseTiming();
    // Refill with 1,000 pages of new 16-page leaves so every iteration evicts the same.
    for (int s = 0; s < 63; ++s) {
      std::vector<TokenId> seq(256);
      for (auto& t : seq) t = tok(f.rng);
      f.put(seq);
    }
    state.ResumeTiming();
    EvictResult r = f.tree->evict(1000);
    benchmark::DoNotOptimize(r.evicted_pages);
  }
}
BENCHMARK(BM_Evict1000Pages)->Unit(benchmark::kMicrosecond);

void BM_Pin1000Unpin1000(benchmark::State& state) {
  Fixture& f = shared_fixture();
  // 1,000 hashes spread over the tree (a router pinning many conversations' blocks).
  // Sorted first: all_block_hashes() lists in the index's order, which varies between runs.
  std::vector<BlockHash> all = f.tree->all_block_hashes();
  std::sort(all.begin(), all.end());
  std::shuffle(all.begin(), all.end(), f.rng);
  std::vector<BlockHash> hs(all.begin(), all.begin() + 1000);
  for (auto _ : state) {
    PinResult p = f.tree->pin(hs);
    UnpinResult u = f.tree->unpin(hs);
    benchmark::DoNotOptimize(p.pinned + u.unpinned);
  }
  state.SetItemsProcessed(state.iterations() * 2000);
}
BENCHMARK(BM_Pin1000Unpin1000)->Unit(benchmark::kMicrosecond);

void BM_Pin1000ChainBlocks(benchmark::State& state) {
  Fixture& f = shared_fixture();
  // The long prompt's first 1,000 blocks: the VIP-conversation case.
  std::vector<BlockHash> hs = hash_blocks(f.long_prompt, kPage);
  hs.resize(1000);
  for (auto _ : state) {
    PinResult p = f.tree->pin(hs);
    benchmark::DoNotOptimize(p.pinned);
    state.PauseTiming();
    f.tree->unpin(hs);
    state.ResumeTiming();
  }
}
BENCHMARK(BM_Pin1000ChainBlocks)->Unit(benchmark::kMicrosecond);

void BM_MatchSplitsFreshBranch(benchmark::State& state) {
  Fixture& f = shared_fixture();
  std::uniform_int_distribution<TokenId> tok(0, 150'000);
  // A prompt that leaves a freshly inserted 1K-token branch after 512 tokens (a new
  // conversation under a system prompt that came in as part of a longer one): the match
  // splits the fresh node, whose blocks nobody has looked up by hash yet.
  std::vector<TokenId> base(f.long_prompt.begin(), f.long_prompt.begin() + 1024);
  for (auto _ : state) {
    state.PauseTiming();
    std::vector<TokenId> seq = base;
    for (int k = 0; k < 1024; ++k) seq.push_back(tok(f.rng));
    f.put(seq);
    std::vector<TokenId> other(seq.begin(), seq.begin() + 1024 + 512);
    for (int k = 0; k < 512; ++k) other.push_back(tok(f.rng));
    state.ResumeTiming();
    MatchResult m = f.tree->match_prefix(other);
    benchmark::DoNotOptimize(m.num_pages);
  }
}
BENCHMARK(BM_MatchSplitsFreshBranch)->Unit(benchmark::kMicrosecond);

void BM_LookupSettles16Branches(benchmark::State& state) {
  Fixture& f = shared_fixture();
  std::uniform_int_distribution<TokenId> tok(0, 150'000);
  // The deferred half of insert's work, paid by the first lookup by hash after 16 new
  // 1K-token branches (a pin or a finished transfer after a burst of requests): it
  // indexes their 16 x 63 blocks after the first.
  std::vector<TokenId> base(f.long_prompt.begin(), f.long_prompt.begin() + 1024);
  const BlockHash unknown = 42;
  for (auto _ : state) {
    state.PauseTiming();
    for (int b = 0; b < 16; ++b) {
      std::vector<TokenId> seq = base;
      for (int k = 0; k < 1024; ++k) seq.push_back(tok(f.rng));
      f.put(seq);
    }
    state.ResumeTiming();
    benchmark::DoNotOptimize(f.tree->contains(unknown));
  }
}
BENCHMARK(BM_LookupSettles16Branches)->Unit(benchmark::kMicrosecond)->Iterations(2000);

void BM_HashPerToken(benchmark::State& state) {
  std::vector<TokenId> tokens(16 * 1024);
  std::mt19937 rng(3);
  for (auto& t : tokens) t = static_cast<TokenId>(rng() % 150'000);
  for (auto _ : state) {
    auto hs = hash_blocks(tokens, kPage);
    benchmark::DoNotOptimize(hs.data());
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(tokens.size()));
}
BENCHMARK(BM_HashPerToken)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace strata

BENCHMARK_MAIN();
