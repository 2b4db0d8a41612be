// Sampling on the device (kernels.h's sample_rows): one block per row draws the row's token
// by the Sampler's rules (model/sampler.h) with the uniform number the host drew, so that a
// request samples alike on the CPU and here.
//
// The passes over a row:
//  1. its max (and argmax, ties to the smaller id), min, log-sum-exp and total weight
//     sum exp((l - max) / T);
//  2. when top_k, top_p or alternatives are asked: a value threshold s such that the tokens
//     with l >= s are at most kSampleCandidates and hold what is needed (top_k and the
//     alternatives by count; without top_k, top_p of the total weight), found by cutting
//     [min, max] into 8 at a time; those tokens are collected and sorted by rank (value, then
//     the smaller id) in shared memory, and top_k, top_p and the alternatives read there;
//  3. the draw: the kept tokens in id order (sorted again by id), or, with no filter, the
//     whole row in contiguous chunks, each thread's chunk weight summed, scanned across the
//     block, and walked by the thread whose range holds uniform x total.
// Where no threshold fits (ties or a nucleus wider than kSampleCandidates) the token is -1 and
// the host draws from the row's logits (docs/cuda.md, "Sampling on the GPU").
#include <cuda_runtime.h>

#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include "cuda/cuda_common.cuh"
#include "cuda/kernel_launch.h"

