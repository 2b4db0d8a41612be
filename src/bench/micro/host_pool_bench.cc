// Micro-benchmarks of the host KV pool's copies, per host layout, next to plain memcpy of
// the same number of bytes in the same run:
//   - restore (host -> device, copy_to_device and layer by layer), the latency on a hit in
//     the host tier; the target is >= 80 % of memcpy for layer_first and page_first_direct;
//   - offload (device -> host, copy_from_device), the write-back cost;
//   - the stream transfer engine (a GPU's, memory/stream_transfer_engine.h) over a device
//     that copies each span with memcpy when it is enqueued: its spans against memcpy, and
//     over a device that copies nothing: its own cost (building and merging the spans,
//     events, polling) per batch of 256 pages.
// Shape: a Qwen3-8B-like page (28 layers, 8 KV heads, head_dim 128, page 16, BF16, paired
// layout): 1.75 MiB a page, 256 pages = 448 MiB a batch, far beyond the caches. Host
// pages are a fixed shuffle (as the radix tree hands them out); all memory is touched
// before timing.
// Run: build/src/bench/micro/bench_host_pool (STRATA_BENCH_KV_DTYPE=int8: 8-bit pages)
#include <benchmark/benchmark.h>

#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "memory/host_kv_pool.h"
#include "memory/kv_pool.h"
#include "memory/stream_transfer_engine.h"

namespace strata {
namespace {

constexpr int32_t kPages = 256;

// STRATA_BENCH_KV_DTYPE (default bf16) picks the pages' dtype: int8 or fp8_e4m3 pages are
// 0.51x the bytes (issue 54).
KvPoolShape bench_shape() {
  KvDtype dtype = KvDtype::kBF16;
  if (const char* name = std::getenv("STRATA_BENCH_KV_DTYPE")) {
    auto parsed = parse_kv_dtype(name);
    if (!parsed) std::abort();
    dtype = *parsed;
  }
  return KvPoolShape{28, 8, 128, kPages, 16, dtype};
}

// A touched, huge-page advised buffer for the memcpy baseline, allocated like the pools.
class Buffer {
 public:
  explicit Buffer(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    madvise(p, bytes, MADV_HUGEPAGE);
    data_ = static_cast<std::byte*>(p);
    std::memset(data_, 0x5a, bytes);
  }
  ~Buffer() { munmap(data_, bytes_); }
  std::byte* data() { return data_; }

 private:
  size_t bytes_;
  std::byte* data_;
};

struct Fixture {
  std::unique_ptr<KvPool> device;
  std::vector<PageId> device_pages;
  std::vector<PageId> host_pages;
  std::map<HostLayout, std::unique_ptr<HostKvPool>> hosts;

  Fixture() {
    device = std::move(*KvPool::create(bench_shape()));
    std::mt19937 gen(11);
    std::vector<std::byte> page(device->page_bytes());
    for (int32_t p = 0; p < kPages; ++p) {
      for (std::byte& b : page) b = static_cast<std::byte>(gen() & 0xff);
      device->copy_page_in(make_page_id(p), page);
      device_pages.push_back(make_page_id(p));
      host_pages.push_back(make_page_id(p));
    }
    std::shuffle(host_pages.begin(), host_pages.end(), gen);
  }

  // The host pool of `layout`, holding a copy of every device page (made on first use).
  HostKvPool& host(HostLayout layout) {
    auto& slot = hosts[layout];
    if (!slot) {
      slot = std::move(*HostKvPool::create(bench_shape(), layout));
      slot->copy_from_device(*device, device_pages, host_pages);
    }
    return *slot;
  }

