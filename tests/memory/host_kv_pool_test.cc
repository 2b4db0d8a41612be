#include "memory/host_kv_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "memory/kv_dtype.h"
#include "memory/kv_pool.h"
#include "memory_test_util.h"

namespace strata {
namespace {

Bytes random_bytes(size_t n, std::mt19937& gen) {
  Bytes out(n);
  for (std::byte& b : out) b = static_cast<std::byte>(gen() & 0xff);
  return out;
}

// Random bytes into every block of every page: moves are raw, so any bit pattern must
// come back unchanged.
void fill_random(KvPool& pool, std::mt19937& gen) {
  for (int32_t p = 0; p < pool.num_pages(); ++p) {
    pool.copy_page_in(make_page_id(p), random_bytes(pool.page_bytes(), gen));
  }
}

std::vector<PageId> shuffled_pages(int32_t n, std::mt19937& gen) {
  std::vector<PageId> pages(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) pages[static_cast<size_t>(i)] = make_page_id(i);
  std::shuffle(pages.begin(), pages.end(), gen);
  return pages;
}

struct Case {
  HostLayout layout;
  KvDtype dtype;
  int32_t page_size;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << host_layout_name(c.layout) << " " << kv_dtype_name(c.dtype) << " page " << c.page_size;
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  return std::string(host_layout_name(info.param.layout)) + "_" +
         std::string(kv_dtype_name(info.param.dtype)) + "_page" +
         std::to_string(info.param.page_size);
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (HostLayout layout :
       {HostLayout::kLayerFirst, HostLayout::kPageFirst, HostLayout::kPageFirstDirect}) {
    for (KvDtype dtype :
         {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16, KvDtype::kInt8, KvDtype::kFp8E4M3}) {
      for (int32_t page_size : {1, 16, 32}) out.push_back({layout, dtype, page_size});
    }
  }
  return out;
}

constexpr int32_t kDevicePages = 12;
constexpr int32_t kHostPages = 10;
constexpr int32_t kMoved = 5;

class HostKvPoolLayoutTest : public testing::TestWithParam<Case> {
 protected:
  KvPoolShape shape(int32_t num_pages) const {
    return KvPoolShape{3, 2, 8, num_pages, GetParam().page_size, GetParam().dtype};
  }
  std::unique_ptr<HostKvPool> make_host() const {
    auto host = HostKvPool::create(shape(kHostPages), GetParam().layout);
    EXPECT_TRUE(host.has_value()) << host.error().message;
    return std::move(*host);
  }