namespace strata::cuda::detail {

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kItems = kSampleCandidates / kThreads;  // 4 ranked tokens a thread
constexpr int kSplits = 8;                            // thresholds tried per pass
constexpr int kMaxPasses = 24;

static_assert(kItems * kThreads == kSampleCandidates, "candidates fill the block's items");

// Larger value, larger key (finite values; -0 as +0, since the Sampler compares values).
__device__ __forceinline__ uint32_t order_key(float v) {
  uint32_t b = __float_as_uint(v);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
// Rank order as one descending key: value, then the smaller id.
__device__ __forceinline__ uint64_t rank_key(float v, int id) {
  return (static_cast<uint64_t>(order_key(v)) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}
__device__ __forceinline__ int rank_id(uint64_t key) {
  return static_cast<int>(0xffffffffu - static_cast<uint32_t>(key));
}
__device__ __forceinline__ float rank_value(uint64_t key) {
  return key_value(static_cast<uint32_t>(key >> 32));
}

__device__ __forceinline__ double warp_sum_d(double v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

using RankSort = cub::BlockRadixSort<uint64_t, kThreads, kItems>;
using IdSort = cub::BlockRadixSort<uint32_t, kThreads, kItems, float>;
using Scan = cub::BlockScan<double, kThreads>;

struct Shared {
  union {
    typename RankSort::TempStorage rank_sort;
    typename IdSort::TempStorage id_sort;
    typename Scan::TempStorage scan;
  };
  uint64_t cand[kSampleCandidates];
  double before[kThreads];
  double partial[kWarps][2 * kSplits];
  double sums[2 * kSplits];
  float split[kSplits + 1];
  float best[kWarps], low[kWarps];
  int best_id[kWarps];
  float max_value, min_value;
  int argmax, count, cut, token, last;
  float threshold;
  int outcome;  // 0: searching, 1: threshold found, 2: cannot (token -1)
};

// Sums N doubles over the block in a fixed order (deterministic); every thread gets them.
template <int N>
__device__ void block_sums(double (&v)[N], Shared& sh) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < N; ++j) v[j] = warp_sum_d(v[j]);
  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < N; ++j) sh.partial[warp][j] = v[j];
  }
  __syncthreads();
  if (threadIdx.x < N) {
    double s = 0.0;
    for (int w = 0; w < kWarps; ++w) s += sh.partial[w][threadIdx.x];
    sh.sums[threadIdx.x] = s;
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < N; ++j) v[j] = sh.sums[j];
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads, 1) sample_rows_kernel(SampleRowsArgs a) {
  __shared__ Shared sh;
  const int row_index = blockIdx.x;
  const SampleRowArg p = a.params[row_index];
  const int cols = a.cols;
  const float* row = a.logits + static_cast<size_t>(row_index) * cols;
  const int tid = threadIdx.x;
  if (!(p.flags & kSampleDraw)) {
    if (tid == 0) a.tokens[row_index] = -1;
    return;
  }
  const bool greedy = p.temperature == 0.0f;
  const float inv_t = greedy ? 0.0f : 1.0f / p.temperature;

  // 1. Max with argmax (ties to the smaller id), min.
  float best = -INFINITY, low = INFINITY;
  int at = cols;
  for (int i = tid; i < cols; i += kThreads) {
    const float v = row[i];
    if (v > best || (at == cols && v == best)) {
      best = v;
      at = i;
    }
    low = fminf(low, v);
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_down_sync(0xffffffffu, best, offset);
    const int oi = __shfl_down_sync(0xffffffffu, at, offset);
    if (ov > best || (ov == best && oi < at)) {
      best = ov;
      at = oi;
    }
    low = fminf(low, __shfl_down_sync(0xffffffffu, low, offset));
  }
  if ((tid & 31) == 0) {
    sh.best[tid >> 5] = best;
    sh.best_id[tid >> 5] = at;
    sh.low[tid >> 5] = low;
  }
  __syncthreads();
  if (tid == 0) {
    float b = sh.best[0], l = sh.low[0];
    int i = sh.best_id[0];
    for (int w = 1; w < kWarps; ++w) {
      if (sh.best[w] > b || (sh.best[w] == b && sh.best_id[w] < i)) {
        b = sh.best[w];
        i = sh.best_id[w];
      }
      l = fminf(l, sh.low[w]);
    }
    sh.max_value = b;
    sh.argmax = i < cols ? i : 0;
    sh.min_value = l;
  }
  __syncthreads();
  const float m = sh.max_value;
  const float lo_value = sh.min_value;

  // Log-sum-exp of the raw row, and the total weight at the temperature.
  double totals[2] = {0.0, 0.0};
  for (int i = tid; i < cols; i += kThreads) {
    const float v = row[i];
    totals[0] += static_cast<double>(expf(v - m));
    if (!greedy) totals[1] += static_cast<double>(expf((v - m) * inv_t));
  }
  block_sums<2>(totals, sh);
  const double lse = static_cast<double>(m) + log(totals[0]);
  const double row_weight = totals[1];

  const bool top_k = !greedy && p.top_k > 0 && p.top_k < cols;
  const bool top_p = !greedy && p.top_p < 1.0f;
  const int top_n = p.top_logprobs;
  const int need_count = max(top_k ? p.top_k : 0, top_n);
  // Without top_k, top_p's nucleus must lie inside the candidates: their weight reaches it.
  const double need_weight = top_p && !top_k ? static_cast<double>(p.top_p) * row_weight : 0.0;
  const bool want_candidates = top_k || top_p || top_n > 0;

  int n = 0;  // candidates, ranked in sh.cand[0, n)
  if (want_candidates) {
    if (tid == 0) {
      sh.outcome = need_count > kSampleCandidates ? 2 : (cols <= kSampleCandidates ? 1 : 0);
      sh.threshold = lo_value;
    }
    __syncthreads();
    // 2. The threshold: cond(s) = count(l >= s) >= need_count and weight(l >= s) >=
    // need_weight holds at lo (every token) and is searched upward while too many pass.
    float lo = lo_value, hi = m;
    for (int pass = 0; pass < kMaxPasses && sh.outcome == 0; ++pass) {
      if (tid == 0) {
        for (int j = 1; j < kSplits; ++j) {
          sh.split[j] = lo + (hi - lo) * (static_cast<float>(j) / kSplits);
        }
        sh.split[kSplits] = hi;
      }
      __syncthreads();
      float split[kSplits + 1];
#pragma unroll
      for (int j = 1; j <= kSplits; ++j) split[j] = sh.split[j];
      int count[kSplits] = {};
      float weight[kSplits] = {};
      for (int i = tid; i < cols; i += kThreads) {
        const float v = row[i];
        const float w = need_weight > 0.0 ? expf((v - m) * inv_t) : 0.0f;
#pragma unroll
        for (int j = 0; j < kSplits; ++j) {
          if (v >= split[j + 1]) {
            ++count[j];
            weight[j] += w;
          }
        }
      }
      double sums[2 * kSplits];
#pragma unroll
      for (int j = 0; j < kSplits; ++j) {
        sums[j] = count[j];
        sums[kSplits + j] = weight[j];
      }
      block_sums<2 * kSplits>(sums, sh);
      if (tid == 0) {
        int pick = 0;  // the highest split where cond holds (0: only lo)
        for (int j = kSplits; j >= 1; --j) {
          if (sh.sums[j - 1] >= need_count && sh.sums[kSplits + j - 1] >= need_weight) {
            pick = j;
            break;
          }
        }
        if (pick > 0 && sh.sums[pick - 1] <= kSampleCandidates) {
          sh.threshold = sh.split[pick];
          sh.outcome = 1;
        } else if (pick == kSplits) {
          sh.outcome = 2;  // ties at the max wider than the candidates
        } else {
          const float next_lo = pick == 0 ? lo : sh.split[pick];
          const float next_hi = sh.split[pick + 1];
          // Nothing left to cut: ties, or a nucleus wider than the candidates.
          if (!(next_lo < next_hi) || (next_lo == lo && next_hi == hi)) sh.outcome = 2;
          sh.split[0] = next_lo;
          sh.split[kSplits] = next_hi;
        }
      }
      __syncthreads();
      lo = sh.split[0];
      hi = sh.split[kSplits];
      if (pass == kMaxPasses - 1 && tid == 0 && sh.outcome == 0) sh.outcome = 2;
      __syncthreads();
    }
    __syncthreads();
    if (sh.outcome == 2) {
      if (tid == 0) a.tokens[row_index] = -1;
      return;
    }
    // Collect the tokens at or above the threshold and rank them.
    if (tid == 0) sh.count = 0;
    for (int i = tid; i < kSampleCandidates; i += kThreads) sh.cand[i] = 0;
    __syncthreads();
    const float s = sh.threshold;
    for (int i = tid; i < cols; i += kThreads) {
      const float v = row[i];
      if (v >= s) {
        const int at = atomicAdd(&sh.count, 1);
        if (at < kSampleCandidates) sh.cand[at] = rank_key(v, i);  // the search counted them
      }
    }
    __syncthreads();
    n = min(sh.count, kSampleCandidates);
    uint64_t keys[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) keys[k] = sh.cand[tid * kItems + k];
    __syncthreads();
    RankSort(sh.rank_sort).SortDescending(keys);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kItems; ++k) sh.cand[tid * kItems + k] = keys[k];
    __syncthreads();
    // The alternatives: the first top_n ranked.
    if (tid < top_n && tid < n) {
      const uint64_t key = sh.cand[tid];
      a.top_ids[row_index * kSampleMaxTop + tid] = rank_id(key);
      a.top_logprobs[row_index * kSampleMaxTop + tid] =
          static_cast<float>(static_cast<double>(rank_value(key)) - lse);
    }
  }

  int token = sh.argmax;
  if (!greedy) {
    if (top_k || top_p) {
      // Kept: the first `kept` ranked (top_k), then top_p's prefix of them.
      const int kept = top_k ? p.top_k : n;
      if (tid == 0) sh.cut = kept;
      __syncthreads();
      if (top_p) {
        double w[kItems];
#pragma unroll
        for (int k = 0; k < kItems; ++k) {
          const int j = tid * kItems + k;
          w[k] = j < kept ? static_cast<double>(expf((rank_value(sh.cand[j]) - m) * inv_t)) : 0.0;
        }
        double inclusive[kItems];
        double kept_weight = 0.0;
        Scan(sh.scan).InclusiveSum(w, inclusive, kept_weight);
        // The Sampler's cut: the first prefix whose running sum reaches the target, i.e. one
        // past the ranked tokens whose running sum is still below it.
        const double target = static_cast<double>(p.top_p) * (top_k ? kept_weight : row_weight);
        if (tid == 0) sh.cut = 1;
        __syncthreads();
        int below = 0;
#pragma unroll
        for (int k = 0; k < kItems; ++k) below += tid * kItems + k < kept && inclusive[k] < target;
        if (below > 0) atomicAdd(&sh.cut, below);
        __syncthreads();
        if (tid == 0) sh.cut = min(sh.cut, kept);
        __syncthreads();
      }
      const int cut = sh.cut;
      // The kept tokens in id order, and the walk.
      uint32_t ids[kItems];
      float values[kItems];
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        const int j = tid * kItems + k;
        ids[k] = j < cut ? static_cast<uint32_t>(rank_id(sh.cand[j])) : 0xffffffffu;
        values[k] = j < cut ? rank_value(sh.cand[j]) : 0.0f;
      }
      __syncthreads();
      IdSort(sh.id_sort).Sort(ids, values);
      __syncthreads();
      double w[kItems];
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        w[k] = ids[k] != 0xffffffffu ? static_cast<double>(expf((values[k] - m) * inv_t)) : 0.0;
      }
      double inclusive[kItems];
      double total = 0.0;
      Scan(sh.scan).InclusiveSum(w, inclusive, total);
      // The token: the first whose running sum exceeds r, i.e. the one after those whose
      // running sum is at most r; past the end (rounding), the last with weight.
      if (tid == 0) {
        sh.count = 0;
        sh.last = -1;
      }
      __syncthreads();
      const double r = p.uniform * total;
      int at_most = 0;
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        at_most += ids[k] != 0xffffffffu && inclusive[k] <= r;
        if (w[k] > 0.0) atomicMax(&sh.last, static_cast<int>(ids[k]));
      }
      if (at_most > 0) atomicAdd(&sh.count, at_most);
      __syncthreads();
      const int pick = sh.count;
      if (tid == 0) sh.token = -1;
      __syncthreads();
