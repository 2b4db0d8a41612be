// The router's KV block index at scale (issue 33): about 10 million distinct blocks spread
// over many workers, with the prefix sharing of agentic traffic. For each worker count it
// prints
//   - intake: apply() of every BlockStored batch that built the index (the router hashes
//     recomputed from the tokens included, as in the router), in blocks per second;
//   - bytes per indexed block: the allocator's live bytes (glibc mallinfo2, plus the
//     index's huge-page mappings, huge_page_allocator.h) and the
//     process's RSS, each after the index was built minus before, over the distinct blocks;
//   - the decision: match() of a request plus the policy's scoring (one WorkerCandidate per
//     worker, cost.h choose()), timed call by call: p50, p99, p99.9, max; and match() alone.
//
// The index. 256 shared stems of --stem-blocks blocks (a system prompt and tool schemas),
// picked with a skew (stem floor(256 * u^2) for u uniform in [0, 1): the first stems are
// popular and sit on nearly every worker, the last on few); conversations of --own-blocks
// own blocks after their stem, each on one worker drawn at random (sessions stick), a
// quarter of them offloaded to host as well. A worker stores a stem once: its later
// conversations with that stem arrive as events chained from the stem's last block, as a
// Strata worker reports them. Conversations are added until the index holds --blocks
// distinct blocks. Block size 16 tokens.
//
// The requests: stem + own blocks (--stem-blocks + --own-blocks), half a cached
// conversation, a quarter a cached stem with a new tail, a quarter all new.
//
// Run: build/src/bench/micro/bench_router_index_scale [--workers 64,1024] [--blocks 10000000]
//        [--stem-blocks 64] [--own-blocks 192] [--decisions 200000]
// Memory: about 80 bytes per distinct block (10M blocks: about 0.8 GB, 1.2 GB while the
// table grows), one worker count at a time.
#include <malloc.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "cache/block_hash.h"
#include "router/cost.h"
#include "router/huge_page_allocator.h"
#include "router/kv_event_wire.h"
#include "router/prefix_index.h"

namespace strata::router {
namespace {

constexpr int kBlock = 16;
constexpr int kStems = 256;

struct Options {
  std::vector<uint32_t> workers = {64, 1024};
  uint64_t blocks = 10'000'000;
  int stem_blocks = 64;
  int own_blocks = 192;
  int decisions = 200'000;
};

// In use from malloc's arenas, by its mmap'd chunks, and by the index's huge-page tables
// (mapped outside malloc).
uint64_t allocated_bytes() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd + huge_page_mapped_bytes();
}

uint64_t rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size_pages = 0, resident_pages = 0;
  statm >> size_pages >> resident_pages;
  return resident_pages * 4096;
}

