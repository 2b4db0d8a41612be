// The CUDA path (src/cuda, docs/cuda.md) against the CPU engine's own code: each kernel on
// random inputs, with the edges (1, 15, 16, 17 keys; GQA groups 1 to 8; head sizes 64 and
// 128; pages shared between sequences; one and several key ranges), against
// model/kernels.h's row functions and model/attention.h's PagedAttention.
//
// The kernel tests need a usable GPU: without one (or in a build without CUDA) they skip,
// unless STRATA_REQUIRE_GPU=1 (scripts/gpu-check.sh sets it) makes a missing GPU a failure.
// The checks that come before any launch (shapes refused, probe_device's answers) run on
// every machine.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "cuda/cuda_device.h"
#include "cuda/kernels.h"
#include "gpu_test_util.h"
#include "memory/kv_dtype.h"
#include "memory/kv_pool.h"
#include "model/attention.h"
#include "model/kernels.h"
#include "model/model_config.h"
#include "model/sampler.h"
#include "model/thread_pool.h"

namespace strata::cuda {
namespace {

std::vector<uint16_t> random_bf16(std::mt19937& rng, size_t n, float scale) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<uint16_t> out(n);
  for (auto& v : out) v = f32_to_bf16(dist(rng));
  return out;
}

std::vector<float> widen(const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_to_f32(bits[i]);
  return out;
}

template <typename T>
DeviceBuffer to_device(const std::vector<T>& host) {
  auto buf = DeviceBuffer::allocate(host.size() * sizeof(T));
  EXPECT_TRUE(buf.has_value()) << buf.error().message;
  EXPECT_TRUE(buf->copy_from_host(host.data(), host.size() * sizeof(T)).has_value());
  return std::move(*buf);
}

template <typename T>
std::vector<T> to_host(const DeviceBuffer& buf, size_t n) {
  std::vector<T> out(n);
  EXPECT_TRUE(buf.copy_to_host(out.data(), n * sizeof(T)).has_value());
  return out;
}

// |got - want| within a BF16 result's rounding (2^-8 relative) and the kernels' fast
// exponential, over the row's scale.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, float rel,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  float scale = 1e-3f;
  for (float w : want) scale = std::max(scale, std::fabs(w));
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    if (std::fabs(got[i] - want[i]) > rel * std::max(std::fabs(want[i]), 0.05f * scale)) {
      ADD_FAILURE() << what << " [" << i << "]: " << got[i] << " vs " << want[i];
      ++bad;
    }
  }
}

TEST(CudaDeviceTest, ProbeSaysWhatIsMissingOrWhatItFound) {
  auto device = probe_device(0);
  if (!built_with_cuda()) {
    ASSERT_FALSE(device.has_value());
    EXPECT_EQ(device.error().code, ErrorCode::kUnsupported);
    EXPECT_NE(device.error().message.find("built without CUDA"), std::string::npos);
    EXPECT_FALSE(DeviceBuffer::allocate(16).has_value());
    EXPECT_FALSE(Stream::create().has_value());
    return;
  }
  if (!device) {
    EXPECT_EQ(device.error().code, ErrorCode::kUnsupported);
    EXPECT_FALSE(device.error().message.empty());
    if (gpu_required()) FAIL() << device.error().message;
    GTEST_SKIP() << device.error().message;
  }
  std::printf("device: %s\n", describe(*device).c_str());
  EXPECT_GE(device->sm_major, kMinSmMajor);
  EXPECT_GT(device->total_bytes, 0);
  EXPECT_GT(device->multiprocessors, 0);
  auto missing = probe_device(1000);
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().message.find("1000"), std::string::npos) << missing.error().message;
  // More than the device has: refused with the size, and nothing is left behind.
  auto huge = DeviceBuffer::allocate(size_t{1} << 50);
  ASSERT_FALSE(huge.has_value());
  EXPECT_EQ(huge.error().code, ErrorCode::kResourceExhausted);
  EXPECT_TRUE(DeviceBuffer::allocate(1 << 20).has_value());
}

