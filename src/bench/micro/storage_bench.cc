// Read and write bandwidth of the storage backends for batches of 64 pages of 256 KiB,
// the unit the hierarchical cache moves between the host tier and L3, next to a plain
// memcpy of the same bytes. The file backend writes under /tmp (page cache, no fsync, as
// the backend itself); the redis backend talks to a private redis-server started here on
// a free loopback port. Bandwidth (bytes_per_second) is over wall time (UseRealTime),
// since a backend mostly waits on the kernel or on Redis, which CPU time would not show.
//
//   build/src/bench/micro/bench_storage [--benchmark_min_time=2]
//   (STRATA_BENCH_PAGE_BYTES=N: pages of N bytes)
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/clock.h"
#include "storage/file_backend.h"
#include "storage/redis_backend.h"
#include "storage/storage_backend.h"
#include "testing/redis_test_server.h"

namespace strata {
namespace {

constexpr size_t kPagesPerBatch = 64;

// 256 KiB, or STRATA_BENCH_PAGE_BYTES (e.g. the bench model's page: 131072 bytes in BF16,
// 67584 in int8 with its scales; issue 54).
size_t page_bytes() {
  static const size_t bytes = [] {
    const char* v = std::getenv("STRATA_BENCH_PAGE_BYTES");
    return v != nullptr ? static_cast<size_t>(std::atoll(v)) : size_t{256 * 1024};
  }();
  return bytes;
}
int64_t batch_bytes() {
  return static_cast<int64_t>(kPagesPerBatch * page_bytes());
}

// Host-tier pages: source values and destination buffers, filled once.
struct Pages {
  std::vector<std::vector<std::byte>> src, dst;
  std::vector<std::span<const std::byte>> src_views;
  std::vector<std::span<std::byte>> dst_views;

  Pages() {
    std::mt19937_64 gen(42);
    for (size_t i = 0; i < kPagesPerBatch; ++i) {
      src.emplace_back(page_bytes());
      dst.emplace_back(page_bytes());
      for (std::byte& b : src.back()) b = static_cast<std::byte>(gen());
    }
    for (auto& v : src) src_views.emplace_back(v);
    for (auto& v : dst) dst_views.emplace_back(v);
  }
};

Pages& pages() {
  static Pages p;
  return p;
}

// Keys first..first+63.
std::vector<uint64_t> batch_keys(uint64_t first) {
  std::vector<uint64_t> keys(kPagesPerBatch);
  for (size_t i = 0; i < kPagesPerBatch; ++i) keys[i] = first + i;
  return keys;
}

bool all_ok(const std::vector<Status>& results) {
  for (const Status& s : results) {
    if (!s) return false;
  }
  return true;
}

// A scratch directory under /tmp, removed at exit.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/strata-storage-bench-XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

TempDir& temp_dir() {
  static TempDir dir;
  return dir;
}

test_support::RedisTestServer* redis_server(std::string& error) {
  static test_support::RedisTestServer server;
  static const std::string start_error = server.start();
  error = start_error;
  return start_error.empty() ? &server : nullptr;
}

std::unique_ptr<StorageBackend> make_backend(const std::string& kind, const std::string& ns,
                                             std::string& error) {
  StorageConfig config;
  config.backend = kind;
  config.name_space = ns;
  if (kind == "file") {
    config.dir = temp_dir().path;
  } else {
    const auto* server = redis_server(error);
    if (server == nullptr) return nullptr;
    config.port = server->port();
    config.timeout_ms = 5000;
  }
  auto backend = make_storage_backend(config);
  if (!backend) {
    error = backend.error().message;
    return nullptr;
  }
  return std::move(*backend);
}

void BM_Memcpy(benchmark::State& state) {
  Pages& p = pages();
  for (auto _ : state) {
    for (size_t i = 0; i < kPagesPerBatch; ++i) {
      std::memcpy(p.dst[i].data(), p.src[i].data(), page_bytes());
    }
    benchmark::DoNotOptimize(p.dst.back().data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * batch_bytes());
}

// Writes a batch of 64 new pages per iteration; the pages are removed outside the timed
// region so the store does not grow.
void write_bench(benchmark::State& state, const std::string& kind) {
  std::string error;
  auto backend = make_backend(kind, "write-" + kind, error);
  if (!backend) {
    state.SkipWithError(error.c_str());
    return;
  }
  Pages& p = pages();
  uint64_t next_key = 1;
  for (auto _ : state) {
    const std::vector<uint64_t> keys = batch_keys(next_key);
    next_key += kPagesPerBatch;
    if (!all_ok(backend->set(keys, p.src_views))) {
      state.SkipWithError("set failed");
      break;
    }
    state.PauseTiming();
    if (kind == "file") {
      std::error_code ec;
      std::filesystem::remove_all(temp_dir().path + "/write-file", ec);
      std::filesystem::create_directory(temp_dir().path + "/write-file", ec);
    } else {
      std::string ignored;
      test_support::redis_command(redis_server(ignored)->port(), {"FLUSHDB"});
    }
    state.ResumeTiming();
  }
  if (backend->stats().set_written != state.iterations() * kPagesPerBatch) {
    state.SkipWithError("not every page was written");
  }
  state.SetBytesProcessed(state.iterations() * batch_bytes());
}

// Reads the same stored batch of 64 pages per iteration, each verified by its checksum.
void read_bench(benchmark::State& state, const std::string& kind) {
  std::string error;
  auto backend = make_backend(kind, "read-" + kind, error);
  if (!backend) {
    state.SkipWithError(error.c_str());
    return;
  }
  Pages& p = pages();
  const std::vector<uint64_t> keys = batch_keys(1'000'000);
  if (!all_ok(backend->set(keys, p.src_views))) {
    state.SkipWithError("set failed");
    return;
  }
  for (auto _ : state) {
    if (!all_ok(backend->get(keys, p.dst_views))) {
      state.SkipWithError("get failed");
      break;
    }
  }
  state.SetBytesProcessed(state.iterations() * batch_bytes());
}

// One exists() round trip for a batch of 64 keys (what a prefetch decision costs).
void exists_bench(benchmark::State& state, const std::string& kind) {
  std::string error;
  auto backend = make_backend(kind, "exists-" + kind, error);
  if (!backend) {
    state.SkipWithError(error.c_str());
    return;
  }
  const std::vector<uint64_t> keys = batch_keys(2'000'000);
  for (auto _ : state) benchmark::DoNotOptimize(backend->exists(keys));
  state.SetItemsProcessed(state.iterations() * int64_t{kPagesPerBatch});
}

BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(write_bench, file, std::string("file"))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(read_bench, file, std::string("file"))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(exists_bench, file, std::string("file"))
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(write_bench, redis, std::string("redis"))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(read_bench, redis, std::string("redis"))
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(exists_bench, redis, std::string("redis"))
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
}  // namespace strata

BENCHMARK_MAIN();
