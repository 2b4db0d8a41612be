// Kernels against plain double-precision loops: exp, RMSNorm, SiLU, RoPE, the matmul
// paths (our small-m kernel and OpenBLAS, F32 and BF16 weights), paged attention (both
// kernels, GQA, sliding window, all KV dtypes), and the thread pool.
#include <gtest/gtest.h>

// GCC 12 reports a false -Wrestrict inside std::string when it inlines gtest's
// parameter-name generator at -O3 (GCC bug 105329).
#pragma GCC diagnostic ignored "-Wrestrict"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "memory/kv_pool.h"
#include "model/attention.h"
#include "model/kernels.h"
#include "model/matmul.h"
#include "model/rng.h"
#include "model/thread_pool.h"
#include "model/weights.h"

namespace strata {
namespace {

std::vector<float> random_vector(Rng& rng, size_t n, double std = 1.0) {
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(std * rng.normal());
  return v;
}

TEST(KernelsTest, ExpIsAccurateAndSaturates) {
  std::vector<float> x;
  for (float v = -87.0f; v <= 88.0f; v += 0.37f) x.push_back(v);
  x.push_back(0.0f);
  std::vector<float> y(x.size());
  exp_row(x.data(), y.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double expected = std::exp(static_cast<double>(x[i]));
    EXPECT_NEAR(y[i] / expected, 1.0, 1e-6) << "x=" << x[i];
  }
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> edge(32, -inf);
  edge[1] = -100.0f;
  edge[2] = 200.0f;
  std::vector<float> out(edge.size());
  exp_row(edge.data(), out.data(), static_cast<int64_t>(edge.size()));
  EXPECT_EQ(out[0], 0.0f);  // -inf
  EXPECT_GE(out[1], 0.0f);  // e^-100: 0 or the subnormal 3.7e-44
  EXPECT_LT(out[1], 1e-37f);
  EXPECT_TRUE(std::isfinite(out[2]));
  EXPECT_GT(out[2], 1e38f);
}

TEST(KernelsTest, RmsNormMatchesDouble) {
  Rng rng(1);
  for (int64_t n : {1, 15, 16, 64, 100, 1024}) {
    const std::vector<float> x = random_vector(rng, static_cast<size_t>(n), 3.0);
    const std::vector<float> w = random_vector(rng, static_cast<size_t>(n));
    std::vector<float> y(static_cast<size_t>(n));
    rmsnorm_row(x.data(), w.data(), y.data(), n, 1e-5f);
    double ss = 0;
    for (float v : x) ss += static_cast<double>(v) * v;
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + 1e-5);
    for (int64_t i = 0; i < n; ++i) {
      const double expected = x[static_cast<size_t>(i)] * inv * w[static_cast<size_t>(i)];
      EXPECT_NEAR(y[static_cast<size_t>(i)], expected, 1e-5 * (1.0 + std::fabs(expected)));
    }
  }
}

TEST(KernelsTest, SiluMulMatchesDouble) {
  Rng rng(2);
  const int64_t n = 203;
  std::vector<float> g = random_vector(rng, static_cast<size_t>(n), 5.0);
  g[0] = -120.0f;  // saturated exponent
  g[1] = 120.0f;
  const std::vector<float> u = random_vector(rng, static_cast<size_t>(n));
  std::vector<float> out(static_cast<size_t>(n));
  silu_mul_row(g.data(), u.data(), out.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double gd = g[static_cast<size_t>(i)];
    const double expected = gd / (1.0 + std::exp(-gd)) * u[static_cast<size_t>(i)];
    EXPECT_NEAR(out[static_cast<size_t>(i)], expected, 1e-5 * (1.0 + std::fabs(expected)));
  }
}

TEST(KernelsTest, RopeRotatesHalves) {
  ModelConfig c;
  c.head_dim = 40;  // 20 pairs: one vector and a scalar tail
  c.rope_theta = 10000.0;
  const RopeTable table(c);
  ASSERT_EQ(table.half_dim(), 20);
  EXPECT_DOUBLE_EQ(table.inv_freq()[0], 1.0);
  EXPECT_NEAR(table.inv_freq()[10], std::pow(10000.0, -0.5), 1e-15);
  Rng rng(3);
  std::vector<float> head = random_vector(rng, 40);
  const std::vector<float> original = head;
  std::vector<float> cos(20), sin(20);
  table.angles(1234, cos.data(), sin.data());
  rope_apply(head.data(), cos.data(), sin.data(), 20);
  for (int i = 0; i < 20; ++i) {
    const double a = 1234.0 * table.inv_freq()[static_cast<size_t>(i)];
    const double x1 = original[static_cast<size_t>(i)];
    const double x2 = original[static_cast<size_t>(i + 20)];
    EXPECT_NEAR(head[static_cast<size_t>(i)], x1 * std::cos(a) - x2 * std::sin(a), 1e-5);
    EXPECT_NEAR(head[static_cast<size_t>(i + 20)], x2 * std::cos(a) + x1 * std::sin(a), 1e-5);
  }
}

TEST(KernelsTest, Llama3RopeScalingFollowsTransformers) {
  // Llama 3.1 8B's scaling: factor 8, low 1, high 4, original context 8192.
  ModelConfig c;
  c.head_dim = 128;
  c.rope_theta = 500000.0;
  c.rope_scaling.type = RopeScalingType::kLlama3;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 8192;
  const RopeTable table(c);
  const double pi = 3.14159265358979323846;
  int high = 0, low = 0, medium = 0;
  for (int i = 0; i < 64; ++i) {
    const double base = std::pow(500000.0, -2.0 * i / 128.0);
    const double wavelen = 2 * pi / base;
    const double got = table.inv_freq()[static_cast<size_t>(i)];
    if (wavelen < 8192.0 / 4.0) {
      EXPECT_DOUBLE_EQ(got, base);
      ++high;
    } else if (wavelen > 8192.0) {
      EXPECT_DOUBLE_EQ(got, base / 8.0);
      ++low;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / 3.0;
      EXPECT_NEAR(got, (1 - smooth) * base / 8.0 + smooth * base, 1e-15);
      ++medium;
    }
  }
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(medium, 0);
}

TEST(ThreadPoolTest, RunsEveryTaskOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t tasks : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(tasks));
      std::atomic<bool> bad_thread{false};
      pool.run(tasks, [&](int64_t t, int thread) {
        hits[static_cast<size_t>(t)].fetch_add(1);
        if (thread < 0 || thread >= threads) bad_thread = true;
      });
      for (auto& h : hits) EXPECT_EQ(h.load(), 1);
      EXPECT_FALSE(bad_thread.load());
    }
    std::vector<int> per_thread(static_cast<size_t>(threads), 0);
    pool.run_on_all([&](int thread) { per_thread[static_cast<size_t>(thread)] += 1; });
    EXPECT_EQ(std::accumulate(per_thread.begin(), per_thread.end(), 0), threads);
  }
}