TEST(CudaKernelsTest, BadShapesAreRefusedBeforeAnyLaunch) {
  DecodeAttentionArgs a;
  a.num_seqs = 1;
  a.num_heads = 8;
  a.num_kv_heads = 3;
  a.head_dim = 64;
  a.page_size = 16;
  a.page_table_stride = 4;
  EXPECT_EQ(decode_attention(a, nullptr).error().code, ErrorCode::kInvalidArgument);  // 8 % 3
  a.num_kv_heads = 1;
  a.num_heads = 16;
  EXPECT_EQ(decode_attention(a, nullptr).error().code, ErrorCode::kUnsupported);  // group 16
  a.num_heads = 8;
  a.head_dim = 96;
  EXPECT_EQ(decode_attention(a, nullptr).error().code, ErrorCode::kUnsupported);
  a.head_dim = 128;
  a.num_splits = 0;
  EXPECT_EQ(decode_attention(a, nullptr).error().code, ErrorCode::kInvalidArgument);
  a.num_splits = 65;
  EXPECT_EQ(decode_attention(a, nullptr).error().code, ErrorCode::kInvalidArgument);
  a.num_splits = 1;
  EXPECT_EQ(decode_attention(a, nullptr).error().code, ErrorCode::kInvalidArgument);  // nulls
  a.num_seqs = 0;
  EXPECT_TRUE(decode_attention(a, nullptr).has_value());  // nothing to do
  EXPECT_EQ(fused_add_rms_norm(nullptr, nullptr, nullptr, -1, 64, 1e-6f, nullptr).error().code,
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(silu_mul(nullptr, nullptr, 4, 0, nullptr).error().code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(rms_norm(nullptr, nullptr, nullptr, 0, 64, 1e-6f, nullptr).has_value());
  EXPECT_EQ(decode_attention_workspace_floats(2, 8, 128, 3), size_t{2 * 8 * 3 * 130});
  QkNormRopeStoreArgs q;
  q.num_tokens = 2;
  q.num_heads = 4;
  q.num_kv_heads = 2;
  q.head_dim = 80;
  q.page_size = 16;
  EXPECT_EQ(qk_norm_rope_store(q, nullptr).error().code, ErrorCode::kUnsupported);
  q.head_dim = 64;
  EXPECT_EQ(qk_norm_rope_store(q, nullptr).error().code, ErrorCode::kInvalidArgument);  // nulls
  uint16_t w = 0;
  q.q_norm_weight = &w;  // a q norm without a k norm
  EXPECT_EQ(qk_norm_rope_store(q, nullptr).error().code, ErrorCode::kInvalidArgument);
  q.q_norm_weight = nullptr;
  q.num_tokens = 0;
  EXPECT_TRUE(qk_norm_rope_store(q, nullptr).has_value());  // nothing to do
  ExtendAttentionArgs e;
  e.num_seqs = 1;
  e.num_tiles = 1;
  e.num_heads = 12;
  e.num_kv_heads = 1;
  e.head_dim = 128;
  e.page_size = 16;
  e.page_table_stride = 2;
  EXPECT_EQ(extend_attention(e, nullptr).error().code, ErrorCode::kUnsupported);  // group 12
  e.num_heads = 8;
  e.head_dim = 256;
  EXPECT_EQ(extend_attention(e, nullptr).error().code, ErrorCode::kUnsupported);
  e.head_dim = 64;
  e.page_table_stride = 0;
  EXPECT_EQ(extend_attention(e, nullptr).error().code, ErrorCode::kInvalidArgument);
  e.page_table_stride = 2;
  EXPECT_EQ(extend_attention(e, nullptr).error().code, ErrorCode::kInvalidArgument);  // nulls
  e.num_tiles = -1;
  EXPECT_EQ(extend_attention(e, nullptr).error().code, ErrorCode::kInvalidArgument);
  e.num_tiles = 0;
  EXPECT_TRUE(extend_attention(e, nullptr).has_value());  // nothing to do
  e.q_stride = 8 * 64 - 1;                                // narrower than the query heads
  EXPECT_EQ(extend_attention(e, nullptr).error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(gather_rows(nullptr, nullptr, nullptr, -1, 8, nullptr).error().code,
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(add_bias(nullptr, nullptr, 2, 8, nullptr).error().code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(gather_rows(nullptr, nullptr, nullptr, 0, 8, nullptr).has_value());  // no rows
}

TEST(CudaKernelsTest, SplitsFillTheDeviceWithoutShortRanges) {
  EXPECT_EQ(decode_attention_splits(64, 8, 4096, 132), 1);     // 512 blocks already
  EXPECT_EQ(decode_attention_splits(1, 8, 100, 132), 1);       // too short to split
  EXPECT_EQ(decode_attention_splits(1, 8, 4096, 132), 16);     // 17 wanted, 16 by length
  EXPECT_EQ(decode_attention_splits(1, 1, 1 << 20, 132), 64);  // capped
  EXPECT_EQ(decode_attention_splits(2, 4, 2048, 132), 8);
}

TEST(CudaKernelsTest, FusedAddRmsNormMatchesTheCpuEngine) {
  STRATA_NEED_GPU();
  std::mt19937 rng(1);
  for (int32_t dim : {64, 1000, 4096}) {
    for (int32_t rows : {1, 3, 17}) {
      const size_t n = static_cast<size_t>(rows) * dim;
      auto x = random_bf16(rng, n, 2.0f);
      auto weight = random_bf16(rng, static_cast<size_t>(dim), 1.5f);
      std::vector<float> residual(n);
      std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
      for (auto& r : residual) r = dist(rng);
      DeviceBuffer dx = to_device(x), dr = to_device(residual), dw = to_device(weight);
      ASSERT_TRUE(fused_add_rms_norm(dx.as<uint16_t>(), dr.as<float>(), dw.as<uint16_t>(), rows,
                                     dim, 1e-6f, nullptr)
                      .has_value());
      const auto got_x = widen(to_host<uint16_t>(dx, n));
      const auto got_r = to_host<float>(dr, n);
      const auto w = widen(weight);
      for (int32_t r = 0; r < rows; ++r) {
        std::vector<float> res(residual.begin() + r * dim, residual.begin() + (r + 1) * dim);
        for (int32_t i = 0; i < dim; ++i) res[i] += bf16_to_f32(x[r * dim + i]);
        std::vector<float> y(dim);
        rmsnorm_row(res.data(), w.data(), y.data(), dim, 1e-6f);
        const std::string what = "dim " + std::to_string(dim) + " row " + std::to_string(r);
        expect_close({got_r.begin() + r * dim, got_r.begin() + (r + 1) * dim}, res, 1e-6f,
                     what + " residual");
        expect_close({got_x.begin() + r * dim, got_x.begin() + (r + 1) * dim}, y, 1.6e-2f, what);
      }
      // rms_norm alone, in place (y = x), on the new residual rounded to BF16.
      std::vector<uint16_t> rb(n);
      for (size_t i = 0; i < n; ++i) rb[i] = f32_to_bf16(got_r[i]);
      DeviceBuffer drb = to_device(rb);
      ASSERT_TRUE(rms_norm(drb.as<uint16_t>(), drb.as<uint16_t>(), dw.as<uint16_t>(), rows, dim,
                           1e-6f, nullptr)
                      .has_value());
      const auto got_y = widen(to_host<uint16_t>(drb, n));
      const auto rbw = widen(rb);
      for (int32_t r = 0; r < rows; ++r) {
        std::vector<float> y(dim);
        rmsnorm_row(rbw.data() + r * dim, w.data(), y.data(), dim, 1e-6f);
        expect_close({got_y.begin() + r * dim, got_y.begin() + (r + 1) * dim}, y, 1.6e-2f,
                     "rms_norm dim " + std::to_string(dim));
      }
    }
  }
}

TEST(CudaKernelsTest, SiluMulMatchesTheCpuEngine) {
  STRATA_NEED_GPU();
  std::mt19937 rng(2);
  for (int32_t inter : {1, 17, 3072}) {
    const int32_t rows = 5;
    auto gate_up = random_bf16(rng, static_cast<size_t>(rows) * 2 * inter, 6.0f);
    DeviceBuffer din = to_device(gate_up);
    auto dout = DeviceBuffer::allocate(static_cast<size_t>(rows) * inter * 2);
    ASSERT_TRUE(dout.has_value());
    ASSERT_TRUE(
        silu_mul(din.as<uint16_t>(), dout->as<uint16_t>(), rows, inter, nullptr).has_value());
    const auto got = widen(to_host<uint16_t>(*dout, static_cast<size_t>(rows) * inter));
    const auto in = widen(gate_up);
    std::vector<float> want(static_cast<size_t>(rows) * inter);
    for (int32_t r = 0; r < rows; ++r) {
      silu_mul_row(in.data() + r * 2 * inter, in.data() + r * 2 * inter + inter,
                   want.data() + r * inter, inter);
    }
    expect_close(got, want, 1.6e-2f, "silu_mul inter " + std::to_string(inter));
  }
}

struct DecodeCase {
  int32_t head_dim;
  int32_t num_kv_heads;
  int32_t group;
  int32_t page_size;
  std::vector<int32_t> lens;  // keys per sequence
  int32_t num_splits;
  bool share_prefix;  // sequences 0 and 1 share their first pages
};

// Random K/V pages written both in the device layout and into a CPU KvPool (F32, holding the
// same BF16-rounded values), and random page tables (pages shuffled, sequences 0 and 1
// sharing their first pages when asked) for sequences of `lens` keys.
struct PagedKv {
  int32_t stride = 1;             // page table entries per sequence
  std::vector<int32_t> pages_of;  // pages per sequence
  std::vector<int32_t> table;     // [sequence][stride]
  std::vector<uint16_t> k, v;     // BF16 [page][kv_head][slot][head_dim]
  std::unique_ptr<KvPool> pool;   // the same values, one layer

  std::vector<PageId> page_ids(int32_t s) const {
    std::vector<PageId> ids;
    for (int32_t i = 0; i < pages_of[s]; ++i) {
      ids.push_back(make_page_id(table[static_cast<size_t>(s) * stride + i]));
    }
    return ids;
  }
};

PagedKv make_paged_kv(int32_t head_dim, int32_t num_kv_heads, int32_t page_size,
                      const std::vector<int32_t>& lens, bool share_prefix, std::mt19937& rng) {
  PagedKv kv;
  const auto num_seqs = static_cast<int32_t>(lens.size());
  kv.pages_of.resize(num_seqs);
  for (int32_t s = 0; s < num_seqs; ++s) {
    kv.pages_of[s] = (lens[s] + page_size - 1) / page_size;
    kv.stride = std::max(kv.stride, kv.pages_of[s]);
  }
  const int32_t num_pages = std::accumulate(kv.pages_of.begin(), kv.pages_of.end(), 0) + 1;
  std::vector<int32_t> free_pages(num_pages);
  std::iota(free_pages.begin(), free_pages.end(), 0);
  std::shuffle(free_pages.begin(), free_pages.end(), rng);
  kv.table.assign(static_cast<size_t>(num_seqs) * kv.stride, 0);
  size_t next = 0;
  for (int32_t s = 0; s < num_seqs; ++s) {
    for (int32_t i = 0; i < kv.pages_of[s]; ++i) {
      const bool shared =
          share_prefix && s == 1 && i + 1 < kv.pages_of[0] && i + 1 < kv.pages_of[1];
      kv.table[static_cast<size_t>(s) * kv.stride + i] = shared ? kv.table[i] : free_pages[next++];
    }
  }
  // K and V for every page, slot and head.
  const size_t elems = static_cast<size_t>(num_pages) * num_kv_heads * page_size * head_dim;
  kv.k = random_bf16(rng, elems, 1.0f);
  kv.v = random_bf16(rng, elems, 1.0f);
  kv.pool =
      std::make_unique<KvPool>(1, num_kv_heads, head_dim, num_pages, page_size, KvDtype::kF32);
  std::vector<float> kt(static_cast<size_t>(num_kv_heads) * head_dim), vt(kt.size());
  for (int32_t p = 0; p < num_pages; ++p) {
    for (int32_t slot = 0; slot < page_size; ++slot) {
      for (int32_t h = 0; h < num_kv_heads; ++h) {
        for (int32_t d = 0; d < head_dim; ++d) {
          const size_t at =
              ((static_cast<size_t>(p) * num_kv_heads + h) * page_size + slot) * head_dim + d;
          kt[static_cast<size_t>(h) * head_dim + d] = bf16_to_f32(kv.k[at]);
          vt[static_cast<size_t>(h) * head_dim + d] = bf16_to_f32(kv.v[at]);
        }
      }
      kv.pool->write_token(0, make_page_id(p), slot, kt.data(), vt.data());
    }
  }
  return kv;
}

// One query per sequence; the kernel's output against PagedAttention's.
void check_decode(const DecodeCase& c, std::mt19937& rng) {
  const int32_t num_heads = c.num_kv_heads * c.group;
  const int32_t num_seqs = static_cast<int32_t>(c.lens.size());
  const PagedKv kv =
      make_paged_kv(c.head_dim, c.num_kv_heads, c.page_size, c.lens, c.share_prefix, rng);
  const int32_t stride = kv.stride;
  const std::vector<int32_t>& table = kv.table;
  const std::vector<uint16_t>& k = kv.k;
  const std::vector<uint16_t>& v = kv.v;
  const KvPool& pool = *kv.pool;
  const auto q = random_bf16(rng, static_cast<size_t>(num_seqs) * num_heads * c.head_dim, 1.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  DeviceBuffer dq = to_device(q), dk = to_device(k), dv = to_device(v), dt = to_device(table),
               dl = to_device(c.lens);
  auto dout = DeviceBuffer::allocate(q.size() * 2);
  auto dws = DeviceBuffer::allocate(
      decode_attention_workspace_floats(num_seqs, num_heads, c.head_dim, c.num_splits) * 4);
  ASSERT_TRUE(dout.has_value() && dws.has_value());
  DecodeAttentionArgs a;
  a.q = dq.as<uint16_t>();
  a.k_pages = dk.as<uint16_t>();
  a.v_pages = dv.as<uint16_t>();
  a.page_table = dt.as<int32_t>();
  a.page_table_stride = stride;
  a.seq_lens = dl.as<int32_t>();
  a.out = dout->as<uint16_t>();
  a.workspace = dws->as<float>();
  a.num_seqs = num_seqs;
  a.num_heads = num_heads;
  a.num_kv_heads = c.num_kv_heads;
  a.head_dim = c.head_dim;
  a.page_size = c.page_size;
  a.num_splits = c.num_splits;
  a.scale = scale;
  const Status st = decode_attention(a, nullptr);
  ASSERT_TRUE(st.has_value()) << st.error().message;
  const auto got = widen(to_host<uint16_t>(*dout, q.size()));

  // The CPU engine's attention on the same values.
  AttentionShape shape{.num_heads = num_heads,
                       .num_kv_heads = c.num_kv_heads,
                       .head_dim = c.head_dim,
                       .sliding_window = 0,
                       .scale = scale};
  ThreadPool threads(1);
  PagedAttention attention(shape, 1);
  std::vector<std::vector<PageId>> page_ids(num_seqs);
  std::vector<AttentionSequence> seqs(num_seqs);
  for (int32_t s = 0; s < num_seqs; ++s) {
    page_ids[s] = kv.page_ids(s);
    seqs[s] = AttentionSequence{.first_row = s,
                                .num_tokens = 1,
                                .start_position = c.lens[s] - 1,
                                .page_table = page_ids[s]};
  }
  const auto qf = widen(q);
  std::vector<float> want(q.size());
  attention.run(threads, seqs, qf.data(), static_cast<int64_t>(num_heads) * c.head_dim, pool, 0,
                want.data(), static_cast<int64_t>(num_heads) * c.head_dim);
  expect_close(got, want, 2e-2f,
               "head_dim " + std::to_string(c.head_dim) + " group " + std::to_string(c.group) +
                   " page " + std::to_string(c.page_size) + " splits " +
                   std::to_string(c.num_splits));
}

TEST(CudaKernelsTest, DecodeAttentionMatchesTheCpuEngine) {
  STRATA_NEED_GPU();
  std::mt19937 rng(3);
  const std::vector<int32_t> groups =
      smoke() ? std::vector<int32_t>{1, 8} : std::vector<int32_t>{1, 2, 4, 8};
  const std::vector<int32_t> split_counts =
      smoke() ? std::vector<int32_t>{3} : std::vector<int32_t>{1, 3, 8};
  for (int32_t head_dim : {64, 128}) {
    for (int32_t group : groups) {
      for (int32_t splits : split_counts) {
        SCOPED_TRACE(testing::Message()
                     << "head_dim " << head_dim << " group " << group << " splits " << splits);
        check_decode({head_dim, 2, group, 16, {1, 15, 16, 17, 300}, splits, false}, rng);
        check_decode({head_dim, 1, group, 16, {700, 650}, splits, true}, rng);
      }
    }
    // Page sizes that are not the usual 16, and more ranges than keys.
    check_decode({head_dim, 2, 4, 1, {5, 33}, 1, false}, rng);
    check_decode({head_dim, 2, 4, 7, {1, 7, 8, 50}, 16, true}, rng);
  }
}

struct ExtendCase {
  int32_t head_dim;
  int32_t num_kv_heads;
  int32_t group;
  int32_t page_size;
  std::vector<int32_t> prefix;      // cached keys per sequence before the step
  std::vector<int32_t> new_tokens;  // new tokens per sequence (0: a sequence with none)
  bool share_prefix;
  int32_t q_pad = 0;  // elements after each token's query heads (q inside wider rows)
};

// Each sequence's new tokens attend causally over its cached prefix; the kernel's output
// against PagedAttention's over the same pages (the new tokens' keys already written).
void check_extend(const ExtendCase& c, std::mt19937& rng,
                  ExtendKernel kernel = ExtendKernel::kCudaCores) {
  const int32_t num_heads = c.num_kv_heads * c.group;
  const auto num_seqs = static_cast<int32_t>(c.prefix.size());
  std::vector<int32_t> kv_lens(num_seqs), qo_start(num_seqs + 1, 0);
  for (int32_t s = 0; s < num_seqs; ++s) {
    kv_lens[s] = c.prefix[s] + c.new_tokens[s];
    qo_start[s + 1] = qo_start[s] + c.new_tokens[s];
  }
  const int32_t num_tokens = qo_start[num_seqs];
  const PagedKv kv =
      make_paged_kv(c.head_dim, c.num_kv_heads, c.page_size, kv_lens, c.share_prefix, rng);
  const int32_t q_stride = num_heads * c.head_dim + c.q_pad;
  const auto q = random_bf16(rng, static_cast<size_t>(num_tokens) * q_stride, 1.0f);
  const size_t out_elems = static_cast<size_t>(num_tokens) * num_heads * c.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const ExtendTiles tiles = plan_extend_tiles(c.new_tokens, c.group, kernel);

  DeviceBuffer dq = to_device(q), dk = to_device(kv.k), dv = to_device(kv.v),
               dt = to_device(kv.table), dqo = to_device(qo_start), dl = to_device(kv_lens),
               dts = to_device(tiles.seq), dtf = to_device(tiles.first);
  auto dout = DeviceBuffer::allocate(out_elems * 2);
  ASSERT_TRUE(dout.has_value());
  ExtendAttentionArgs a;
  a.q = dq.as<uint16_t>();
  a.q_stride = c.q_pad > 0 ? q_stride : 0;
  a.k_pages = dk.as<uint16_t>();
  a.v_pages = dv.as<uint16_t>();
  a.page_table = dt.as<int32_t>();
  a.page_table_stride = kv.stride;
  a.qo_start = dqo.as<int32_t>();
  a.kv_lens = dl.as<int32_t>();
  a.tile_seq = dts.as<int32_t>();
  a.tile_first = dtf.as<int32_t>();
  a.out = dout->as<uint16_t>();
  a.num_tiles = static_cast<int32_t>(tiles.seq.size());
  a.num_seqs = num_seqs;
  a.num_heads = num_heads;
  a.num_kv_heads = c.num_kv_heads;
  a.head_dim = c.head_dim;
  a.page_size = c.page_size;
  a.scale = scale;
  const Status st = extend_attention(a, nullptr, kernel);
  ASSERT_TRUE(st.has_value()) << st.error().message;
  const auto got = widen(to_host<uint16_t>(*dout, out_elems));

  AttentionShape shape{.num_heads = num_heads,
                       .num_kv_heads = c.num_kv_heads,
                       .head_dim = c.head_dim,
                       .sliding_window = 0,
                       .scale = scale};
  ThreadPool threads(1);
  PagedAttention attention(shape, 1);
  std::vector<std::vector<PageId>> page_ids(num_seqs);
  std::vector<AttentionSequence> seqs;
  for (int32_t s = 0; s < num_seqs; ++s) {
    page_ids[s] = kv.page_ids(s);
    if (c.new_tokens[s] == 0) continue;
    seqs.push_back(AttentionSequence{.first_row = qo_start[s],
                                     .num_tokens = c.new_tokens[s],
                                     .start_position = c.prefix[s],
                                     .page_table = page_ids[s]});
  }
  const auto qf = widen(q);
  std::vector<float> want(out_elems);
  attention.run(threads, seqs, qf.data(), q_stride, *kv.pool, 0, want.data(),
                static_cast<int64_t>(num_heads) * c.head_dim);
  // Tensor cores multiply BF16 probabilities (FlashAttention-2's rounding): a little looser.
  expect_close(got, want, kernel == ExtendKernel::kTensorCores ? 3e-2f : 2e-2f,
               std::string(kernel == ExtendKernel::kTensorCores ? "tensor cores " : "") +
                   "head_dim " + std::to_string(c.head_dim) + " group " + std::to_string(c.group) +
                   " page " + std::to_string(c.page_size));
}

// The row gather (embedding lookup, logit rows) copies rows exactly; the bias add matches
// the CPU's F32 sum rounded to BF16.
TEST(CudaKernelsTest, GatherRowsAndAddBiasMatchTheCpu) {
  STRATA_NEED_GPU();
  std::mt19937 rng(6);
  const int32_t rows = 37, cols = 300, picked = 9;
  const auto src = random_bf16(rng, static_cast<size_t>(rows) * cols, 2.0f);
  std::vector<int32_t> index(picked);
  for (auto& i : index) i = static_cast<int32_t>(rng() % rows);
  std::vector<float> bias(cols);
  for (auto& b : bias) b = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
  DeviceBuffer dsrc = to_device(src), didx = to_device(index), dbias = to_device(bias);
  auto dst = DeviceBuffer::allocate(static_cast<size_t>(picked) * cols * 2);
  ASSERT_TRUE(dst.has_value());
  ASSERT_TRUE(gather_rows(dsrc.as<uint16_t>(), didx.as<int32_t>(), dst->as<uint16_t>(), picked,
                          cols, nullptr)
                  .has_value());
  const auto gathered = to_host<uint16_t>(*dst, static_cast<size_t>(picked) * cols);
  for (int32_t r = 0; r < picked; ++r) {
    for (int32_t c = 0; c < cols; ++c) {
      ASSERT_EQ(gathered[static_cast<size_t>(r) * cols + c],
                src[static_cast<size_t>(index[r]) * cols + c])
          << "row " << r << " col " << c;
    }
  }
  ASSERT_TRUE(add_bias(dst->as<uint16_t>(), dbias.as<float>(), picked, cols, nullptr).has_value());
  const auto biased = to_host<uint16_t>(*dst, static_cast<size_t>(picked) * cols);
  for (int32_t r = 0; r < picked; ++r) {
    for (int32_t c = 0; c < cols; ++c) {
      const size_t at = static_cast<size_t>(r) * cols + c;
      ASSERT_EQ(biased[at], f32_to_bf16(bf16_to_f32(gathered[at]) + bias[c]))
          << "row " << r << " col " << c;
    }
  }
}

// Sampling on the device draws as the Sampler does (model/sampler.h's sample_row is its CPU
// reference): from the same row and uniform number, the same token (greedy, temperature,
// top-k, top-p and their mixes, ties planted), the same
// alternatives and log-probabilities; a row it cannot draw within kSampleCandidates ranked
// tokens (ties wider than them) comes back as -1, and a row without kSampleDraw too. Only a
// uniform number within rounding of a boundary between two tokens may go either way: such
// rows are counted, not compared.
TEST(CudaKernelsTest, SampleRowsDrawsTheSamplersToken) {
  EXPECT_FALSE(sample_row_arg(1.0, 1.0f, 0, 1.0f, 0, false).has_value());
  EXPECT_FALSE(sample_row_arg(0.5, -1.0f, 0, 1.0f, 0, false).has_value());
  EXPECT_FALSE(sample_row_arg(0.5, 1.0f, 0, 0.0f, 0, false).has_value());
  EXPECT_FALSE(sample_row_arg(0.5, 1.0f, 0, 1.0f, kSampleMaxTop + 1, false).has_value());
  SampleRowsArgs none;
  none.rows = 1;
  none.cols = 4;
  EXPECT_EQ(sample_rows(none, nullptr).error().code, ErrorCode::kInvalidArgument);
  none.rows = 0;
  EXPECT_TRUE(sample_rows(none, nullptr).has_value());  // nothing to do
  STRATA_NEED_GPU();
  std::mt19937 rng(8);
  int compared = 0, near_boundary = 0;
  for (const int32_t cols : {50, 3000, 151936}) {
    const int32_t rows = smoke() ? 24 : 96;
    std::vector<float> x(static_cast<size_t>(rows) * cols);
    std::vector<SampleRowArg> params(static_cast<size_t>(rows));
    std::vector<RowSampling> rules(static_cast<size_t>(rows));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<double> unit(0.0, 1.0);
    for (int32_t r = 0; r < rows; ++r) {
      float* row = x.data() + static_cast<size_t>(r) * cols;
      const int shape = r % 4;
      for (int32_t c = 0; c < cols; ++c) {
        // 0: a trained model's peaky row (a few tokens far above the rest); 1: spread; 2:
        // BF16-like quantised values with ties; 3: peaky with ties at the top.
        float v = normal(rng) * (shape == 1 ? 3.0f : 1.0f);
        if (shape == 2) v = std::round(v * 4.0f) / 4.0f;
        row[c] = v;
      }
      if (shape == 0 || shape == 3) {
        for (int k = 0; k < 12; ++k) row[rng() % cols] = 8.0f + 2.0f * normal(rng);
      }
      if (shape == 3) row[cols / 3] = row[cols / 2] = row[cols - 1] = 15.0f;
      RowSampling& q = rules[static_cast<size_t>(r)];
      const int rule = (r / 4) % 8;
      q.temperature = rule == 0 ? 0.0f : static_cast<float>(0.3 + 1.2 * unit(rng));
      q.top_k = rule == 2 || rule == 5 ? 1 + static_cast<int32_t>(rng() % 60) : rule == 6 ? 1 : 0;
      q.top_p = rule == 3 || rule == 5 ? static_cast<float>(0.3 + 0.6 * unit(rng)) : 1.0f;
      q.uniform = unit(rng);
      q.logprobs = r % 3 == 0;
      q.top_logprobs = rule == 4 ? kSampleMaxTop : rule == 7 ? 3 : 0;
      auto arg =
          sample_row_arg(q.uniform, q.temperature, q.top_k, q.top_p, q.top_logprobs, q.logprobs);
      ASSERT_TRUE(arg.has_value());
      params[static_cast<size_t>(r)] = *arg;
    }
    params[1].flags = 0;  // not drawn
    DeviceBuffer dx = to_device(x);
    DeviceBuffer dp = to_device(params);
    auto tokens = DeviceBuffer::allocate(static_cast<size_t>(rows) * 4);
    auto logprobs = DeviceBuffer::allocate(static_cast<size_t>(rows) * 4);
    auto top_ids = DeviceBuffer::allocate(static_cast<size_t>(rows) * kSampleMaxTop * 4);
    auto top_lps = DeviceBuffer::allocate(static_cast<size_t>(rows) * kSampleMaxTop * 4);
    ASSERT_TRUE(tokens && logprobs && top_ids && top_lps);
    SampleRowsArgs a;
    a.logits = dx.as<float>();
    a.params = dp.as<SampleRowArg>();
    a.tokens = tokens->as<int32_t>();
    a.logprobs = logprobs->as<float>();
    a.top_ids = top_ids->as<int32_t>();
    a.top_logprobs = top_lps->as<float>();
    a.rows = rows;
    a.cols = cols;
    ASSERT_TRUE(sample_rows(a, nullptr).has_value());
    const auto got = to_host<int32_t>(*tokens, static_cast<size_t>(rows));
    const auto got_lp = to_host<float>(*logprobs, static_cast<size_t>(rows));
    const auto got_ids = to_host<int32_t>(*top_ids, static_cast<size_t>(rows) * kSampleMaxTop);
    const auto got_tlp = to_host<float>(*top_lps, static_cast<size_t>(rows) * kSampleMaxTop);
    EXPECT_EQ(got[1], -1);
    for (int32_t r = 0; r < rows; ++r) {
      if (r == 1) continue;
      const std::span<const float> row(x.data() + static_cast<size_t>(r) * cols,
                                       static_cast<size_t>(cols));
      const RowSampling& q = rules[static_cast<size_t>(r)];
      const std::string where = fmt::format("cols {} row {} T {} top_k {} top_p {} u {}", cols, r,
                                            q.temperature, q.top_k, q.top_p, q.uniform);
      const int32_t token = got[static_cast<size_t>(r)];
      // Rows of a trained model's shape always fit the candidates.
      if ((r % 4 == 0 || r % 4 == 3) && q.top_p == 1.0f) {
        ASSERT_GE(token, 0) << where;
      }
      if (token < 0) continue;  // left to the host
      const SampledToken want = sample_row(row, q);
      RowSampling lower = q, upper = q;
      lower.uniform = std::max(0.0, q.uniform - 1e-6);
      upper.uniform = std::min(1.0 - 1e-12, q.uniform + 1e-6);
      if (q.temperature > 0.0f && (sample_row(row, lower).token != want.token ||
                                   sample_row(row, upper).token != want.token)) {
        ++near_boundary;
        continue;
      }
      ASSERT_EQ(token, want.token) << where;
      ++compared;
      if (q.logprobs || q.top_logprobs > 0) {
        EXPECT_NEAR(got_lp[static_cast<size_t>(r)], want.logprob, 1e-4) << where;
      }
      const size_t n = std::min(static_cast<size_t>(q.top_logprobs), static_cast<size_t>(cols));
      for (size_t j = 0; j < n; ++j) {
        EXPECT_EQ(got_ids[static_cast<size_t>(r) * kSampleMaxTop + j], want.top_logprobs[j].token)
            << where << " alternative " << j;
        EXPECT_NEAR(got_tlp[static_cast<size_t>(r) * kSampleMaxTop + j],
                    want.top_logprobs[j].logprob, 1e-4)
            << where;
      }
    }
  }
  EXPECT_GT(compared, near_boundary * 10);
  // Ties wider than the candidates under top_k: left to the host.
  {
    const int32_t cols = 151936;
    std::vector<float> flat(static_cast<size_t>(cols), 1.5f);
    auto arg = sample_row_arg(0.5, 1.0f, 3000, 1.0f, 0, false);
    ASSERT_TRUE(arg.has_value());
    DeviceBuffer dx = to_device(flat);
    DeviceBuffer dp = to_device(std::vector<SampleRowArg>{*arg});
    auto out = DeviceBuffer::allocate(4 + 4 + 2 * kSampleMaxTop * 4);
    ASSERT_TRUE(out.has_value());
    SampleRowsArgs a;
    a.logits = dx.as<float>();
    a.params = dp.as<SampleRowArg>();
    a.tokens = out->as<int32_t>();
    a.logprobs = out->as<float>() + 1;
    a.top_ids = out->as<int32_t>() + 2;
    a.top_logprobs = out->as<float>() + 2 + kSampleMaxTop;
    a.rows = 1;
    a.cols = cols;
    ASSERT_TRUE(sample_rows(a, nullptr).has_value());
    EXPECT_EQ(to_host<int32_t>(*out, 1)[0], -1);
    // The same flat row with no filter: a token of the walk (uniform 0.5: the middle id).
    auto plain = sample_row_arg(0.5, 1.0f, 0, 1.0f, 0, false);
    dp = to_device(std::vector<SampleRowArg>{*plain});
    a.params = dp.as<SampleRowArg>();
    ASSERT_TRUE(sample_rows(a, nullptr).has_value());
    const int32_t mid = to_host<int32_t>(*out, 1)[0];
    EXPECT_EQ(mid, sample_row(flat, RowSampling{.temperature = 1.0f, .uniform = 0.5}).token);
  }
}

// Tiles: each sequence's new tokens cut in order, none for a sequence without any.
TEST(CudaKernelsTest, ExtendTilesCoverEveryNewTokenOnce) {
  EXPECT_EQ(extend_attention_tile_tokens(1), 32);
  EXPECT_EQ(extend_attention_tile_tokens(3), 10);
  EXPECT_EQ(extend_attention_tile_tokens(8), 4);
  const ExtendTiles t = plan_extend_tiles(std::vector<int32_t>{17, 0, 4, 1}, 4);  // 8 a tile
  EXPECT_EQ(t.seq, (std::vector<int32_t>{0, 0, 0, 2, 3}));
  EXPECT_EQ(t.first, (std::vector<int32_t>{0, 8, 16, 0, 0}));
  EXPECT_TRUE(plan_extend_tiles({}, 2).seq.empty());
}

TEST(CudaKernelsTest, ExtendAttentionMatchesTheCpuEngine) {
  STRATA_NEED_GPU();
  std::mt19937 rng(5);
  const std::vector<int32_t> groups =
      smoke() ? std::vector<int32_t>{1, 8} : std::vector<int32_t>{1, 2, 3, 4, 8};
  for (ExtendKernel kernel : {ExtendKernel::kCudaCores, ExtendKernel::kTensorCores}) {
    for (int32_t head_dim : {64, 128}) {
      for (int32_t group : groups) {
        SCOPED_TRACE(testing::Message()
                     << (kernel == ExtendKernel::kTensorCores ? "tensor cores, " : "")
                     << "head_dim " << head_dim << " group " << group);
        // Whole prompts of 1, 15, 16, 17 tokens; a prefix with one new token (a decode
        // row); cached prefixes with new tails of several tiles; a sequence with none.
        check_extend({head_dim, 2, group, 16, {0, 0, 0, 0}, {1, 15, 16, 17}, false}, rng, kernel);
        check_extend({head_dim, 2, group, 16, {5, 40, 300, 7}, {1, 33, 70, 0}, false}, rng, kernel);
        // Two sequences sharing their cached prefix's pages, odd page sizes.
        check_extend({head_dim, 1, group, 16, {256, 256}, {20, 45}, true}, rng, kernel);
        check_extend({head_dim, 2, group, 7, {13, 0}, {9, 50}, false}, rng, kernel);
        // Queries read from inside wider rows (the fused QKV product's).
        check_extend({head_dim, 2, group, 16, {3, 0}, {4, 20}, false, 4 * head_dim}, rng, kernel);
        // A long tail: many key steps of 64 and tiles of 64 rows, keys not a multiple of 16.
        check_extend({head_dim, 1, group, 16, {77, 0}, {130, 203}, false}, rng, kernel);
      }
    }
  }
}

// The tensor-core kernel's tiles hold 64 rows; its queries are read 16 bytes at a time.
TEST(CudaKernelsTest, TensorCoreExtendTilesAndStrides) {
  EXPECT_EQ(extend_attention_tile_tokens(1, ExtendKernel::kTensorCores), 64);
  EXPECT_EQ(extend_attention_tile_tokens(3, ExtendKernel::kTensorCores), 21);
  EXPECT_EQ(extend_attention_tile_tokens(8, ExtendKernel::kTensorCores), 8);
  const ExtendTiles t =
      plan_extend_tiles(std::vector<int32_t>{17, 0, 4}, 4, ExtendKernel::kTensorCores);
  EXPECT_EQ(t.seq, (std::vector<int32_t>{0, 0, 2}));
  EXPECT_EQ(t.first, (std::vector<int32_t>{0, 16, 0}));
  ExtendAttentionArgs a;
  a.num_heads = 4;
  a.num_kv_heads = 2;
  a.head_dim = 64;
  a.page_size = 16;
  a.page_table_stride = 1;
  a.num_seqs = 1;
  a.num_tiles = 1;
  a.q_stride = 4 * 64 + 4;  // not a multiple of 8
  const uint16_t dummy16[1] = {};
  const int32_t dummy32[2] = {};
  a.q = a.k_pages = a.v_pages = dummy16;
  a.page_table = a.qo_start = a.kv_lens = a.tile_seq = a.tile_first = dummy32;
  a.out = const_cast<uint16_t*>(dummy16);
  const Status st = extend_attention(a, nullptr, ExtendKernel::kTensorCores);
  ASSERT_FALSE(st.has_value());
  EXPECT_EQ(st.error().code, ErrorCode::kInvalidArgument) << st.error().message;
}

// Q/K norm + RoPE + the K/V write against the CPU engine's rmsnorm_row and rope_apply, with
// the angles from its RopeTable; tokens at scattered slots (one a padding row, -1), with and
// without Qwen3's norms, both head sizes, GQA groups 1 and 4.
TEST(CudaKernelsTest, QkNormRopeStoreMatchesTheCpuEngine) {
  STRATA_NEED_GPU();
  std::mt19937 rng(4);
  for (int32_t head_dim : {64, 128}) {
    for (auto [heads, kv_heads] : {std::pair{4, 4}, std::pair{8, 2}}) {
      for (bool norms : {true, false}) {
        for (int32_t tokens : {1, 17}) {
          const std::string what = "head_dim " + std::to_string(head_dim) + " heads " +
                                   std::to_string(heads) + "/" + std::to_string(kv_heads) +
                                   (norms ? " norms" : "") + " tokens " + std::to_string(tokens);
          const int32_t page_size = 16, num_pages = 4;
          const int32_t width = (heads + 2 * kv_heads) * head_dim;
          ModelConfig config;
          config.head_dim = head_dim;
          config.rope_theta = 1000000.0;
          const RopeTable rope(config);
          const int32_t half = head_dim / 2;
          auto qkv = random_bf16(rng, static_cast<size_t>(tokens) * width, 3.0f);
          auto qw = random_bf16(rng, static_cast<size_t>(head_dim), 1.5f);
          auto kw = random_bf16(rng, static_cast<size_t>(head_dim), 1.5f);
          std::vector<float> cos_sin(static_cast<size_t>(tokens) * head_dim);
          std::vector<int32_t> slots(static_cast<size_t>(num_pages) * page_size);
          std::iota(slots.begin(), slots.end(), 0);
          std::shuffle(slots.begin(), slots.end(), rng);
          slots.resize(static_cast<size_t>(tokens));
          if (tokens > 1) slots[1] = -1;
          for (int32_t t = 0; t < tokens; ++t) {
            float* cs = cos_sin.data() + static_cast<size_t>(t) * head_dim;
            rope.angles(static_cast<int64_t>(rng() % 40000), cs, cs + half);
          }
          const size_t page_elems =
              static_cast<size_t>(num_pages) * kv_heads * page_size * head_dim;
          DeviceBuffer d_qkv = to_device(qkv), d_qw = to_device(qw), d_kw = to_device(kw);
          DeviceBuffer d_cs = to_device(cos_sin), d_slots = to_device(slots);
          DeviceBuffer d_k = to_device(std::vector<uint16_t>(page_elems));
          DeviceBuffer d_v = to_device(std::vector<uint16_t>(page_elems));
          QkNormRopeStoreArgs a;
          a.qkv = d_qkv.as<uint16_t>();
          a.q_norm_weight = norms ? d_qw.as<uint16_t>() : nullptr;
          a.k_norm_weight = norms ? d_kw.as<uint16_t>() : nullptr;
          a.cos_sin = d_cs.as<float>();
          a.slots = d_slots.as<int32_t>();
          a.k_pages = d_k.as<uint16_t>();
          a.v_pages = d_v.as<uint16_t>();
          a.num_tokens = tokens;
          a.num_heads = heads;
          a.num_kv_heads = kv_heads;
          a.head_dim = head_dim;
          a.page_size = page_size;
          a.eps = 1e-6f;
          ASSERT_TRUE(qk_norm_rope_store(a, nullptr).has_value()) << what;
          const auto got = widen(to_host<uint16_t>(d_qkv, qkv.size()));
          const auto got_k = widen(to_host<uint16_t>(d_k, page_elems));
          const auto got_v = widen(to_host<uint16_t>(d_v, page_elems));
          const auto in = widen(qkv);
          const auto qwf = widen(qw), kwf = widen(kw);
          for (int32_t t = 0; t < tokens; ++t) {
            const float* cs = cos_sin.data() + static_cast<size_t>(t) * head_dim;
            for (int32_t h = 0; h < heads + 2 * kv_heads; ++h) {
              const size_t at = static_cast<size_t>(t) * width + static_cast<size_t>(h) * head_dim;
              std::vector<float> want(in.begin() + at, in.begin() + at + head_dim);
              const bool is_v = h >= heads + kv_heads;
              if (!is_v) {
                if (norms) {
                  rmsnorm_row(want.data(), h < heads ? qwf.data() : kwf.data(), want.data(),
                              head_dim, 1e-6f);
                }
                rope_apply(want.data(), cs, cs + half, half);
              }
              const std::string where =
                  what + " token " + std::to_string(t) + " head " + std::to_string(h);
              expect_close({got.begin() + at, got.begin() + at + head_dim}, want, 1.6e-2f, where);
              const int32_t slot = slots[static_cast<size_t>(t)];
              if (h < heads || slot < 0) continue;
              const int32_t kv = is_v ? h - heads - kv_heads : h - heads;
              const size_t p =
                  ((static_cast<size_t>(slot / page_size) * kv_heads + kv) * page_size +
                   static_cast<size_t>(slot % page_size)) *
                  head_dim;
              const auto& pages = is_v ? got_v : got_k;
              expect_close({pages.begin() + p, pages.begin() + p + head_dim}, want, 1.6e-2f,
                           where + " in its page");
            }
          }
          // The padding row wrote nothing: its slot's neighbours are untouched (zero) unless
          // another token owns them, and no slot outside `slots` was written.
          std::vector<bool> owned(static_cast<size_t>(num_pages) * page_size, false);
          for (int32_t sl : slots) {
            if (sl >= 0) owned[static_cast<size_t>(sl)] = true;
          }
          for (int32_t sl = 0; sl < num_pages * page_size; ++sl) {
            if (owned[static_cast<size_t>(sl)]) continue;
            for (int32_t kv = 0; kv < kv_heads; ++kv) {
              const size_t p = ((static_cast<size_t>(sl / page_size) * kv_heads + kv) * page_size +
                                static_cast<size_t>(sl % page_size)) *
                               head_dim;
              for (int32_t d = 0; d < head_dim; ++d) {
                ASSERT_EQ(got_k[p + d], 0.0f) << what << " slot " << sl << " written";
                ASSERT_EQ(got_v[p + d], 0.0f) << what << " slot " << sl << " written";
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata::cuda
