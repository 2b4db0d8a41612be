// The launchers' argument checks (the same with and without CUDA), then the CUDA units'
// launches (kernel_launch.h), or kUnsupported in a build without CUDA.
#include "cuda/kernels.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#ifdef STRATA_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/cuda_status.h"
#include "cuda/kernel_launch.h"
#endif

namespace strata::cuda {

namespace {

constexpr int32_t kMaxSplits = 64;
constexpr int32_t kMaxGroup = 8;
constexpr int32_t kMinKeysPerSplit = 256;
constexpr int32_t kExtendRows = 32;    // extend_attention.cuh's kExtendRows
constexpr int32_t kExtendTcRows = 64;  // extend_attention_tc.cuh's kTcRows

[[maybe_unused]] Status unsupported_build() {
  return std::unexpected(Error{ErrorCode::kUnsupported,
                               "this strata was built without CUDA (STRATA_CUDA=OFF, or nvcc was "
                               "not found when it was configured)"});
}

#ifdef STRATA_HAVE_CUDA
// A launcher's cudaError_t as a Status.
Status launched(int code, const char* what) {
  if (code == 0) return {};
  return std::unexpected(detail::cuda_error(static_cast<cudaError_t>(code), what));
}
#endif

Status check_rows(int32_t rows, int32_t dim, const char* what) {
  if (rows < 0) return bad_argument(fmt::format("{}: rows must be >= 0, got {}", what, rows));
  if (dim < 1) return bad_argument(fmt::format("{}: dim must be >= 1, got {}", what, dim));
  return {};
}

// The shape checks decode and extend attention share: heads, grouping, head size, pages.
Status check_attention_shape(const char* what, int32_t num_heads, int32_t num_kv_heads,
                             int32_t head_dim, int32_t page_size, int32_t page_table_stride) {
  if (num_heads < 1 || num_kv_heads < 1 || page_size < 1) {
    return bad_argument(fmt::format("{}: num_heads {}, num_kv_heads {}, page_size {} (>= 1)", what,
                                    num_heads, num_kv_heads, page_size));
  }
  if (num_heads % num_kv_heads != 0) {
    return bad_argument(fmt::format("{}: {} query heads are not a multiple of {} KV heads", what,
                                    num_heads, num_kv_heads));
  }
  if (num_heads / num_kv_heads > kMaxGroup) {
    return std::unexpected(
        Error{ErrorCode::kUnsupported,
              fmt::format("{}: {} query heads per KV head; the kernel handles 1 to {}", what,
                          num_heads / num_kv_heads, kMaxGroup)});
  }
  if (head_dim != 64 && head_dim != 128) {
    return std::unexpected(Error{
        ErrorCode::kUnsupported,
        fmt::format("{}: head_dim {}; the kernels are built for 64 and 128", what, head_dim)});
  }
  if (page_table_stride < 1) {
    return bad_argument(fmt::format("{}: page_table_stride must be >= 1", what));
  }
  return {};
}

}  // namespace

size_t decode_attention_workspace_floats(int32_t num_seqs, int32_t num_heads, int32_t head_dim,
                                         int32_t num_splits) {
  return static_cast<size_t>(std::max(num_seqs, 0)) * static_cast<size_t>(std::max(num_heads, 0)) *
         static_cast<size_t>(std::max(num_splits, 0)) *
         static_cast<size_t>(std::max(head_dim, 0) + 2);
}

int32_t decode_attention_splits(int32_t num_seqs, int32_t num_kv_heads, int32_t max_seq_len,
                                int32_t multiprocessors) {
  const int64_t blocks = static_cast<int64_t>(num_seqs) * num_kv_heads;
  if (blocks <= 0 || blocks >= multiprocessors) return 1;
  const int64_t want = (multiprocessors + blocks - 1) / blocks;
  const int64_t by_length = std::max<int64_t>(1, max_seq_len / kMinKeysPerSplit);
  return static_cast<int32_t>(std::clamp<int64_t>(std::min(want, by_length), 1, kMaxSplits));
}

Status fused_add_rms_norm(uint16_t* x, float* residual, const uint16_t* weight, int32_t rows,
                          int32_t dim, float eps, StreamHandle stream) {
  if (auto st = check_rows(rows, dim, "fused_add_rms_norm"); !st) return st;
  if (rows == 0) return {};
#ifdef STRATA_HAVE_CUDA
  return launched(detail::launch_fused_add_rms_norm(x, residual, weight, rows, dim, eps, stream),
                  "fused_add_rms_norm");
#else
  (void)x, (void)residual, (void)weight, (void)eps, (void)stream;
  return unsupported_build();
#endif
}

Status rms_norm(const uint16_t* x, uint16_t* y, const uint16_t* weight, int32_t rows, int32_t dim,
                float eps, StreamHandle stream) {
  if (auto st = check_rows(rows, dim, "rms_norm"); !st) return st;
  if (rows == 0) return {};
#ifdef STRATA_HAVE_CUDA
  return launched(detail::launch_rms_norm(x, y, weight, rows, dim, eps, stream), "rms_norm");
#else
  (void)x, (void)y, (void)weight, (void)eps, (void)stream;
  return unsupported_build();
#endif
}

Status silu_mul(const uint16_t* gate_up, uint16_t* out, int32_t rows, int32_t inter,
                StreamHandle stream) {
  if (auto st = check_rows(rows, inter, "silu_mul"); !st) return st;
  if (rows == 0) return {};
#ifdef STRATA_HAVE_CUDA
  return launched(detail::launch_silu_mul(gate_up, out, rows, inter, stream), "silu_mul");
#else
  (void)gate_up, (void)out, (void)stream;
  return unsupported_build();
#endif
}

Status gather_rows(const uint16_t* src, const int32_t* index, uint16_t* dst, int32_t rows,
                   int32_t cols, StreamHandle stream) {
  if (auto st = check_rows(rows, cols, "gather_rows"); !st) return st;
  if (rows == 0) return {};
  if (src == nullptr || index == nullptr || dst == nullptr) {
    return bad_argument("gather_rows: a null pointer");
  }
#ifdef STRATA_HAVE_CUDA
  return launched(detail::launch_gather_rows(src, index, dst, rows, cols, stream), "gather_rows");
#else
  (void)stream;
  return unsupported_build();
#endif
}

Status add_bias(uint16_t* x, const float* bias, int32_t rows, int32_t cols, StreamHandle stream) {
  if (auto st = check_rows(rows, cols, "add_bias"); !st) return st;
  if (rows == 0) return {};
  if (x == nullptr || bias == nullptr) return bad_argument("add_bias: a null pointer");
#ifdef STRATA_HAVE_CUDA
  return launched(detail::launch_add_bias(x, bias, rows, cols, stream), "add_bias");
#else
  (void)stream;
  return unsupported_build();
#endif
}

Result<SampleRowArg> sample_row_arg(double uniform, float temperature, int32_t top_k, float top_p,
                                    int32_t top_logprobs, bool logprob) {
  if (!(uniform >= 0.0 && uniform < 1.0)) {
    return std::unexpected(Error{ErrorCode::kInvalidArgument,
                                 fmt::format("sample_rows: uniform {} outside [0, 1)", uniform)});
  }
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return std::unexpected(
        Error{ErrorCode::kInvalidArgument,
              fmt::format("sample_rows: temperature {} (finite, >= 0)", temperature)});
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return std::unexpected(Error{ErrorCode::kInvalidArgument,
                                 fmt::format("sample_rows: top_p {} outside (0, 1]", top_p)});
  }
  if (top_logprobs < 0 || top_logprobs > kSampleMaxTop) {
    return std::unexpected(Error{
        ErrorCode::kInvalidArgument,
        fmt::format("sample_rows: top_logprobs {} outside 0..{}", top_logprobs, kSampleMaxTop)});
  }
  SampleRowArg a;
  a.uniform = uniform;
  a.temperature = temperature;
  a.top_k = top_k;
  a.top_p = top_p;
  a.top_logprobs = top_logprobs;
  a.flags = kSampleDraw | (logprob ? kSampleLogprob : 0);
  return a;
}