// Back-to-back small jobs: the caller often finishes a job before a worker wakes, so
// late workers meet the next job; no task may be lost or run twice.
TEST(ThreadPoolTest, ManySmallJobsNeverLoseOrRepeatTasks) {
  ThreadPool pool(3);
  const char* sanitizer = std::getenv("STRATA_SANITIZER_BUILD");
  const int jobs = sanitizer != nullptr && std::string(sanitizer) == "1" ? 2000 : 20000;
  std::vector<int> counts(5);
  int64_t total = 0;
  for (int j = 0; j < jobs; ++j) {
    const int64_t tasks = 2 + j % 4;
    std::fill(counts.begin(), counts.end(), 0);
    pool.run(tasks, [&](int64_t t, int) { counts[static_cast<size_t>(t)] += 1; });
    for (int64_t t = 0; t < tasks; ++t) ASSERT_EQ(counts[static_cast<size_t>(t)], 1) << j;
    for (int64_t t = tasks; t < 5; ++t) ASSERT_EQ(counts[static_cast<size_t>(t)], 0) << j;
    total += tasks;
  }
  EXPECT_GT(total, 0);
}

class MatmulTest : public ::testing::TestWithParam<WeightDtype> {};

TEST_P(MatmulTest, MatchesDoubleForEveryPath) {
  const WeightDtype dtype = GetParam();
  Rng rng(4);
  ThreadPool pool(2);
  Matmul matmul(2);
  for (int64_t k : {40, 64, 129}) {
    for (int64_t n : {1, 5, 37, 100}) {
      WeightMatrix w(n, k, dtype);
      for (int64_t r = 0; r < n; ++r) {
        const std::vector<float> row = random_vector(rng, static_cast<size_t>(k));
        w.set_row(r, row.data());
      }
      for (int64_t m : {1, 2, 3, 4, 5, 7, 8, 9, 33, 64, 65}) {
        const int64_t lda = k + 3;
        const int64_t ldc = n + 2;
        const std::vector<float> a = random_vector(rng, static_cast<size_t>(m * lda));
        std::vector<float> c = random_vector(rng, static_cast<size_t>(m * ldc));
        const std::vector<float> c0 = c;
        for (bool accumulate : {false, true}) {
          c = c0;
          matmul.run(pool, a.data(), m, lda, w, c.data(), ldc, accumulate);
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double expected = accumulate ? c0[static_cast<size_t>(i * ldc + j)] : 0.0;
              for (int64_t t = 0; t < k; ++t) {
                // BF16 weights multiply activations rounded to BF16.
                float av = a[static_cast<size_t>(i * lda + t)];
                if (dtype == WeightDtype::kBF16) av = bf16_to_f32(f32_to_bf16(av));
                expected += static_cast<double>(av) * w.at(j, t);
              }
              ASSERT_NEAR(c[static_cast<size_t>(i * ldc + j)], expected, 1e-4 * std::sqrt(k))
                  << "m=" << m << " n=" << n << " k=" << k << " acc=" << accumulate;
            }
            // Padding columns beyond n are left alone.
            for (int64_t j = n; j < ldc; ++j) {
              ASSERT_EQ(c[static_cast<size_t>(i * ldc + j)], c0[static_cast<size_t>(i * ldc + j)]);
            }
          }
        }
      }
    }
  }
}

}  // namespace