#pragma unroll
      for (int k = 0; k < kItems; ++k) {
        if (tid * kItems + k == pick && pick < cut) sh.token = static_cast<int>(ids[k]);
      }
      __syncthreads();
      token = sh.token >= 0 ? sh.token : sh.last;
    } else {
      // No filter: the whole row in id order, a contiguous chunk a thread.
      const int chunk = (cols + kThreads - 1) / kThreads;
      const int begin = min(cols, tid * chunk);
      const int end = min(cols, begin + chunk);
      double own = 0.0;
      for (int i = begin; i < end; ++i) own += static_cast<double>(expf((row[i] - m) * inv_t));
      double before = 0.0, total = 0.0;
      Scan(sh.scan).ExclusiveSum(own, before, total);
      sh.before[tid] = before;
      if (tid == 0) {
        sh.token = -1;
        sh.last = -1;
      }
      __syncthreads();
      const double r = p.uniform * total;
      // The chunk holding r: the last whose running sum before it is at most r.
      const bool owner = before <= r && (tid == kThreads - 1 || sh.before[tid + 1] > r);
      if (owner) {
        const double local = r - before;
        double cum = 0.0;
        int last = -1;
        for (int i = begin; i < end; ++i) {
          const double w = static_cast<double>(expf((row[i] - m) * inv_t));
          cum += w;
          if (w > 0.0) last = i;
          if (local < cum) {
            sh.token = i;
            break;
          }
        }
        sh.last = last;  // past its end (rounding): its last token with weight
      }
      __syncthreads();
      token = sh.token >= 0 ? sh.token : (sh.last >= 0 ? sh.last : sh.argmax);
    }
  }
  if (tid == 0) {
    a.tokens[row_index] = token;
    if ((p.flags & kSampleLogprob) != 0 || top_n > 0) {
      a.logprobs[row_index] = static_cast<float>(static_cast<double>(row[token]) - lse);
    }
  }
}

}  // namespace

int launch_sample_rows(const SampleRowsArgs& args, StreamHandle stream) {
  sample_rows_kernel<<<args.rows, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(args);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace strata::cuda::detail
