// Micro-benchmark of the KV transfer data plane (src/kvtransfer): moving N pages from a
// prefill pool into a decode pool in another process over UCX, next to memcpy of the same
// page runs inside one process (the target: UCX at >= 0.5x memcpy).
//
// Shape: a Qwen3-0.6B-like page (28 layers, 8 KV heads, head_dim 128, page 16, BF16):
// 32 KiB per layer and K/V, 1.75 MiB a page, 56 runs for contiguous pages. Page sets of
// 1, 16 and 256 pages, contiguous (one run per layer and K/V) or scattered (a fixed
// shuffle: one run per page, layer and K/V).
//
// The decode side is a child process (fork before any thread) with one UcxTransport and
// two target regions of the pool's size: its KvPool registered as it is ("registered"),
// and memory from UcxTransport::allocate_region ("allocated": a shared-memory segment when
// UCX_TLS has sm). The parent sends with two transports, one per data path: eager active
// messages ("messages", the default) and one-sided puts ("put").
//
// The storage fallback (StoragePageTransport) runs in this process: a send of N pages to
// the store and their receive into the other pool, through the file backend (a temporary
// directory) and a private redis-server; bytes_per_second counts the pages once.
//
// UCX_TLS picks the transports, as in the server:
//   UCX_TLS=tcp build/src/bench/micro/bench_kv_transfer
//   UCX_TLS=sm  build/src/bench/micro/bench_kv_transfer
// STRATA_KV_BENCH_CHUNK_BYTES overrides UcxTransportOptions::message_chunk_bytes.
// GB/s is bytes_per_second; every buffer is touched before timing.
#include <benchmark/benchmark.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvtransfer/page_runs.h"
#include "kvtransfer/storage_page_transport.h"
#include "kvtransfer/ucx_transport.h"
#include "memory/kv_pool.h"
#include "storage/storage_backend.h"
#include "testing/redis_test_server.h"