  std::mt19937 gen_{static_cast<uint32_t>(GetParam().page_size * 31 +
                                          static_cast<int>(GetParam().dtype) * 7 +
                                          static_cast<int>(GetParam().layout))};
};

TEST_P(HostKvPoolLayoutTest, SizesMatchTheDevicePool) {
  KvPool device(shape(kDevicePages));
  auto host = make_host();
  EXPECT_EQ(host->page_bytes(), device.page_bytes());
  EXPECT_EQ(host->total_bytes(), device.page_bytes() * kHostPages);
  EXPECT_EQ(host->num_pages(), kHostPages);
  EXPECT_EQ(host->layout(), GetParam().layout);
  if (GetParam().dtype == KvDtype::kBF16 && GetParam().page_size % 16 == 0) {
    EXPECT_TRUE(device.paired_bf16());  // the paired layout is covered
  }
  // A fresh pool is zeroed.
  EXPECT_EQ(host_page(*host, make_page_id(kHostPages - 1)), Bytes(host->page_bytes()));
}

TEST_P(HostKvPoolLayoutTest, DeviceToHostAndBackIsByteIdentical) {
  KvPool device(shape(kDevicePages));
  fill_random(device, gen_);
  auto host = make_host();
  const std::vector<PageId> dev = shuffled_pages(kDevicePages, gen_);
  const std::vector<PageId> hst = shuffled_pages(kHostPages, gen_);
  const std::span<const PageId> sources(dev.data(), kMoved);
  const std::span<const PageId> targets(dev.data() + kMoved, kMoved);
  const std::span<const PageId> host_pages(hst.data(), kMoved);
  std::vector<Bytes> before;
  for (int32_t p = 0; p < kDevicePages; ++p) before.push_back(device_page(device, make_page_id(p)));

  host->copy_from_device(device, sources, host_pages);
  for (size_t i = 0; i < kMoved; ++i) {
    ASSERT_EQ(host_page(*host, host_pages[i]), before[page_index(sources[i])]) << i;
  }
  for (size_t i = kMoved; i < hst.size(); ++i) {  // host pages not named stay zero
    ASSERT_EQ(host_page(*host, hst[i]), Bytes(host->page_bytes())) << i;
  }

  host->copy_to_device(host_pages, device, targets);
  std::vector<Bytes> expected = before;
  for (size_t i = 0; i < kMoved; ++i) {
    expected[page_index(targets[i])] = before[page_index(sources[i])];
  }
  for (int32_t p = 0; p < kDevicePages; ++p) {
    ASSERT_EQ(device_page(device, make_page_id(p)), expected[p]) << "device page " << p;
  }
}

TEST_P(HostKvPoolLayoutTest, TokensWrittenOnTheDeviceReadBackAfterARoundTrip) {
  KvPool device(shape(kDevicePages));
  auto host = make_host();
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  const size_t row = static_cast<size_t>(device.num_kv_heads()) * device.head_dim();
  std::vector<float> k(row), v(row);
  std::vector<std::vector<float>> written;
  for (int32_t layer = 0; layer < device.num_layers(); ++layer) {
    for (int32_t slot = 0; slot < device.page_size(); ++slot) {
      for (float& x : k) x = dist(gen_);
      for (float& x : v) x = dist(gen_);
      device.write_token(layer, make_page_id(2), slot, k.data(), v.data());
      device.read_token(layer, make_page_id(2), slot, k.data(), v.data());  // as stored
      written.push_back(k);
      written.push_back(v);
    }
  }
  const PageId from[] = {make_page_id(2)};
  const PageId via[] = {make_page_id(7)};
  const PageId to[] = {make_page_id(9)};
  host->copy_from_device(device, from, via);
  host->copy_to_device(via, device, to);
  size_t i = 0;
  for (int32_t layer = 0; layer < device.num_layers(); ++layer) {
    for (int32_t slot = 0; slot < device.page_size(); ++slot) {
      device.read_token(layer, make_page_id(9), slot, k.data(), v.data());
      ASSERT_EQ(k, written[i++]) << "layer " << layer << " slot " << slot;
      ASSERT_EQ(v, written[i++]) << "layer " << layer << " slot " << slot;
    }
  }
}

TEST_P(HostKvPoolLayoutTest, LayerCopiesOfAllLayersEqualTheWholeCopy) {
  KvPool source(shape(kDevicePages));
  fill_random(source, gen_);
  auto host = make_host();
  const std::vector<PageId> dev = shuffled_pages(kDevicePages, gen_);
  const std::vector<PageId> hst = shuffled_pages(kHostPages, gen_);
  const std::span<const PageId> device_pages(dev.data(), kMoved);
  const std::span<const PageId> host_pages(hst.data(), kMoved);
  host->copy_from_device(source, device_pages, host_pages);

  KvPool whole(shape(kDevicePages));
  KvPool by_layer(shape(kDevicePages));
  host->copy_to_device(host_pages, whole, device_pages);
  for (int32_t layer = 0; layer < source.num_layers(); ++layer) {
    host->copy_layer_to_device(layer, host_pages, by_layer, device_pages);
    // Only layers [0, layer] have arrived so far.
    for (PageId page : device_pages) {
      Bytes got(by_layer.layer_page_bytes()), want(by_layer.layer_page_bytes());
      for (int32_t l = 0; l < source.num_layers(); ++l) {
        by_layer.copy_layer_page_out(l, page, got);
        if (l <= layer) {
          source.copy_layer_page_out(l, page, want);
        } else {
          std::fill(want.begin(), want.end(), std::byte{0});
        }
        ASSERT_EQ(got, want) << "after layer " << layer << ", layer " << l;
      }
    }
  }
  for (int32_t p = 0; p < kDevicePages; ++p) {
    ASSERT_EQ(device_page(by_layer, make_page_id(p)), device_page(whole, make_page_id(p)));
  }
}

TEST_P(HostKvPoolLayoutTest, ReadPageGivesTheDevicePageBuffer) {
  KvPool device(shape(kDevicePages));
  fill_random(device, gen_);
  auto host = make_host();
  const std::vector<PageId> dev = shuffled_pages(kDevicePages, gen_);
  const std::vector<PageId> hst = shuffled_pages(kHostPages, gen_);
  host->copy_from_device(device, std::span(dev.data(), kHostPages), hst);
  for (int32_t i = 0; i < kHostPages; ++i) {
    ASSERT_EQ(host_page(*host, hst[i]), device_page(device, dev[i])) << i;
  }
}

TEST_P(HostKvPoolLayoutTest, WritePageThenCopyToDeviceRestoresIt) {
  KvPool device(shape(kDevicePages));
  auto host = make_host();
  const Bytes page = random_bytes(host->page_bytes(), gen_);
  const Bytes other = random_bytes(host->page_bytes(), gen_);
  host->write_page(make_page_id(4), page);
  host->write_page(make_page_id(5), other);
  EXPECT_EQ(host_page(*host, make_page_id(4)), page);
  EXPECT_EQ(host_page(*host, make_page_id(5)), other);
  const PageId from[] = {make_page_id(4), make_page_id(5)};
  const PageId to[] = {make_page_id(11), make_page_id(0)};
  host->copy_to_device(from, device, to);
  EXPECT_EQ(device_page(device, make_page_id(11)), page);
  EXPECT_EQ(device_page(device, make_page_id(0)), other);
  EXPECT_EQ(device_page(device, make_page_id(1)), Bytes(device.page_bytes()));
}

TEST_P(HostKvPoolLayoutTest, PageViewIsTheCanonicalBufferOnlyForPageFirstDirect) {
  KvPool device(shape(kDevicePages));
  fill_random(device, gen_);
  auto host = make_host();
  const PageId from[] = {make_page_id(3)};
  const PageId to[] = {make_page_id(6)};
  host->copy_from_device(device, from, to);
  const HostKvPool& const_host = *host;
  if (GetParam().layout != HostLayout::kPageFirstDirect) {
    EXPECT_TRUE(host->page_view(make_page_id(6)).empty());
    EXPECT_TRUE(const_host.page_view(make_page_id(6)).empty());
    return;
  }
  const std::span<const std::byte> view = const_host.page_view(make_page_id(6));
  ASSERT_EQ(view.size(), host->page_bytes());
  EXPECT_EQ(Bytes(view.begin(), view.end()), host_page(*host, make_page_id(6)));
  EXPECT_EQ(Bytes(view.begin(), view.end()), device_page(device, make_page_id(3)));
  // Writing through the view is writing the page (zero-copy loads from storage).
  const Bytes page = random_bytes(host->page_bytes(), gen_);
  const std::span<std::byte> writable = host->page_view(make_page_id(1));
  std::memcpy(writable.data(), page.data(), page.size());
  EXPECT_EQ(host_page(*host, make_page_id(1)), page);
}

INSTANTIATE_TEST_SUITE_P(AllLayouts, HostKvPoolLayoutTest, testing::ValuesIn(all_cases()),
                         case_name);

TEST(HostKvPoolTest, OddHeadDimBf16UsesTheUnpairedLayoutAndRoundTrips) {
  const KvPoolShape shape{2, 3, 5, 4, 16, KvDtype::kBF16};
  KvPool device(shape);
  ASSERT_FALSE(device.paired_bf16());
  std::mt19937 gen(5);
  fill_random(device, gen);
  for (HostLayout layout :
       {HostLayout::kLayerFirst, HostLayout::kPageFirst, HostLayout::kPageFirstDirect}) {
    auto host = HostKvPool::create(shape, layout);
    ASSERT_TRUE(host.has_value());
    const PageId dev[] = {make_page_id(0), make_page_id(3)};
    const PageId hst[] = {make_page_id(2), make_page_id(1)};
    (*host)->copy_from_device(device, dev, hst);
    EXPECT_EQ(host_page(**host, hst[0]), device_page(device, dev[0]));
    EXPECT_EQ(host_page(**host, hst[1]), device_page(device, dev[1]));
  }
}

TEST(HostKvPoolTest, LayoutNamesRoundTrip) {
  for (HostLayout layout :
       {HostLayout::kLayerFirst, HostLayout::kPageFirst, HostLayout::kPageFirstDirect}) {
    auto parsed = parse_host_layout(host_layout_name(layout));
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(*parsed, layout);
  }
  EXPECT_EQ(host_layout_name(HostLayout::kPageFirstDirect), "page_first_direct");
  auto bad = parse_host_layout("page-first");
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.error().message.find("page-first"), std::string::npos);
}

TEST(HostKvPoolTest, CreateRejectsBadShapesAndUnobtainableMemory) {
  auto bad =
      HostKvPool::create(KvPoolShape{2, 0, 8, 4, 16, KvDtype::kF16}, HostLayout::kLayerFirst);
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code, ErrorCode::kInvalidArgument);