  size_t batch_bytes() const { return device->page_bytes() * kPages; }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

// Thread CPU time: the machine may be shared, and preemption is not bandwidth.
double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The memcpy baseline: two touched buffers of one batch.
struct Baseline {
  Buffer src{fixture().batch_bytes()};
  Buffer dst{fixture().batch_bytes()};
};

Baseline& baseline() {
  static Baseline b;
  return b;
}

void BM_Memcpy(benchmark::State& state) {
  const size_t bytes = fixture().batch_bytes();
  Baseline& b = baseline();
  for (auto _ : state) {
    std::memcpy(b.dst.data(), b.src.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

// memcpy in the pools' copy unit (one page's K or V in one layer, 32 KiB), which is what
// layer_first and page_first_direct do: shows what the chunking alone costs.
void BM_MemcpyBlocks(benchmark::State& state) {
  Fixture& f = fixture();
  const size_t bytes = f.batch_bytes();
  const size_t block = f.device->block_bytes();
  Baseline& b = baseline();
  for (auto _ : state) {
    for (size_t off = 0; off < bytes; off += block) {
      std::memcpy(b.dst.data() + off, b.src.data() + off, block);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

// Runs `copy` once per iteration, each time right after an untimed memcpy of the same
// number of bytes, and reports the pair's bandwidth ratio as `of_memcpy` (1.0 = memcpy
// speed): the two see the same machine state even when other work shares it.
template <typename Copy>
void run_against_memcpy(benchmark::State& state, Copy copy) {
  const size_t bytes = fixture().batch_bytes();
  Baseline& b = baseline();
  double memcpy_seconds = 0;
  double copy_seconds = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const double t0 = thread_cpu_seconds();
    std::memcpy(b.dst.data(), b.src.data(), bytes);
    benchmark::ClobberMemory();
    const double t1 = thread_cpu_seconds();
    state.ResumeTiming();
    copy();
    benchmark::ClobberMemory();
    copy_seconds += thread_cpu_seconds() - t1;
    memcpy_seconds += t1 - t0;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
  state.counters["of_memcpy"] = copy_seconds > 0 ? memcpy_seconds / copy_seconds : 0;
}

void BM_Restore(benchmark::State& state, HostLayout layout) {
  Fixture& f = fixture();
  HostKvPool& host = f.host(layout);
  run_against_memcpy(state, [&] { host.copy_to_device(f.host_pages, *f.device, f.device_pages); });
}

void BM_RestoreLayerByLayer(benchmark::State& state, HostLayout layout) {
  Fixture& f = fixture();
  HostKvPool& host = f.host(layout);
  run_against_memcpy(state, [&] {
    for (int32_t layer = 0; layer < f.device->num_layers(); ++layer) {
      host.copy_layer_to_device(layer, f.host_pages, *f.device, f.device_pages);
    }
  });
}

void BM_Offload(benchmark::State& state, HostLayout layout) {
  Fixture& f = fixture();
  HostKvPool& host = f.host(layout);
  run_against_memcpy(state,
                     [&] { host.copy_from_device(*f.device, f.device_pages, f.host_pages); });
}

// A copy device whose batches land when enqueued: each span copied with memcpy (or not at
// all), every event ready at once.
class InlineCopyDevice final : public CopyDevice {
 public:
  explicit InlineCopyDevice(bool copy) : copy_(copy) {}
  Result<CopyEvent> enqueue(CopyQueue, std::span<const CopySpan> spans) override {
    if (copy_) {
      for (const CopySpan& sp : spans) std::memcpy(sp.dst, sp.src, sp.bytes);
    }
    spans_ += spans.size();
    return next_++;
  }
  Result<bool> ready(CopyEvent) override { return true; }
  Result<bool> wait(CopyEvent, int64_t) override { return true; }
  Status queue_wait(CopyQueue, CopyEvent) override { return {}; }
  Status compute_wait(CopyEvent) override { return {}; }
  void release(CopyEvent) override {}
  uint64_t spans() const { return spans_; }

 private:
  bool copy_;
  CopyEvent next_ = 1;
  uint64_t spans_ = 0;
};

// One restore of the batch through the stream engine, submitted and polled to its outcome.
void stream_restore(StreamTransferEngine& engine, bool by_layer) {
  Fixture& f = fixture();
  const TransferTicket t = engine.submit(
      TransferJob{TransferDirection::kHostToDevice, f.device_pages, f.host_pages, by_layer});
  if (!engine.wait(t)) std::abort();
  benchmark::DoNotOptimize(engine.take_completed());
}

void BM_StreamRestore(benchmark::State& state, HostLayout layout) {
  Fixture& f = fixture();
  InlineCopyDevice device(/*copy=*/true);
  StreamTransferEngine engine(device, f.device->block_layout(), *f.host(layout).block_layout());
  run_against_memcpy(state, [&] { stream_restore(engine, state.range(0) != 0); });
  state.counters["spans_per_batch"] =
      static_cast<double>(device.spans()) / static_cast<double>(state.iterations());
}

void BM_StreamEngineOverhead(benchmark::State& state, HostLayout layout) {
  Fixture& f = fixture();
  InlineCopyDevice device(/*copy=*/false);
  StreamTransferEngine engine(device, f.device->block_layout(), *f.host(layout).block_layout());
  for (auto _ : state) stream_restore(engine, state.range(0) != 0);
  state.counters["spans_per_batch"] =
      static_cast<double>(device.spans()) / static_cast<double>(state.iterations());
  state.counters["ns_per_page"] = benchmark::Counter(
      static_cast<double>(kPages),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// A copy device whose events land only when told (land_all): copies stay in flight.
class HeldCopyDevice final : public CopyDevice {
 public:
  Result<CopyEvent> enqueue(CopyQueue, std::span<const CopySpan>) override { return next_++; }
  Result<bool> ready(CopyEvent e) override { return e < landed_below_; }
  Result<bool> wait(CopyEvent, int64_t) override { return true; }
  Status queue_wait(CopyQueue, CopyEvent) override {
    ++queue_waits_;
    return {};
  }
  Status compute_wait(CopyEvent) override { return {}; }
  void release(CopyEvent) override {}
  void land_all() { landed_below_ = next_; }
  uint64_t queue_waits() const { return queue_waits_; }

 private:
  CopyEvent next_ = 1;
  CopyEvent landed_below_ = 1;
  uint64_t queue_waits_ = 0;
};

// The cost of submitting a 16-page load while range(0) backups of 16 pages each are in
// flight, one of them sharing a page with the load (so it is ordered after that one): the
// conflict check of submit() (an index of the pages in flight, not a scan of every job).
void BM_StreamSubmitWithJobsInFlight(benchmark::State& state) {
  constexpr int32_t kJobPages = 16;
  const auto in_flight = static_cast<int32_t>(state.range(0));
  const int32_t pages = (in_flight + 2) * kJobPages;
  const KvPoolShape shape{4, 2, 64, pages, 16, KvDtype::kBF16};
  auto device_pool = KvPool::create(shape);
  auto host_pool = HostKvPool::create(shape, HostLayout::kLayerFirst);
  if (!device_pool || !host_pool) std::abort();
  HeldCopyDevice device;
  StreamTransferEngine engine(device, (*device_pool)->block_layout(),
                              *(*host_pool)->block_layout());
  auto run = [&](int32_t first) {
    std::vector<PageId> p;
    for (int32_t i = 0; i < kJobPages; ++i) p.push_back(make_page_id(first + i));
    return p;
  };
  for (int32_t j = 0; j < in_flight; ++j) {
    (void)engine.submit(TransferJob{TransferDirection::kDeviceToHost, run(j * kJobPages),
                                    run(j * kJobPages), false});
  }
  // The load's device pages are fresh; its host pages overlap the last backup's by one.
  const int32_t fresh = in_flight * kJobPages;
  std::vector<PageId> host = run(fresh + kJobPages);
  if (in_flight > 0) host.back() = make_page_id(fresh - 1);
  const uint64_t waits_before = device.queue_waits();
  uint64_t submits = 0;
  for (auto _ : state) {
    const TransferTicket t =
        engine.submit(TransferJob{TransferDirection::kHostToDevice, run(fresh), host, false});
    state.PauseTiming();
    ++submits;
    // Land only this load (the backups stay in flight): its event is the newest.
    device.land_all();
    if (!engine.done(t)) std::abort();
    state.ResumeTiming();
  }
  state.counters["queue_waits_per_submit"] =
      static_cast<double>(device.queue_waits() - waits_before) / static_cast<double>(submits);
  state.counters["in_flight"] = static_cast<double>(engine.in_flight());
}

BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_MemcpyBlocks)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Restore, layer_first, HostLayout::kLayerFirst)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Restore, page_first, HostLayout::kPageFirst)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Restore, page_first_direct, HostLayout::kPageFirstDirect)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_RestoreLayerByLayer, layer_first, HostLayout::kLayerFirst)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_RestoreLayerByLayer, page_first, HostLayout::kPageFirst)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_RestoreLayerByLayer, page_first_direct, HostLayout::kPageFirstDirect)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Offload, layer_first, HostLayout::kLayerFirst)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Offload, page_first, HostLayout::kPageFirst)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Offload, page_first_direct, HostLayout::kPageFirstDirect)
    ->Unit(benchmark::kMillisecond);

// Arg 0: the whole batch at once; 1: layer by layer (one batch and event per layer).
BENCHMARK_CAPTURE(BM_StreamRestore, layer_first, HostLayout::kLayerFirst)
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_StreamRestore, page_first_direct, HostLayout::kPageFirstDirect)
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_StreamEngineOverhead, layer_first, HostLayout::kLayerFirst)
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_StreamEngineOverhead, page_first_direct, HostLayout::kPageFirstDirect)
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_StreamSubmitWithJobsInFlight)->Arg(0)->Arg(16)->Arg(256)->Arg(1024);

}  // namespace
}  // namespace strata

BENCHMARK_MAIN();
