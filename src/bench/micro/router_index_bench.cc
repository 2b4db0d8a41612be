// Micro-benchmarks of the router's KV block index (src/router/prefix_index.h):
//   - Decision: 8 workers, about 1M distinct indexed blocks (block size 16): 1,024 system
//     prompts of 16 blocks, each the stem of 20 conversations of 48 own blocks (64 blocks
//     in all), every conversation stored on one worker (device, a quarter also on host)
//     and its stem on the workers of its conversations. match() of 64-block requests:
//     1/2 a cached conversation, 1/4 a cached stem with a new tail, 1/4 all new.
//     BM_Match reports the mean; BM_MatchLatency times 100K calls one by one and reports
//     p50/p99/p99.9 (ns) in its counters.
//   - Ingestion: apply() of decoded batches (64 BlockStored events of 16 blocks of 16
//     tokens), for a worker hashing like Strata (identity maps) and like vLLM (mapped);
//     and decode + apply from the raw msgpack payloads. Items are blocks.
// Run: build/src/bench/micro/bench_router_index
#include <benchmark/benchmark.h>
#include <msgpuck.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/block_hash.h"
#include "router/kv_event_wire.h"
#include "router/prefix_index.h"

namespace strata::router {
namespace {

constexpr int kBlock = 16;
constexpr int kWorkers = 8;
constexpr int kStems = 1024;
constexpr int kStemBlocks = 16;
constexpr int kConversations = 20;  // per stem
constexpr int kOwnBlocks = 48;      // per conversation

std::vector<int32_t> random_tokens(std::mt19937_64& rng, size_t n) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % 150'000);
  return t;
}

struct DecisionFixture {
  PrefixIndex index;
  std::vector<std::vector<uint64_t>> queries;  // router hashes of 64-block requests

  DecisionFixture() {
    std::mt19937_64 rng(7);
    for (WorkerId w = 0; w < kWorkers; ++w) (void)index.add_worker(w, kBlock);
    std::vector<std::vector<int32_t>> conversations;
    std::vector<std::vector<int32_t>> stems;
    for (int s = 0; s < kStems; ++s) {
      stems.push_back(random_tokens(rng, kStemBlocks * kBlock));
      for (int c = 0; c < kConversations; ++c) {
        std::vector<int32_t> seq = stems.back();
        const auto own = random_tokens(rng, kOwnBlocks * kBlock);
        seq.insert(seq.end(), own.begin(), own.end());
        const auto w = static_cast<WorkerId>(rng() % kWorkers);
        // One event per conversation: stored from the root on the device, as a worker
        // that prefilled it reports it; a quarter also offloaded to host.
        KvEventBatch batch;
        BlockStoredEvent ev;
        ev.block_hashes = PrefixIndex::hash_tokens(seq, kBlock);
        ev.token_ids = seq;
        ev.block_size = kBlock;
        ev.tier = Tier::kDevice;
        batch.events.push_back(ev);
        if (rng() % 4 == 0) {
          ev.tier = Tier::kHost;
          batch.events.push_back(ev);
        }
        index.apply(w, batch);
        if (conversations.size() < 4096) conversations.push_back(std::move(seq));
      }
    }
    for (int q = 0; q < 4096; ++q) {
      const auto kind = rng() % 4;
      std::vector<int32_t> tokens;
      if (kind < 2) {
        tokens = conversations[rng() % conversations.size()];
      } else if (kind == 2) {
        tokens = stems[rng() % stems.size()];
        const auto tail = random_tokens(rng, kOwnBlocks * kBlock);
        tokens.insert(tokens.end(), tail.begin(), tail.end());
      } else {
        tokens = random_tokens(rng, (kStemBlocks + kOwnBlocks) * kBlock);
      }
      queries.push_back(PrefixIndex::hash_tokens(tokens, kBlock));
    }
  }
};

DecisionFixture& decision_fixture() {
  static DecisionFixture f;
  return f;
}

void report_index(benchmark::State& state, const PrefixIndex& index) {
  const auto st = index.stats();
  uint64_t entries = 0;
  for (const auto& w : st.workers) entries += w.blocks;
  state.counters["distinct_blocks"] = static_cast<double>(st.distinct_blocks);
  state.counters["worker_blocks"] = static_cast<double>(entries);
  state.counters["index_MiB"] = static_cast<double>(st.memory_bytes) / (1 << 20);
}

void BM_Match(benchmark::State& state) {
  auto& f = decision_fixture();
  size_t i = 0;
  uint64_t matched = 0;
  for (auto _ : state) {
    const auto ms = f.index.match(f.queries[i++ & 4095]);
    matched += ms.size();
    benchmark::DoNotOptimize(ms.data());
  }
  state.counters["workers_matched_per_call"] =
      static_cast<double>(matched) / static_cast<double>(state.iterations());
  report_index(state, f.index);
}
BENCHMARK(BM_Match);

void BM_MatchLatency(benchmark::State& state) {
  auto& f = decision_fixture();
  constexpr int kCalls = 100'000;
  std::vector<int64_t> ns(kCalls);
  for (auto _ : state) {
    for (int i = 0; i < kCalls; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto ms = f.index.match(f.queries[static_cast<size_t>(i) & 4095]);
      benchmark::DoNotOptimize(ms.data());
      ns[i] = std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now() - t0)
                  .count();
    }
  }
  std::sort(ns.begin(), ns.end());
  state.counters["p50_ns"] = static_cast<double>(ns[kCalls / 2]);
  state.counters["p99_ns"] = static_cast<double>(ns[kCalls * 99 / 100]);
  state.counters["p999_ns"] = static_cast<double>(ns[kCalls * 999 / 1000]);
  state.counters["max_ns"] = static_cast<double>(ns.back());
}
BENCHMARK(BM_MatchLatency)->Iterations(1)->Unit(benchmark::kMillisecond);