// The tokens of conversation `c`'s own blocks: a function of (c, n) only, so that a query
// rebuilds them without the fixture keeping every conversation.
std::vector<int32_t> own_tokens(uint64_t c, int own_blocks) {
  std::mt19937_64 rng(0x5eed0000ULL + c);
  std::vector<int32_t> t(static_cast<size_t>(own_blocks) * kBlock);
  for (auto& x : t) x = static_cast<int32_t>(rng() % 150'000);
  return t;
}

// Router hashes of `tokens` chained after `parent`.
std::vector<uint64_t> chain(uint64_t parent, std::span<const int32_t> tokens) {
  std::vector<uint64_t> out;
  out.reserve(tokens.size() / kBlock);
  for (size_t i = 0; i + kBlock <= tokens.size(); i += kBlock) {
    parent = hash_block(parent, tokens.subspan(i, kBlock));
    out.push_back(parent);
  }
  return out;
}

struct Conversation {
  uint32_t stem = 0;
  WorkerId worker = 0;
};

// This thread's CPU time: unlike the wall clock, it leaves out the time the thread was
// not running (on a loaded machine, a wall-clock p99 is the scheduler's time slice).
int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

double percentile(std::vector<int64_t>& sorted_ns, double p) {
  const auto k = static_cast<size_t>(p * static_cast<double>(sorted_ns.size() - 1));
  return static_cast<double>(sorted_ns[k]) / 1000.0;
}

void run(const Options& o, uint32_t num_workers) {
  std::mt19937_64 rng(42 + num_workers);
  // The stems' tokens and router hashes (kept: about 1 MB of tokens).
  std::vector<std::vector<int32_t>> stem_tokens(kStems);
  std::vector<std::vector<uint64_t>> stem_hashes(kStems);
  for (int s = 0; s < kStems; ++s) {
    stem_tokens[s].resize(static_cast<size_t>(o.stem_blocks) * kBlock);
    for (auto& x : stem_tokens[s]) x = static_cast<int32_t>(rng() % 150'000);
    stem_hashes[s] = chain(kRootParentHash, stem_tokens[s]);
  }
  std::vector<bool> stem_on(static_cast<size_t>(kStems) * num_workers);
  std::vector<Conversation> conversations;
  conversations.reserve(o.blocks / static_cast<uint64_t>(o.own_blocks) + 1);

  malloc_trim(0);
  const uint64_t alloc_before = allocated_bytes();
  const uint64_t rss_before = rss_bytes();
  auto index = std::make_unique<PrefixIndex>();
  for (WorkerId w = 0; w < num_workers; ++w) (void)index->add_worker(w, kBlock);

  std::uniform_real_distribution<double> unit(0.0, 1.0);
  uint64_t applied_blocks = 0;
  int64_t apply_ns = 0;
  uint64_t distinct = 0;
  while (distinct < o.blocks) {
    const uint64_t c = conversations.size();
    const double u = unit(rng);
    const auto s = static_cast<uint32_t>(static_cast<double>(kStems) * u * u);
    const auto w = static_cast<WorkerId>(rng() % num_workers);
    conversations.push_back({s, w});
    const std::vector<int32_t> own = own_tokens(c, o.own_blocks);
    const std::vector<uint64_t> own_hashes = chain(stem_hashes[s].back(), own);
    // One event, as the worker that prefilled the conversation reports it: from the root
    // when it did not hold the stem, after the stem when it did.
    BlockStoredEvent ev;
    ev.block_size = kBlock;
    ev.tier = Tier::kDevice;
    const size_t key = static_cast<size_t>(s) * num_workers + w;
    if (stem_on[key]) {
      ev.parent_block_hash = stem_hashes[s].back();
      ev.block_hashes = own_hashes;
      ev.token_ids = own;
    } else {
      stem_on[key] = true;
      ev.block_hashes = stem_hashes[s];
      ev.block_hashes.insert(ev.block_hashes.end(), own_hashes.begin(), own_hashes.end());
      ev.token_ids = stem_tokens[s];
      ev.token_ids.insert(ev.token_ids.end(), own.begin(), own.end());
    }
    KvEventBatch batch;
    batch.events.push_back(ev);
    applied_blocks += ev.block_hashes.size();
    if (rng() % 4 == 0) {  // offloaded to host as well
      ev.tier = Tier::kHost;
      applied_blocks += ev.block_hashes.size();
      batch.events.push_back(std::move(ev));
    }
    const auto t0 = std::chrono::steady_clock::now();
    index->apply(w, batch);
    apply_ns +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    if (c % 1024 == 0 || distinct + static_cast<uint64_t>(o.own_blocks) >= o.blocks) {
      distinct = index->stats().distinct_blocks;
    } else {
      distinct += static_cast<uint64_t>(o.own_blocks);  // an estimate between exact counts
    }
  }
  const PrefixIndexStats st = index->stats();
  const uint64_t alloc_after = allocated_bytes();
  const uint64_t rss_after = rss_bytes();
  // The fixture's own bookkeeping allocated while building (conversations, stem marks) is
  // small beside the index; subtract it anyway.
  const uint64_t fixture_bytes =
      conversations.capacity() * sizeof(Conversation) + stem_on.capacity() / 8;
  uint64_t worker_blocks = 0;
  for (const auto& ws : st.workers) worker_blocks += ws.blocks;
  const auto per_block = [&](uint64_t after, uint64_t before) {
    return static_cast<double>(after - before - fixture_bytes) /
           static_cast<double>(st.distinct_blocks);
  };

  std::printf("workers %u: %llu distinct blocks, %llu worker-block entries, %zu conversations\n",
              num_workers, static_cast<unsigned long long>(st.distinct_blocks),
              static_cast<unsigned long long>(worker_blocks), conversations.size());
  std::printf("  intake: %.2fM blocks/s (apply() of %llu stored blocks, hashing included)\n",
              static_cast<double>(applied_blocks) / (static_cast<double>(apply_ns) / 1e9) / 1e6,
              static_cast<unsigned long long>(applied_blocks));
  std::printf(
      "  memory: %.1f bytes/block by the allocator, %.1f by RSS, %.1f by the index's "
      "estimate (%.0f MiB allocated)\n",
      per_block(alloc_after, alloc_before), per_block(rss_after, rss_before),
      static_cast<double>(st.memory_bytes) / static_cast<double>(st.distinct_blocks),
      static_cast<double>(alloc_after - alloc_before) / (1 << 20));

  // The requests' router hashes (4,096 of them, cycled).
  std::vector<std::vector<uint64_t>> queries;
  std::vector<int> query_kind;  // 0: a cached conversation, 1: a cached stem, 2: all new
  for (int q = 0; q < 4096; ++q) {
    const auto kind = rng() % 4;
    query_kind.push_back(kind < 2 ? 0 : static_cast<int>(kind) - 1);
    if (kind < 2) {
      const uint64_t c = rng() % conversations.size();
      const uint32_t s = conversations[c].stem;
      std::vector<uint64_t> h = stem_hashes[s];
      const auto own = chain(h.back(), own_tokens(c, o.own_blocks));
      h.insert(h.end(), own.begin(), own.end());
      queries.push_back(std::move(h));
    } else {
      const uint64_t fresh = (1ULL << 40) + static_cast<uint64_t>(q);
      std::vector<uint64_t> h;
      uint64_t parent = kRootParentHash;
      if (kind == 2) {
        h = stem_hashes[rng() % kStems];
        parent = h.back();
      } else {
        const auto tokens = own_tokens(fresh + (1ULL << 41), o.stem_blocks);
        h = chain(kRootParentHash, tokens);
        parent = h.back();
      }
      const auto tail = chain(parent, own_tokens(fresh, o.own_blocks));
      h.insert(h.end(), tail.begin(), tail.end());
      queries.push_back(std::move(h));
    }
  }
  // The workers' loads as the router sees them: fixed for the run.
  std::vector<WorkerCandidate> base(num_workers);
  for (WorkerId w = 0; w < num_workers; ++w) {
    base[w].id = w;
    base[w].block_size = kBlock;
    base[w].inflight_prefill_tokens = static_cast<int64_t>(rng() % 8192);
    base[w].decode_requests = static_cast<int64_t>(rng() % 32);
    base[w].load_fraction = unit(rng) * 0.8;
    base[w].sessions_assigned = static_cast<int64_t>(rng() % 64);
  }
  const CostWeights weights = default_weights();
  std::mt19937_64 choose_rng(1);

  const auto n = static_cast<size_t>(o.decisions);
  std::vector<int64_t> decision_ns(n), match_ns(n), decision_cpu_ns(n);
  std::vector<std::vector<int64_t>> match_ns_by_kind(3);
  std::array<uint64_t, 3> probes_by_kind{}, chained_by_kind{};
  uint64_t matched = 0, chosen_sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto& q = queries[i & 4095];
    const int64_t cpu0 = thread_cpu_ns();
    const auto t0 = std::chrono::steady_clock::now();
    MatchCost cost;
    const std::vector<WorkerMatch> ms = index->match(q, &cost);
    const auto t1 = std::chrono::steady_clock::now();
    std::vector<WorkerCandidate> cands = base;
    for (const WorkerMatch& m : ms) {
      WorkerCandidate& c = cands[m.worker];
      c.cached_device_blocks = m.device_blocks;
      c.cached_host_blocks = m.host_blocks;
      c.cached_storage_blocks = m.storage_blocks;
      c.pinned_blocks = m.pinned_blocks;
      c.predicted_blocks = m.predicted_blocks;
    }
    RequestFeatures f;
    f.prompt_tokens = static_cast<int64_t>(q.size()) * kBlock;
    const auto d = choose(f, cands, weights, choose_rng);
    const auto t2 = std::chrono::steady_clock::now();
    decision_cpu_ns[i] = thread_cpu_ns() - cpu0;
    matched += ms.size();
    chosen_sum += d ? d->worker : 0;
    match_ns[i] = std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
    match_ns_by_kind[query_kind[i & 4095]].push_back(match_ns[i]);
    probes_by_kind[query_kind[i & 4095]] += cost.probes;
    chained_by_kind[query_kind[i & 4095]] += cost.chained_blocks;
    decision_ns[i] = std::chrono::duration_cast<std::chrono::nanoseconds>(t2 - t0).count();
  }
  std::sort(decision_ns.begin(), decision_ns.end());
  std::sort(match_ns.begin(), match_ns.end());
  std::sort(decision_cpu_ns.begin(), decision_cpu_ns.end());
  std::printf(
      "  decision (match + choose over %u candidates), %zu calls of %d-block requests: "
      "p50 %.2f us, p99 %.2f us, p99.9 %.2f us, max %.1f us\n",
      num_workers, n, o.stem_blocks + o.own_blocks, percentile(decision_ns, 0.5),
      percentile(decision_ns, 0.99), percentile(decision_ns, 0.999),
      static_cast<double>(decision_ns.back()) / 1000.0);
  std::printf(
      "  decision in thread CPU time (no preemption): p50 %.2f us, p99 %.2f us, p99.9 %.2f us\n",
      percentile(decision_cpu_ns, 0.5), percentile(decision_cpu_ns, 0.99),
      percentile(decision_cpu_ns, 0.999));
  std::printf(
      "  match() alone: p50 %.2f us, p99 %.2f us, p99.9 %.2f us; %.1f workers matched per "
      "request (checksum %llu)\n",
      percentile(match_ns, 0.5), percentile(match_ns, 0.99), percentile(match_ns, 0.999),
      static_cast<double>(matched) / static_cast<double>(n),
      static_cast<unsigned long long>(chosen_sum));
  const char* kind_names[] = {"cached conversation", "cached stem + new tail", "all new"};
  for (int k = 0; k < 3; ++k) {
    std::vector<int64_t>& v = match_ns_by_kind[k];
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    const auto calls = static_cast<double>(v.size());
    std::printf(
        "  match() of a %s (%zu calls): p50 %.2f us, p99 %.2f us; per call %.1f table probes, "
        "%.1f blocks along chains\n",
        kind_names[k], v.size(), percentile(v, 0.5), percentile(v, 0.99),
        static_cast<double>(probes_by_kind[k]) / calls,
        static_cast<double>(chained_by_kind[k]) / calls);
  }
  std::fflush(stdout);
}

std::vector<uint32_t> parse_list(std::string_view s) {
  std::vector<uint32_t> out;
  while (!s.empty()) {
    const size_t comma = s.find(',');
    out.push_back(static_cast<uint32_t>(std::stoul(std::string(s.substr(0, comma)))));
    s = comma == std::string_view::npos ? std::string_view() : s.substr(comma + 1);
  }
  return out;
}

}  // namespace
}  // namespace strata::router

int main(int argc, char** argv) {
  using strata::router::Options;
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    const std::string value = argv[i + 1];
    if (flag == "--workers") {
      o.workers = strata::router::parse_list(value);
    } else if (flag == "--blocks") {
      o.blocks = std::stoull(value);
    } else if (flag == "--stem-blocks") {
      o.stem_blocks = std::stoi(value);
    } else if (flag == "--own-blocks") {
      o.own_blocks = std::stoi(value);
    } else if (flag == "--decisions") {
      o.decisions = std::stoi(value);
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  for (uint32_t w : o.workers) {
    if (w < 1 || w > strata::router::kMaxWorkers || o.stem_blocks < 1 || o.own_blocks < 1 ||
        o.decisions < 1) {
      std::fprintf(stderr, "workers in [1, %u]; blocks, decisions >= 1\n",
                   strata::router::kMaxWorkers);
      return 2;
    }
    strata::router::run(o, w);
  }
  return 0;
}