// gtest prints values without PrintTo as raw bytes ("1-byte object <00>"), and CTest's
// gtest_discover_tests puts that in test names. ADL finds this one in WeightDtype's namespace.
inline void PrintTo(WeightDtype dtype, std::ostream* os) {
  *os << weight_dtype_name(dtype);
}

namespace {

INSTANTIATE_TEST_SUITE_P(Dtypes, MatmulTest,
                         ::testing::Values(WeightDtype::kF32, WeightDtype::kBF16));

struct AttentionCase {
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t page_size;
  int64_t window;
  KvDtype dtype;
};

// Deterministic print (the default dumps raw bytes, uninitialized padding included), also
// used as the test name: e.g. h8_kv4_d64_p16_w0_f32.
void PrintTo(const AttentionCase& c, std::ostream* os) {
  *os << "h" << c.num_heads << "_kv" << c.num_kv_heads << "_d" << c.head_dim << "_p" << c.page_size
      << "_w" << c.window << "_" << kv_dtype_name(c.dtype);
}

class PagedAttentionTest : public ::testing::TestWithParam<AttentionCase> {};

// Fills a pool with random K/V for two sequences on shuffled pages, runs attention for
// a mix of a long prefill chunk on top of cached positions, a short chunk and a decode
// step, and compares with softmax(q k^T) v in double over the values as stored.
TEST_P(PagedAttentionTest, MatchesNaiveSoftmax) {
  const AttentionCase p = GetParam();
  Rng rng(5);
  const int32_t num_pages = 2 * (400 / p.page_size + 4);
  KvPool pool(1, p.num_kv_heads, p.head_dim, num_pages, p.page_size, p.dtype);
  std::vector<PageId> free_pages;
  for (int32_t i = 0; i < num_pages; ++i) free_pages.push_back(make_page_id(i));
  for (size_t i = free_pages.size(); i > 1; --i) {
    std::swap(free_pages[i - 1], free_pages[rng.next() % i]);
  }
  struct Seq {
    int64_t start;
    int32_t tokens;
    std::vector<PageId> pages;
  };
  std::vector<Seq> seqs = {{37, 90, {}}, {5, 3, {}}, {200, 1, {}}, {0, 9, {}}};
  size_t next_page = 0;
  for (Seq& s : seqs) {
    const int64_t end = s.start + s.tokens;
    for (int64_t i = 0; i < (end + p.page_size - 1) / p.page_size; ++i) {
      s.pages.push_back(free_pages[next_page++]);
    }
  }
  ASSERT_LE(next_page, free_pages.size());
  // Random K/V for every position of every sequence, stored through the pool's dtype;
  // the reference reads them back so that storage rounding is not an error.
  const size_t hd = static_cast<size_t>(p.head_dim);
  const size_t kv_width = hd * static_cast<size_t>(p.num_kv_heads);
  for (const Seq& s : seqs) {
    for (int64_t pos = 0; pos < s.start + s.tokens; ++pos) {
      const std::vector<float> k = random_vector(rng, kv_width);
      const std::vector<float> v = random_vector(rng, kv_width);
      pool.write_token(0, s.pages[static_cast<size_t>(pos / p.page_size)],
                       static_cast<int32_t>(pos % p.page_size), k.data(), v.data());
    }
  }
  auto read = [&](bool value, const Seq& s, int64_t pos, int32_t h) {
    std::vector<float> k(kv_width), v(kv_width);
    pool.read_token(0, s.pages[static_cast<size_t>(pos / p.page_size)],
                    static_cast<int32_t>(pos % p.page_size), k.data(), v.data());
    const std::vector<float>& all = value ? v : k;
    return std::vector<float>(all.begin() + static_cast<std::ptrdiff_t>(h * hd),
                              all.begin() + static_cast<std::ptrdiff_t>((h + 1) * hd));
  };

  const int64_t q_stride = static_cast<int64_t>(p.num_heads) * p.head_dim + 8;
  int64_t total_rows = 0;
  std::vector<AttentionSequence> batch;
  for (const Seq& s : seqs) {
    batch.push_back(AttentionSequence{total_rows, s.tokens, s.start, s.pages});
    total_rows += s.tokens;
  }
  const std::vector<float> q = random_vector(rng, static_cast<size_t>(total_rows * q_stride));
  std::vector<float> out(static_cast<size_t>(total_rows * q_stride), -7.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  ThreadPool threads(2);
  PagedAttention attention(AttentionShape{p.num_heads, p.num_kv_heads, p.head_dim, p.window, scale},
                           2);
  attention.run(threads, batch, q.data(), q_stride, pool, 0, out.data(), q_stride);

  const int32_t group = p.num_heads / p.num_kv_heads;
  for (size_t si = 0; si < seqs.size(); ++si) {
    const Seq& s = seqs[si];
    for (int32_t t = 0; t < s.tokens; ++t) {
      const int64_t row = batch[si].first_row + t;
      const int64_t pos = s.start + t;
      const int64_t first = p.window > 0 ? std::max<int64_t>(0, pos - p.window + 1) : 0;
      for (int32_t h = 0; h < p.num_heads; ++h) {
        const float* qh = q.data() + row * q_stride + static_cast<int64_t>(h) * p.head_dim;
        std::vector<double> scores;
        double mx = -1e300;
        for (int64_t key = first; key <= pos; ++key) {
          const std::vector<float> k = read(false, s, key, h / group);
          double dot = 0;
          for (size_t d = 0; d < hd; ++d) dot += static_cast<double>(qh[d]) * k[d];
          scores.push_back(dot * scale);
          mx = std::max(mx, dot * scale);
        }
        double sum = 0;
        for (double& sc : scores) sum += (sc = std::exp(sc - mx));
        std::vector<double> expected(hd, 0.0);
        for (int64_t key = first; key <= pos; ++key) {
          const std::vector<float> v = read(true, s, key, h / group);
          for (size_t d = 0; d < hd; ++d)
            expected[d] += scores[static_cast<size_t>(key - first)] / sum * v[d];
        }
        const float* got = out.data() + row * q_stride + static_cast<int64_t>(h) * p.head_dim;
        // Paired BF16 pages round q and the probabilities to BF16 (8 significant bits,
        // relative error up to 2^-9 each).
        for (size_t d = 0; d < hd; ++d) {
          const double tolerance =
              pool.paired_bf16() ? 6e-3 * (1.0 + std::fabs(expected[d])) : 2e-5;
          ASSERT_NEAR(got[d], expected[d], tolerance)
              << "seq " << si << " token " << t << " head " << h << " dim " << d;
        }
      }
      // The padding after the last head is not written.
      EXPECT_EQ(out[static_cast<size_t>(row * q_stride + q_stride - 1)], -7.0f);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PagedAttentionTest,
    ::testing::Values(AttentionCase{8, 4, 64, 16, 0, KvDtype::kF32},   // the bench model
                      AttentionCase{4, 2, 16, 16, 0, KvDtype::kF32},   // tiny llama
                      AttentionCase{8, 2, 128, 16, 0, KvDtype::kF32},  // GQA 4, wide heads
                      AttentionCase{4, 4, 48, 7, 0, KvDtype::kF32},    // MHA, odd page size
                      AttentionCase{6, 2, 20, 5, 0, KvDtype::kF32},    // head_dim not /16
                      AttentionCase{8, 4, 64, 16, 50, KvDtype::kF32},  // sliding window
                      AttentionCase{8, 4, 64, 1, 0, KvDtype::kF32},    // page size 1
                      AttentionCase{8, 4, 64, 16, 0, KvDtype::kF16},
                      AttentionCase{8, 4, 64, 32, 0, KvDtype::kBF16},  // paired BF16
                      AttentionCase{8, 2, 128, 16, 40, KvDtype::kBF16},
                      AttentionCase{4, 2, 32, 5, 0, KvDtype::kBF16},  // unpaired BF16
                      // 8-bit pages, read directly (scales applied to scores and P) ...
                      AttentionCase{8, 4, 64, 16, 0, KvDtype::kInt8},
                      AttentionCase{8, 2, 128, 32, 40, KvDtype::kInt8},
                      AttentionCase{8, 4, 64, 16, 0, KvDtype::kFp8E4M3},
                      AttentionCase{8, 2, 128, 16, 40, KvDtype::kFp8E4M3},
                      // ... and through the gather path (odd page size, head_dim not /16)
                      AttentionCase{4, 4, 48, 7, 0, KvDtype::kInt8},
                      AttentionCase{6, 2, 20, 5, 0, KvDtype::kFp8E4M3}),
    [](const auto& info) { return ::testing::PrintToString(info.param); });

}  // namespace
}  // namespace strata