Status sample_rows(const SampleRowsArgs& args, StreamHandle stream) {
  if (auto st = check_rows(args.rows, args.cols, "sample_rows"); !st) return st;
  if (args.rows == 0) return {};
  if (args.logits == nullptr || args.params == nullptr || args.tokens == nullptr ||
      args.logprobs == nullptr || args.top_ids == nullptr || args.top_logprobs == nullptr) {
    return bad_argument("sample_rows: a null pointer");
  }
#ifdef STRATA_HAVE_CUDA
  return launched(detail::launch_sample_rows(args, stream), "sample_rows");
#else
  (void)stream;
  return unsupported_build();
#endif
}

Status decode_attention(const DecodeAttentionArgs& a, StreamHandle stream) {
  if (a.num_seqs < 0) {
    return bad_argument(fmt::format("decode_attention: num_seqs {} (>= 0)", a.num_seqs));
  }
  if (auto st = check_attention_shape("decode_attention", a.num_heads, a.num_kv_heads, a.head_dim,
                                      a.page_size, a.page_table_stride);
      !st) {
    return st;
  }
  if (a.q_stride != 0 && a.q_stride < a.num_heads * a.head_dim) {
    return bad_argument(fmt::format("decode_attention: q_stride {} < num_heads x head_dim {}",
                                    a.q_stride, a.num_heads * a.head_dim));
  }
  if (a.num_splits < 1 || a.num_splits > kMaxSplits) {
    return bad_argument(
        fmt::format("decode_attention: num_splits {} not in [1, {}]", a.num_splits, kMaxSplits));
  }
  if (a.num_seqs == 0) return {};
  if (a.q == nullptr || a.k_pages == nullptr || a.v_pages == nullptr || a.page_table == nullptr ||
      a.seq_lens == nullptr || a.out == nullptr || a.workspace == nullptr) {
    return bad_argument("decode_attention: a null pointer");
  }
#ifdef STRATA_HAVE_CUDA
  return launched(a.head_dim == 64 ? detail::launch_decode_attention_d64(a, stream)
                                   : detail::launch_decode_attention_d128(a, stream),
                  "decode_attention");
#else
  (void)stream;
  return unsupported_build();
#endif
}

