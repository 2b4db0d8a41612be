// The KV tiers' copies on a GPU (cuda/cuda_copy_device.h driven by
// memory/stream_transfer_engine.h): bytes loaded into GPU memory and backed up again equal
// the originals, per I/O path (direct, kernel) and host layout (layer_first,
// page_first_direct), pages whole and layer by layer; and the bandwidth of each path against
// one cudaMemcpy of the same bytes from page-locked memory (printed: issue 31's target is
// >= 85 %; tests never assert times).
//
// The copy scheduling itself (queues, events, per-layer waits, failures) is tested without a
// GPU in tests/memory/stream_transfer_engine_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_copy_device.h"
#include "cuda/cuda_device.h"
#include "gpu_test_util.h"
#include "memory/host_kv_pool.h"
#include "memory/kv_pool.h"
#include "memory/stream_transfer_engine.h"

namespace strata::cuda {
namespace {

TEST(CudaCopyDeviceTest, PathNamesParse) {
  EXPECT_EQ(*parse_copy_path("direct"), CopyPath::kDirect);
  EXPECT_EQ(*parse_copy_path("kernel"), CopyPath::kKernel);
  const auto bad = parse_copy_path("dma");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("direct or kernel"), std::string::npos);
  EXPECT_EQ(copy_path_name(CopyPath::kKernel), "kernel");
}

// Creation succeeds exactly where a usable GPU is, and says why where none is.
TEST(CudaCopyDeviceTest, CreationFollowsTheProbe) {
  const auto probe = probe_device(0);
  const auto d = CudaCopyDevice::create(nullptr, CopyPath::kDirect);
  if (probe) {
    ASSERT_TRUE(d) << d.error().message;
    EXPECT_EQ((*d)->path(), CopyPath::kDirect);
  } else {
    ASSERT_FALSE(d);
    EXPECT_FALSE(d.error().message.empty());
    EXPECT_NE(d.error().code, ErrorCode::kInvalidArgument) << d.error().message;
  }
}

// The device pool: KvPool's arrangement (kv_pool.h) in GPU memory.
struct GpuPool {
  DeviceBuffer memory;
  KvBlockLayout layout;
};

GpuPool gpu_pool(const KvPoolShape& shape) {
  const KvPool like(KvPoolShape{shape.num_layers, shape.num_kv_heads, shape.head_dim, 1,
                                shape.page_size, shape.dtype});
  GpuPool out;
  const size_t block = like.layer_page_bytes() / 2;
  const size_t region = block * static_cast<size_t>(shape.num_pages);
  auto mem = DeviceBuffer::allocate(region * 2 * static_cast<size_t>(shape.num_layers));
  EXPECT_TRUE(mem) << mem.error().message;
  out.memory = std::move(*mem);
  out.layout = KvBlockLayout{
      out.memory.as<std::byte>(), shape.num_layers, shape.num_pages, block, region, block};
  return out;
}

struct CopyRig {
  std::unique_ptr<HostKvPool> host;
  HostRegistration registration;
  std::unique_ptr<CudaCopyDevice> device;
  Stream compute;
};

CopyRig make_rig(const KvPoolShape& host_shape, HostLayout layout, CopyPath path) {
  CopyRig s;
  auto host = HostKvPool::create(host_shape, layout);
  EXPECT_TRUE(host) << host.error().message;
  s.host = std::move(*host);
  auto reg = HostRegistration::register_memory(s.host->data(), s.host->total_bytes());
  EXPECT_TRUE(reg) << reg.error().message;
  s.registration = std::move(*reg);
  auto compute = Stream::create();
  EXPECT_TRUE(compute) << compute.error().message;
  s.compute = std::move(*compute);
  auto device = CudaCopyDevice::create(s.compute.handle(), path);
  EXPECT_TRUE(device) << device.error().message;
  s.device = std::move(*device);
  return s;
}

std::vector<std::byte> page_bytes(const HostKvPool& host, int32_t page) {
  std::vector<std::byte> out(host.page_bytes());
  host.read_page(make_page_id(page), out);
  return out;
}

class CudaCopyTest : public testing::TestWithParam<std::tuple<CopyPath, HostLayout>> {};

TEST_P(CudaCopyTest, PagesLoadedAndBackedUpAgainEqualTheOriginals) {
  STRATA_NEED_GPU();
  const auto [path, layout] = GetParam();
  const KvPoolShape device_shape{4, 8, 128, 64, 16, KvDtype::kBF16};
  KvPoolShape host_shape = device_shape;
  host_shape.num_pages = 256;
  CopyRig s = make_rig(host_shape, layout, path);
  GpuPool pool = gpu_pool(device_shape);
  ASSERT_TRUE(pool.memory.zero());
  std::mt19937 rng(5);
  std::vector<std::byte> buf(s.host->page_bytes());
  for (int32_t p = 0; p < 64; ++p) {
    for (std::byte& b : buf) b = static_cast<std::byte>(rng() & 0xff);
    s.host->write_page(make_page_id(p), buf);
  }
  StreamTransferEngine engine(*s.device, pool.layout, *s.host->block_layout());
  // Host pages 0..63 to shuffled device pages: the first half whole, the rest layer by layer.
  std::vector<int32_t> order(64);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  TransferJob whole{TransferDirection::kHostToDevice, {}, {}, false};
  TransferJob by_layer{TransferDirection::kHostToDevice, {}, {}, true};
  for (int32_t i = 0; i < 64; ++i) {
    TransferJob& j = i < 32 ? whole : by_layer;
    j.device_pages.push_back(make_page_id(order[static_cast<size_t>(i)]));
    j.host_pages.push_back(make_page_id(i));
  }
  const TransferTicket a = engine.submit(std::move(whole));
  const TransferTicket b = engine.submit(std::move(by_layer));
  for (int32_t l = 0; l < device_shape.num_layers; ++l) ASSERT_TRUE(engine.wait_layer(b, l));
  ASSERT_TRUE(engine.wait(a)) << "load";
  ASSERT_TRUE(engine.wait(b)) << "layer-by-layer load";
  // Back up every device page to host pages 100 + i; device page order[i] holds host page i.
  TransferJob up{TransferDirection::kDeviceToHost, {}, {}, false};
  for (int32_t i = 0; i < 64; ++i) {
    up.device_pages.push_back(make_page_id(order[static_cast<size_t>(i)]));
    up.host_pages.push_back(make_page_id(100 + i));
  }
  ASSERT_TRUE(engine.wait(engine.submit(std::move(up)))) << "backup";
  for (int32_t i = 0; i < 64; ++i) {
    ASSERT_EQ(page_bytes(*s.host, 100 + i), page_bytes(*s.host, i)) << "page " << i;
  }
  ASSERT_TRUE(s.compute.synchronize());
  const auto out = engine.take_completed();
  EXPECT_EQ(out.size(), 3u);
  for (const TransferOutcome& o : out) EXPECT_EQ(o.result, TransferResult::kLanded) << o.error;
}

// Bandwidth: `pages` pages host -> device and back, through the engine, against one
// cudaMemcpy of the same bytes between page-locked host memory and the device.
TEST_P(CudaCopyTest, BandwidthAgainstOneMemcpy) {
  STRATA_NEED_GPU();
  const auto [path, layout] = GetParam();
  // Qwen3-8B's KV page: 36 layers, 8 KV heads of 128, BF16, 16 tokens (2.25 MiB a page).
  const int32_t pages = smoke() ? 128 : 512;
  const KvPoolShape shape{36, 8, 128, pages, 16, KvDtype::kBF16};
  CopyRig s = make_rig(shape, layout, path);
  GpuPool pool = gpu_pool(shape);
  StreamTransferEngine engine(*s.device, pool.layout, *s.host->block_layout());
  const size_t bytes = s.host->total_bytes();

  auto time_s = [](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // Scattered pages (a prefix's pages are seldom adjacent in a used pool).
  std::vector<int32_t> order(static_cast<size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(3);
  std::shuffle(order.begin(), order.end(), rng);
  auto job = [&](TransferDirection d) {
    TransferJob j{d, {}, {}, d == TransferDirection::kHostToDevice};
    for (int32_t i = 0; i < pages; ++i) {
      j.device_pages.push_back(make_page_id(order[static_cast<size_t>(i)]));
      j.host_pages.push_back(make_page_id(i));
    }
    return j;
  };
  for (int warm = 0; warm < 2; ++warm) {
    ASSERT_TRUE(engine.wait(engine.submit(job(TransferDirection::kHostToDevice))));
  }
  const double load_s = time_s(
      [&] { ASSERT_TRUE(engine.wait(engine.submit(job(TransferDirection::kHostToDevice)))); });
  const double backup_s = time_s(
      [&] { ASSERT_TRUE(engine.wait(engine.submit(job(TransferDirection::kDeviceToHost)))); });
  const double h2d_s =
      time_s([&] { ASSERT_TRUE(pool.memory.copy_from_host(s.host->data(), bytes)); });
  const double d2h_s =
      time_s([&] { ASSERT_TRUE(pool.memory.copy_to_host(s.host->data(), bytes)); });
  const double gb = static_cast<double>(bytes) / 1e9;
  std::printf(
      "[copy bandwidth] %s, %s, %d pages of %.2f MiB: load %.1f GB/s (%.0f %% of cudaMemcpy's "
      "%.1f), backup %.1f GB/s (%.0f %% of %.1f); %llu spans in %llu batches\n",
      std::string(copy_path_name(path)).c_str(), std::string(host_layout_name(layout)).c_str(),
      pages, static_cast<double>(s.host->page_bytes()) / (1024.0 * 1024.0), gb / load_s,
      100.0 * h2d_s / load_s, gb / h2d_s, gb / backup_s, 100.0 * d2h_s / backup_s, gb / d2h_s,
      static_cast<unsigned long long>(engine.stats().spans),
      static_cast<unsigned long long>(engine.stats().batches));
}

INSTANTIATE_TEST_SUITE_P(PathsAndLayouts, CudaCopyTest,
                         testing::Combine(testing::Values(CopyPath::kDirect, CopyPath::kKernel),
                                          testing::Values(HostLayout::kLayerFirst,
                                                          HostLayout::kPageFirstDirect)),
                         [](const testing::TestParamInfo<std::tuple<CopyPath, HostLayout>>& info) {
                           return std::string(copy_path_name(std::get<0>(info.param))) + "_" +
                                  std::string(host_layout_name(std::get<1>(info.param)));
                         });

}  // namespace
}  // namespace strata::cuda