// hash_tokens() of a 64-block request (1,024 tokens): the router's other per-request cost.
void BM_HashTokens(benchmark::State& state) {
  std::mt19937_64 rng(3);
  const auto tokens = random_tokens(rng, 64 * kBlock);
  for (auto _ : state) benchmark::DoNotOptimize(PrefixIndex::hash_tokens(tokens, kBlock));
}
BENCHMARK(BM_HashTokens);

// Ingestion. 256 batches of 64 events x 16 blocks (262,144 blocks), cycled; the index is
// replaced (untimed) when the cycle starts again so that every store is a new block.
constexpr int kBatches = 256;
constexpr int kEventsPerBatch = 64;
constexpr int kBlocksPerEvent = 16;

uint64_t vllm_like(uint64_t h) {
  return h * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL;
}

std::vector<KvEventBatch> make_batches(bool strata_hashes) {
  std::mt19937_64 rng(11);
  std::vector<KvEventBatch> batches(kBatches);
  for (auto& b : batches) {
    for (int e = 0; e < kEventsPerBatch; ++e) {
      BlockStoredEvent ev;
      ev.token_ids = random_tokens(rng, kBlocksPerEvent * kBlock);
      ev.block_hashes = hash_blocks(ev.token_ids, kBlock);
      if (!strata_hashes) {
        for (auto& h : ev.block_hashes) h = vllm_like(h);
      }
      ev.block_size = kBlock;
      b.events.emplace_back(std::move(ev));
    }
  }
  return batches;
}

std::string encode(const KvEventBatch& b) {
  std::string out(64 + b.events.size() * kBlocksPerEvent * (kBlock * 5 + 16), '\0');
  char* p = out.data();
  p = mp_encode_array(p, 3);
  p = mp_encode_double(p, 1.0);
  p = mp_encode_array(p, static_cast<uint32_t>(b.events.size()));
  for (const auto& e : b.events) {
    const auto& ev = std::get<BlockStoredEvent>(e);
    p = mp_encode_array(p, 7);
    p = mp_encode_str(p, "BlockStored", 11);
    p = mp_encode_array(p, static_cast<uint32_t>(ev.block_hashes.size()));
    for (uint64_t h : ev.block_hashes) {
      const auto v = static_cast<int64_t>(h);
      p = v < 0 ? mp_encode_int(p, v) : mp_encode_uint(p, static_cast<uint64_t>(v));
    }
    p = mp_encode_nil(p);
    p = mp_encode_array(p, static_cast<uint32_t>(ev.token_ids.size()));
    for (int32_t t : ev.token_ids) p = mp_encode_uint(p, static_cast<uint64_t>(t));
    p = mp_encode_uint(p, kBlock);
    p = mp_encode_nil(p);
    p = mp_encode_str(p, "GPU", 3);
  }
  p = mp_encode_uint(p, 0);
  out.resize(static_cast<size_t>(p - out.data()));
  return out;
}

template <typename ApplyOne>
void run_ingestion(benchmark::State& state, ApplyOne apply_one) {
  auto index = std::make_unique<PrefixIndex>();
  (void)index->add_worker(0, kBlock);
  size_t i = 0;
  for (auto _ : state) {
    if (i == kBatches) {
      state.PauseTiming();
      index = std::make_unique<PrefixIndex>();
      (void)index->add_worker(0, kBlock);
      i = 0;
      state.ResumeTiming();
    }
    apply_one(*index, i++);
  }
  state.SetItemsProcessed(state.iterations() * kEventsPerBatch * kBlocksPerEvent);
}

void BM_ApplyDecoded(benchmark::State& state) {
  static const std::vector<KvEventBatch> strata = make_batches(true);
  static const std::vector<KvEventBatch> vllm = make_batches(false);
  const auto& batches = state.range(0) == 0 ? strata : vllm;
  state.SetLabel(state.range(0) == 0 ? "strata hashes" : "vllm-like hashes");
  run_ingestion(state, [&](PrefixIndex& index, size_t i) { index.apply(0, batches[i]); });
}
BENCHMARK(BM_ApplyDecoded)->Arg(0)->Arg(1);

void BM_DecodeAndApply(benchmark::State& state) {
  static const std::vector<std::string> payloads = [] {
    std::vector<std::string> out;
    for (const auto& b : make_batches(false)) out.push_back(encode(b));
    return out;
  }();
  size_t bytes = 0;
  run_ingestion(state, [&](PrefixIndex& index, size_t i) {
    auto batch = decode_kv_event_batch(payloads[i]);
    if (batch) index.apply(0, *batch);
    bytes += payloads[i].size();
  });
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_DecodeAndApply);

void BM_DecodeOnly(benchmark::State& state) {
  static const std::string payload = encode(make_batches(false)[0]);
  for (auto _ : state) benchmark::DoNotOptimize(decode_kv_event_batch(payload));
  state.SetItemsProcessed(state.iterations() * kEventsPerBatch * kBlocksPerEvent);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(payload.size()));
}
BENCHMARK(BM_DecodeOnly);

}  // namespace
}  // namespace strata::router

BENCHMARK_MAIN();