namespace strata {
namespace {

constexpr int32_t kPoolPages = 320;

KvPoolShape bench_shape() {
  return KvPoolShape{28, 8, 128, kPoolPages, 16, KvDtype::kBF16};
}

void touch(KvPool& pool, int value) {
  std::memset(kv_pool_base(pool), value, pool.total_bytes());
}

// ---- pipe framing between the two processes ----

bool write_all(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, b, n);
    if (w <= 0) return false;
    b += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, void* p, size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, b, n);
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool send_blob(int fd, const std::vector<std::byte>& blob) {
  const uint64_t n = blob.size();
  return write_all(fd, &n, sizeof n) && write_all(fd, blob.data(), blob.size());
}

bool receive_blob(int fd, std::vector<std::byte>& blob) {
  uint64_t n = 0;
  if (!read_all(fd, &n, sizeof n) || n > (uint64_t{1} << 24)) return false;
  blob.resize(n);
  return read_all(fd, blob.data(), n);
}

// The decode process: sends its address and two region descriptors, then serves until
// the parent closes the pipe.
[[noreturn]] void run_decode(int to_parent, int from_parent) {
  auto ucx = UcxTransport::create();
  if (!ucx) {
    std::fprintf(stderr, "decode: %s\n", ucx.error().message.c_str());
    ::_exit(1);
  }
  KvPool pool(bench_shape());
  touch(pool, 0x11);
  auto registered = (*ucx)->register_region(kv_pool_base(pool), pool.total_bytes());
  auto allocated = (*ucx)->allocate_region(pool.total_bytes());
  if (!registered || !allocated) {
    std::fprintf(stderr, "decode: cannot register its regions\n");
    ::_exit(1);
  }
  if (!send_blob(to_parent, (*ucx)->address()) ||
      !send_blob(to_parent, *(*ucx)->region_descriptor(*registered)) ||
      !send_blob(to_parent, *(*ucx)->region_descriptor(*allocated))) {
    ::_exit(1);
  }
  char byte;
  while (::read(from_parent, &byte, 1) > 0) {
  }
  ucx->reset();
  ::_exit(0);
}

// ---- the prefill side ----

struct Sender {
  std::unique_ptr<UcxTransport> ucx;
  UcxRegionId local{};
  UcxPeerId peer{};
  UcxRemoteRegionId registered{}, allocated{};
};

struct Fixture {
  std::unique_ptr<KvPool> src;
  std::unique_ptr<KvPool> local_dst;  // memcpy baseline's destination
  std::vector<PageId> shuffled_src, shuffled_dst;
  Sender messages, put;
};

Fixture* g_fixture = nullptr;

bool make_sender(Sender& sender, UcxDataPath path, KvPool& src,
                 const std::vector<std::byte>& address, const std::vector<std::byte>& registered,
                 const std::vector<std::byte>& allocated) {
  UcxTransportOptions options;
  options.data_path = path;
  if (const char* chunk = std::getenv("STRATA_KV_BENCH_CHUNK_BYTES"); chunk != nullptr) {
    options.message_chunk_bytes = std::strtoll(chunk, nullptr, 10);
  }
  auto ucx = UcxTransport::create(options);
  if (!ucx) {
    std::fprintf(stderr, "prefill: %s\n", ucx.error().message.c_str());
    return false;
  }
  sender.ucx = std::move(*ucx);
  auto local = sender.ucx->register_region(kv_pool_base(src), src.total_bytes());
  auto peer = sender.ucx->connect(address);
  if (!local || !peer) return false;
  sender.local = *local;
  sender.peer = *peer;
  auto r = sender.ucx->import_region(*peer, registered);
  auto a = sender.ucx->import_region(*peer, allocated);
  if (!r || !a) {
    std::fprintf(stderr, "prefill: %s\n", (!r ? r.error() : a.error()).message.c_str());
    return false;
  }
  sender.registered = *r;
  sender.allocated = *a;
  return true;
}

std::vector<PageRun> runs_for(int64_t pages, bool scattered) {
  const Fixture& f = *g_fixture;
  std::vector<PageId> src, dst;
  for (int32_t i = 0; i < pages; ++i) {
    src.push_back(scattered ? f.shuffled_src[i] : make_page_id(i));
    dst.push_back(scattered ? f.shuffled_dst[i] : make_page_id(i + 32));
  }
  return *plan_page_runs(bench_shape(), bench_shape(), src, dst);
}

void BM_Memcpy(benchmark::State& state) {
  const auto runs = runs_for(state.range(0), state.range(1) != 0);
  const std::byte* src = kv_pool_base(*g_fixture->src);
  std::byte* dst = kv_pool_base(*g_fixture->local_dst);
  for (auto _ : state) {
    copy_page_runs(src, dst, runs);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(page_runs_bytes(runs)));
  state.counters["runs"] = static_cast<double>(runs.size());
}

void BM_Ucx(benchmark::State& state, Sender* sender, bool allocated) {
  const auto runs = runs_for(state.range(0), state.range(1) != 0);
  const UcxRemoteRegionId remote = allocated ? sender->allocated : sender->registered;
  for (auto _ : state) {
    std::promise<Status> promise;
    auto future = promise.get_future();
    auto s = sender->ucx->put_runs(sender->peer, remote, sender->local, runs, 60'000,
                                   [&promise](Status st) { promise.set_value(std::move(st)); });
    Status result = s ? future.get() : s;
    if (!result) {
      state.SkipWithError(result.error().message.c_str());
      break;
    }
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(page_runs_bytes(runs)));
  state.counters["runs"] = static_cast<double>(runs.size());
}

// Send then receive of N pages through a store. Room ids are fresh per iteration: a store
// never rewrites a key it has.
void BM_Storage(benchmark::State& state, StorageBackend* backend) {
  Fixture& f = *g_fixture;
  auto sender = StoragePageTransport::create(*backend, *f.src);
  auto receiver = StoragePageTransport::create(*backend, *f.local_dst);
  auto dest = (*sender)->open_destination((*receiver)->pool_descriptor());
  if (!dest) {
    state.SkipWithError(dest.error().message.c_str());
    return;
  }
  PageBatch batch;
  for (int32_t i = 0; i < state.range(0); ++i) {
    batch.src_pages.push_back(make_page_id(i));
    batch.dst_pages.push_back(make_page_id(i + 32));
  }
  std::mt19937_64 rooms(state.range(0));
  auto run = [](const std::function<Status(TransferDone)>& start) {
    std::promise<Status> promise;
    auto future = promise.get_future();
    Status s = start([&promise](Status st) { promise.set_value(std::move(st)); });
    return s ? future.get() : s;
  };
  for (auto _ : state) {
    batch.room_id = rooms();
    Status s = run([&](TransferDone done) { return (*sender)->send(*dest, batch, 600'000, done); });
    if (s) s = run([&](TransferDone done) { return (*receiver)->receive(batch, 600'000, done); });
    if (!s) {
      state.SkipWithError(s.error().message.c_str());
      break;
    }
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) *
                          static_cast<int64_t>(f.src->page_bytes()));
}

void page_args(benchmark::internal::Benchmark* b) {
  for (int64_t pages : {1, 16, 256}) {
    for (int64_t scattered : {0, 1}) b->Args({pages, scattered});
  }
  b->ArgNames({"pages", "scattered"});
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  using namespace strata;
  int to_parent[2], from_parent[2];
  if (::pipe(to_parent) != 0 || ::pipe(from_parent) != 0) return 1;
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child < 0) return 1;
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    ::close(to_parent[0]);
    ::close(from_parent[1]);
    run_decode(to_parent[1], from_parent[0]);
  }
  ::close(to_parent[1]);
  ::close(from_parent[0]);
  std::vector<std::byte> address, registered, allocated;
  if (!receive_blob(to_parent[0], address) || !receive_blob(to_parent[0], registered) ||
      !receive_blob(to_parent[0], allocated)) {
    std::fprintf(stderr, "the decode process did not start\n");
    return 1;
  }

  Fixture fixture;
  fixture.src = std::make_unique<KvPool>(bench_shape());
  fixture.local_dst = std::make_unique<KvPool>(bench_shape());
  std::mt19937 gen(7);
  for (auto* pool : {fixture.src.get(), fixture.local_dst.get()}) {
    touch(*pool, static_cast<int>(gen() & 0xff));
  }
  for (int32_t i = 0; i < kPoolPages; ++i) {
    fixture.shuffled_src.push_back(make_page_id(i));
    fixture.shuffled_dst.push_back(make_page_id(i));
  }
  std::shuffle(fixture.shuffled_src.begin(), fixture.shuffled_src.end(), gen);
  std::shuffle(fixture.shuffled_dst.begin(), fixture.shuffled_dst.end(), gen);
  g_fixture = &fixture;
  if (!make_sender(fixture.messages, UcxDataPath::kMessages, *fixture.src, address, registered,
                   allocated) ||
      !make_sender(fixture.put, UcxDataPath::kPut, *fixture.src, address, registered, allocated)) {
    return 1;
  }

  const char* tls = std::getenv("UCX_TLS");
  benchmark::AddCustomContext("UCX_TLS", tls != nullptr ? tls : "(UCX default)");
  benchmark::AddCustomContext("page_bytes", std::to_string(fixture.src->page_bytes()));
  benchmark::RegisterBenchmark("memcpy", BM_Memcpy)->Apply(page_args)->UseRealTime();
  for (auto [name, sender, alloc] :
       {std::tuple{"ucx_messages/registered", &fixture.messages, false},
        std::tuple{"ucx_messages/allocated", &fixture.messages, true},
        std::tuple{"ucx_put/registered", &fixture.put, false},
        std::tuple{"ucx_put/allocated", &fixture.put, true}}) {
    benchmark::RegisterBenchmark(name, BM_Ucx, sender, alloc)->Apply(page_args)->UseRealTime();
  }
  // The storage fallback: a file store (capped, so old rooms roll off) and a Redis one.
  char dir[] = "/tmp/strata-kv-transfer-bench-XXXXXX";
  if (::mkdtemp(dir) == nullptr) return 1;
  StorageConfig file_config;
  file_config.backend = "file";
  file_config.name_space = "kvxfer-bench";
  file_config.dir = dir;
  file_config.capacity_bytes = int64_t{2} << 30;
  auto file_store = make_storage_backend(file_config);
  test_support::RedisTestServer redis;
  const std::string redis_error =
      redis.start(0, {"--maxmemory", "2gb", "--maxmemory-policy", "allkeys-lru"});
  std::unique_ptr<StorageBackend> redis_store;
  if (redis_error.empty()) {
    StorageConfig redis_config;
    redis_config.backend = "redis";
    redis_config.name_space = "kvxfer-bench";
    redis_config.port = redis.port();
    redis_config.timeout_ms = 30'000;
    if (auto r = make_storage_backend(redis_config)) redis_store = std::move(*r);
  } else {
    std::fprintf(stderr, "no redis-server for the storage benchmark: %s\n", redis_error.c_str());
  }
  if (file_store) {
    benchmark::RegisterBenchmark("storage/file", BM_Storage, file_store->get())
        ->Arg(1)
        ->Arg(16)
        ->Arg(256)
        ->ArgName("pages")
        ->UseRealTime();
  }
  if (redis_store) {
    benchmark::RegisterBenchmark("storage/redis", BM_Storage, redis_store.get())
        ->Arg(1)
        ->Arg(16)
        ->Arg(256)
        ->ArgName("pages")
        ->UseRealTime();
  }

  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  redis_store.reset();
  if (file_store) file_store->reset();
  redis.kill();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);

  fixture.messages.ucx.reset();
  fixture.put.ucx.reset();
  ::close(from_parent[1]);  // the decode process exits on EOF
  int status = 0;
  ::waitpid(child, &status, 0);
  return 0;
}