int32_t extend_attention_tile_tokens(int32_t group, ExtendKernel kernel) {
  return (kernel == ExtendKernel::kTensorCores ? kExtendTcRows : kExtendRows) /
         std::clamp(group, 1, kMaxGroup);
}

ExtendTiles plan_extend_tiles(std::span<const int32_t> new_tokens, int32_t group,
                              ExtendKernel kernel) {
  const int32_t per_tile = extend_attention_tile_tokens(group, kernel);
  ExtendTiles tiles;
  for (size_t s = 0; s < new_tokens.size(); ++s) {
    for (int32_t first = 0; first < new_tokens[s]; first += per_tile) {
      tiles.seq.push_back(static_cast<int32_t>(s));
      tiles.first.push_back(first);
    }
  }
  return tiles;
}

Status extend_attention(const ExtendAttentionArgs& a, StreamHandle stream, ExtendKernel kernel) {
  if (a.num_seqs < 0 || a.num_tiles < 0) {
    return bad_argument(
        fmt::format("extend_attention: num_seqs {}, num_tiles {} (>= 0)", a.num_seqs, a.num_tiles));
  }
  if (auto st = check_attention_shape("extend_attention", a.num_heads, a.num_kv_heads, a.head_dim,
                                      a.page_size, a.page_table_stride);
      !st) {
    return st;
  }
  if (a.q_stride != 0 && a.q_stride < a.num_heads * a.head_dim) {
    return bad_argument(fmt::format("extend_attention: q_stride {} < num_heads x head_dim {}",
                                    a.q_stride, a.num_heads * a.head_dim));
  }
  if (a.num_tiles == 0) return {};
  if (a.q == nullptr || a.k_pages == nullptr || a.v_pages == nullptr || a.page_table == nullptr ||
      a.qo_start == nullptr || a.kv_lens == nullptr || a.tile_seq == nullptr ||
      a.tile_first == nullptr || a.out == nullptr) {
    return bad_argument("extend_attention: a null pointer");
  }
  const bool tc = kernel == ExtendKernel::kTensorCores;
  if (tc && (a.q_stride > 0 ? a.q_stride : a.num_heads * a.head_dim) % 8 != 0) {
    return bad_argument(fmt::format(
        "extend_attention on tensor cores: q_stride {} is not a multiple of 8", a.q_stride));
  }
#ifdef STRATA_HAVE_CUDA
  if (tc) {
    return launched(a.head_dim == 64 ? detail::launch_extend_attention_tc_d64(a, stream)
                                     : detail::launch_extend_attention_tc_d128(a, stream),
                    "extend_attention (tensor cores)");
  }
  return launched(a.head_dim == 64 ? detail::launch_extend_attention_d64(a, stream)
                                   : detail::launch_extend_attention_d128(a, stream),
                  "extend_attention");
#else
  (void)stream;
  return unsupported_build();
#endif
}

Status qk_norm_rope_store(const QkNormRopeStoreArgs& a, StreamHandle stream) {
  if (a.num_tokens < 0 || a.num_heads < 1 || a.num_kv_heads < 1 || a.page_size < 1) {
    return bad_argument(fmt::format(
        "qk_norm_rope_store: num_tokens {} (>= 0), num_heads {}, num_kv_heads {}, page_size {} "
        "(>= 1)",
        a.num_tokens, a.num_heads, a.num_kv_heads, a.page_size));
  }
  if (a.head_dim != 64 && a.head_dim != 128) {
    return std::unexpected(
        Error{ErrorCode::kUnsupported,
              fmt::format("qk_norm_rope_store: head_dim {}; the kernel is built for 64 and 128",
                          a.head_dim)});
  }
  if ((a.q_norm_weight == nullptr) != (a.k_norm_weight == nullptr)) {
    return bad_argument("qk_norm_rope_store: q and k norm weights must be both given or both null");
  }
  if (a.num_tokens == 0) return {};
  if (a.qkv == nullptr || a.cos_sin == nullptr || a.slots == nullptr || a.k_pages == nullptr ||
      a.v_pages == nullptr) {
    return bad_argument("qk_norm_rope_store: a null pointer");
  }
#ifdef STRATA_HAVE_CUDA
  return launched(detail::launch_qk_norm_rope_store(a, stream), "qk_norm_rope_store");
#else
  (void)stream;
  return unsupported_build();
#endif
}

}  // namespace strata::cuda