  const int32_t max = std::numeric_limits<int32_t>::max();
  auto overflow = HostKvPool::create(KvPoolShape{max, max, max, max, max, KvDtype::kF32},
                                     HostLayout::kPageFirst);
  ASSERT_FALSE(overflow.has_value());
  EXPECT_EQ(overflow.error().code, ErrorCode::kInvalidArgument);

  // 2^59 bytes: the size fits in size_t but no machine has the address space.
  auto huge = HostKvPool::create(KvPoolShape{1024, 64, 64, 1 << 30, 16, KvDtype::kF32},
                                 HostLayout::kPageFirstDirect);
  ASSERT_FALSE(huge.has_value());
  EXPECT_EQ(huge.error().code, ErrorCode::kResourceExhausted);
}

TEST(HostKvPoolDeathTest, MismatchedListsAndInvalidPagesAreCallerBugs) {
  const KvPoolShape shape{1, 1, 4, 4, 2, KvDtype::kF32};
  KvPool device(shape);
  auto host = HostKvPool::create(shape, HostLayout::kLayerFirst);
  ASSERT_TRUE(host.has_value());
  const PageId two[] = {make_page_id(0), make_page_id(1)};
  const PageId one[] = {make_page_id(0)};
  const PageId outside[] = {make_page_id(4)};
  EXPECT_DEATH((*host)->copy_from_device(device, two, one), "different lengths");
  EXPECT_DEATH((*host)->copy_to_device(outside, device, one), "outside");
  KvPool other(KvPoolShape{1, 1, 4, 4, 4, KvDtype::kF32});
  EXPECT_DEATH((*host)->copy_to_device(one, other, one), "different page shapes");
}

}  // namespace
}  // namespace strata
