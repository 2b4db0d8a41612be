#include "cuda/gpu_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/log.h"
#include "cuda/cuda_copy_device.h"
#include "cuda/cuda_device.h"
#include "cuda/gemm.h"
#include "cuda/kernels.h"
#include "memory/kv_dtype.h"
#include "model/kernels.h"

#ifdef STRATA_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/cuda_status.h"
#endif

namespace strata::cuda {

namespace {

constexpr int32_t kPoolHeadDim = 2;  // the page-counting pool's (gpu_model.h)

int64_t matrix_elems(const ModelConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t per_layer = (int64_t{c.q_size()} + 2 * c.kv_size()) * h + h * c.q_size() +
                            2 * int64_t{c.intermediate_size} * h + h * c.intermediate_size;
  const int64_t vocab = int64_t{c.vocab_size} * h;
  return per_layer * c.num_layers + vocab * (c.tie_word_embeddings ? 1 : 2);
}

}  // namespace

GpuModelOptions gpu_options_for_engine(int32_t page_size, int32_t kv_cache_tokens,
                                       int32_t max_running_requests, int32_t chunked_prefill_size) {
  GpuModelOptions g;
  g.page_size = page_size;
  g.num_pages = page_size > 0 ? kv_cache_tokens / page_size : 0;
  g.max_batch_sequences = 2 * max_running_requests;
  g.max_batch_tokens = chunked_prefill_size + g.max_batch_sequences;
  return g;
}

int64_t gpu_kv_page_bytes(const ModelConfig& config, int32_t page_size) {
  return int64_t{2} * config.num_layers * config.num_kv_heads * page_size * config.head_dim *
         static_cast<int64_t>(sizeof(uint16_t));
}

int64_t gpu_weight_bytes(const ModelConfig& config) {
  return matrix_elems(config) * static_cast<int64_t>(sizeof(uint16_t));
}

namespace {

// Where sample_rows' arguments and results lie in the `sampled` scratch, for `rows` rows:
// the rows' rules, then their tokens, log-probabilities, alternatives' ids and theirs.
struct SampledLayout {
  explicit SampledLayout(size_t rows) {
    const auto align = [](size_t n) { return (n + 255) / 256 * 256; };
    params = 0;
    tokens = align(rows * sizeof(SampleRowArg));
    logprobs = tokens + align(rows * 4);
    top_ids = logprobs + align(rows * 4);
    top_logprobs = top_ids + align(rows * kSampleMaxTop * 4);
    bytes = top_logprobs + align(rows * kSampleMaxTop * 4);
  }
  size_t params, tokens, logprobs, top_ids, top_logprobs, bytes;
};

// The batch scratch create() allocates, in bytes per buffer (GpuModel::Impl's names).
struct ScratchSizes {
  size_t x = 0, residual = 0, qkv = 0, attn = 0, gate_up = 0, act = 0, last = 0, logits = 0,
         sampled = 0, workspace = 0, meta_i32 = 0, meta_f32 = 0;
  size_t total() const {
    return x + residual + qkv + attn + gate_up + act + last + logits + sampled + workspace +
           meta_i32 + meta_f32;
  }
};

int32_t max_pages_per_seq(const ModelConfig& config, const GpuModelOptions& options) {
  return static_cast<int32_t>((config.max_position_embeddings + options.page_size - 1) /
                              options.page_size);
}

// Elements of the batch metadata: token ids, slots, tiles (seq, first): t each; qo_start
// s + 1; kv_lens, logit rows: s; page tables s x max_pages_per_seq.
size_t meta_i32_elems(const ModelConfig& config, const GpuModelOptions& options) {
  const size_t t = static_cast<size_t>(options.max_batch_tokens);
  const size_t s = static_cast<size_t>(options.max_batch_sequences);
  return 4 * t + 3 * s + 1 + s * static_cast<size_t>(max_pages_per_seq(config, options));
}

ScratchSizes scratch_sizes(const ModelConfig& config, const GpuModelOptions& options,
                           int32_t multiprocessors) {
  const size_t t = static_cast<size_t>(options.max_batch_tokens);
  const size_t s = static_cast<size_t>(options.max_batch_sequences);
  const size_t h = static_cast<size_t>(config.hidden_size);
  const size_t qkv_width = static_cast<size_t>(config.q_size() + 2 * config.kv_size());
  const size_t inter = static_cast<size_t>(config.intermediate_size);
  // The decode kernel's workspace rows at their widest: any batch size, and the longest
  // table a step may have (a decode shape's table_pages is at most max_pages_per_seq).
  const int32_t longest = max_pages_per_seq(config, options) * options.page_size;
  size_t splits_rows = 0;
  for (int32_t n = 1; n <= options.max_batch_sequences; ++n) {
    splits_rows = std::max(splits_rows, static_cast<size_t>(n) *
                                            static_cast<size_t>(decode_attention_splits(
                                                n, config.num_kv_heads, longest, multiprocessors)));
  }
  ScratchSizes z;
  z.x = t * h * 2;
  z.residual = t * h * 4;
  z.qkv = t * qkv_width * 2;
  z.attn = t * static_cast<size_t>(config.q_size()) * 2;
  z.gate_up = t * 2 * inter * 2;
  z.act = t * inter * 2;
  z.last = s * h * 2;
  z.logits = s * static_cast<size_t>(config.vocab_size) * 4;
  z.sampled = SampledLayout(s).bytes;
  z.workspace = splits_rows * static_cast<size_t>(config.num_heads) *
                static_cast<size_t>(config.head_dim + 2) * 4;
  z.meta_i32 = meta_i32_elems(config, options) * 4;
  z.meta_f32 = t * static_cast<size_t>(config.head_dim) * 4;
  return z;
}

}  // namespace

// What create() refuses before any device work, in every build (with CUDA or without).
Status GpuModel::check(const ModelConfig& config, const GpuModelOptions& options) {
  if (options.num_pages < 1 || options.page_size < 1 || options.max_batch_tokens < 1 ||
      options.max_batch_sequences < 1) {
    return bad_argument(fmt::format(
        "GPU model: num_pages {}, page_size {}, max_batch_tokens {}, max_batch_sequences {} "
        "(each >= 1)",
        options.num_pages, options.page_size, options.max_batch_tokens,
        options.max_batch_sequences));
  }
  const auto unsupported = [](const std::string& what) {
    return make_error(ErrorCode::kUnsupported, "GPU model: " + what);
  };
  if (config.head_dim != 64 && config.head_dim != 128) {
    return unsupported(
        fmt::format("head_dim {}; the kernels are built for 64 and 128", config.head_dim));
  }
  if (config.num_kv_heads < 1 || config.num_heads % config.num_kv_heads != 0 ||
      config.group_size() > 8) {
    return unsupported(fmt::format("{} query heads over {} KV heads; 1 to 8 per KV head",
                                   config.num_heads, config.num_kv_heads));
  }
  if (config.sliding_window > 0) return unsupported("sliding-window attention");
  return {};
}

DecodeShape gpu_decode_shape(const ModelConfig& config, const GpuModelOptions& options,
                             int32_t multiprocessors, std::span<const int64_t> context_tokens) {
  DecodeShape shape;
  const auto seqs = static_cast<int64_t>(context_tokens.size());
  const int32_t limit = std::min(options.max_batch_sequences, options.max_batch_tokens);
  for (int32_t b : kGraphBuckets) {
    if (b > limit) break;
    if (b >= seqs && seqs > 0) {
      shape.seqs = b;
      break;
    }
  }
  if (shape.seqs == 0) return shape;
  int64_t longest = 1;
  for (int64_t n : context_tokens) longest = std::max(longest, n);
  const int64_t pages = (longest + options.page_size - 1) / options.page_size;
  const int64_t cap = max_pages_per_seq(config, options);
  // A power of two of pages (few shapes, so few graphs), never narrower than the context
  // itself (forward() refuses one beyond max_position_embeddings before this).
  const int64_t bucket = std::min<int64_t>(
      static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(std::max<int64_t>(pages, 1)))), cap);
  shape.table_pages = static_cast<int32_t>(std::max(bucket, pages));
  shape.num_splits = decode_attention_splits(
      shape.seqs, config.num_kv_heads, shape.table_pages * options.page_size, multiprocessors);
  return shape;
}

int64_t gpu_scratch_bytes(const ModelConfig& config, const GpuModelOptions& options,
                          int32_t multiprocessors) {
  return static_cast<int64_t>(scratch_sizes(config, options, multiprocessors).total());
}

#ifdef STRATA_HAVE_CUDA

namespace {

Status cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) return std::unexpected(detail::cuda_error(e, what));
  return {};
}

struct GpuLayer {
  DeviceBuffer qkv, o, gate_up, down;                // BF16 [out][in]
  DeviceBuffer attn_norm, mlp_norm, q_norm, k_norm;  // BF16; q/k norms empty without
  DeviceBuffer qkv_bias, o_bias;                     // F32; empty without
};

Status copy_in(DeviceBuffer& dst, size_t offset, const void* src, size_t bytes) {
  const cudaError_t e =
      cudaMemcpy(static_cast<char*>(dst.data()) + offset, src, bytes, cudaMemcpyHostToDevice);
  if (e != cudaSuccess) return std::unexpected(detail::cuda_error(e, "copying weights"));
  return {};
}

// A matrix in BF16 on the device, converted 4,096 rows at a time.
Result<DeviceBuffer> upload_matrix(const WeightMatrix& m, int64_t& total) {
  const auto bytes = static_cast<size_t>(m.rows() * m.cols()) * sizeof(uint16_t);
  auto buf = DeviceBuffer::allocate(bytes);
  if (!buf) return std::unexpected(buf.error());
  constexpr int64_t kChunkRows = 4096;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  for (int64_t r = 0; r < m.rows(); r += kChunkRows) {
    const int64_t n = std::min(kChunkRows, m.rows() - r);
    f32.resize(static_cast<size_t>(n * m.cols()));
    bf16.resize(f32.size());
    m.rows_to_f32(r, n, f32.data());
    for (size_t i = 0; i < f32.size(); ++i) bf16[i] = f32_to_bf16(f32[i]);
    if (auto st = copy_in(*buf, static_cast<size_t>(r * m.cols()) * sizeof(uint16_t), bf16.data(),
                          bf16.size() * sizeof(uint16_t));
        !st) {
      return std::unexpected(st.error());
    }
  }
  total += static_cast<int64_t>(bytes);
  return std::move(*buf);
}

// A vector on the device, BF16 (norm weights) or F32 (biases); empty stays empty.
Result<DeviceBuffer> upload_vector(const std::vector<float>& v, bool bf16, int64_t& total) {
  if (v.empty()) return DeviceBuffer();
  const size_t bytes = v.size() * (bf16 ? sizeof(uint16_t) : sizeof(float));
  auto buf = DeviceBuffer::allocate(bytes);
  if (!buf) return std::unexpected(buf.error());
  Status st;
  if (bf16) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
    st = copy_in(*buf, 0, b.data(), bytes);
  } else {
    st = copy_in(*buf, 0, v.data(), bytes);
  }
  if (!st) return std::unexpected(st.error());
  total += static_cast<int64_t>(bytes);
  return std::move(*buf);
}

template <typename T>
T* ptr(const DeviceBuffer& b) {
  return b.size() == 0 ? nullptr : b.as<T>();
}

// Page-locked host memory of `count` T (cudaHostAlloc), freed on destruction: the forward's
// staging, so that its cudaMemcpyAsync calls are truly asynchronous (from pageable memory
// the runtime copies through a staging buffer of its own, synchronously for the host).
template <typename T>
class PinnedArray {
 public:
  static Result<PinnedArray> allocate(size_t count, const char* what) {
    PinnedArray a;
    void* p = nullptr;
    if (const cudaError_t e =
            cudaHostAlloc(&p, std::max<size_t>(count, 1) * sizeof(T), cudaHostAllocDefault);
        e != cudaSuccess) {
      return std::unexpected(detail::cuda_error(
          e, fmt::format("page-locking {} bytes of host memory for {}", count * sizeof(T), what)));
    }
    a.data_ = static_cast<T*>(p);
    a.size_ = count;
    return a;
  }
  PinnedArray() = default;
  PinnedArray(PinnedArray&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  PinnedArray& operator=(PinnedArray&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~PinnedArray() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  T* data() const { return data_; }
  size_t size() const { return size_; }
  T& operator[](size_t i) const { return data_[i]; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

struct GpuModel::Impl {
  ModelConfig config;
  GpuModelOptions options;
  DeviceInfo device;
  RopeTable rope;
  std::unique_ptr<Gemm> gemm;
  Stream stream;
  DeviceBuffer embed, lm_head, final_norm;  // lm_head empty when tied to embed
  std::vector<GpuLayer> layers;
  DeviceBuffer kv;  // [layer][K, V][page][kv_head][slot][head_dim] BF16
  int64_t weight_bytes = 0;
  // The batch scratch (gpu_model.h).
  DeviceBuffer x, residual, qkv, attn, gate_up, act, last, logits, sampled, workspace;
  DeviceBuffer meta_i32, meta_f32;
  // Host side of the metadata, page-locked, as large as the device side (create()). A step's
  // copies from them are asynchronous: nothing rewrites them before the stream has run
  // those copies (`staged`).
  PinnedArray<int32_t> host_i32;
  PinnedArray<float> host_f32;
  // Sampling on the device: the rows' rules and what comes back (sampled's SampledLayout).
  PinnedArray<SampleRowArg> host_sample;
  PinnedArray<uint32_t> host_results;  // tokens .. top_logprobs, as SampledLayout lays them
  bool staged = false;                 // copies from the host staging queued and not yet waited for
  std::vector<int32_t> new_tokens;     // each sequence's new tokens (upload)
  std::vector<int64_t> contexts;       // each sequence's keys (decode_shape)

  size_t layer_elems() const {
    return static_cast<size_t>(options.num_pages) * config.num_kv_heads * options.page_size *
           config.head_dim;
  }
  uint16_t* k_pages(int32_t layer) const {
    return kv.as<uint16_t>() + (2 * static_cast<size_t>(layer)) * layer_elems();
  }
  uint16_t* v_pages(int32_t layer) const {
    return kv.as<uint16_t>() + (2 * static_cast<size_t>(layer) + 1) * layer_elems();
  }
  size_t meta_i32_capacity() const { return meta_i32_elems(config, options); }

  Status validate(std::span<const ForwardSequence> batch, const KvPool& pool) const;
  struct Step;
  Status upload(std::span<const ForwardSequence> batch, const DecodeShape& shape, Step& step);
  Status compute(std::span<const ForwardSequence> batch, const Step& step);
  Status download(const Step& step, ForwardOutput& out);
  DecodeShape decode_shape(std::span<const ForwardSequence> batch);
  Status run(std::span<const ForwardSequence> batch, ForwardOutput& out);

  // Decode steps as CUDA graphs, one per decode shape, keyed by (seqs, table_pages), which
  // decide num_splits (GpuModelOptions::cuda_graphs).
  struct GraphExec {
    cudaGraphExec_t handle = nullptr;
    GraphExec() = default;
    GraphExec(GraphExec&& o) noexcept : handle(std::exchange(o.handle, nullptr)) {}
    GraphExec& operator=(GraphExec&&) = delete;
    ~GraphExec() {
      if (handle != nullptr) cudaGraphExecDestroy(handle);
    }
  };
  using ShapeKey = std::pair<int32_t, int32_t>;
  std::map<ShapeKey, GraphExec> graphs;
  std::set<ShapeKey> failed_shapes;
  GpuModel::Counters counters;
};

GpuModel::GpuModel() : impl_(std::make_unique<Impl>()) {}
GpuModel::~GpuModel() = default;

Result<std::unique_ptr<GpuModel>> GpuModel::create(const ModelConfig& config,
                                                   const ModelWeights& weights,
                                                   const GpuModelOptions& options) {
  if (auto st = check(config, options); !st) return std::unexpected(st.error());
  std::unique_ptr<GpuModel> m(new GpuModel());
  Impl& i = *m->impl_;
  i.config = config;
  i.options = options;
  i.rope = RopeTable(config);
  auto device = probe_device(0);
  if (!device) return std::unexpected(device.error());
  i.device = *device;
  auto gemm = Gemm::create();
  if (!gemm) return std::unexpected(gemm.error());
  i.gemm = std::move(*gemm);
  auto stream = Stream::create();
  if (!stream) return std::unexpected(stream.error());
  i.stream = std::move(*stream);

  // Weights.
  const auto take = [](Result<DeviceBuffer> r, DeviceBuffer& into) -> Status {
    if (!r) return std::unexpected(r.error());
    into = std::move(*r);
    return {};
  };
  int64_t& wb = i.weight_bytes;
  if (auto st = take(upload_matrix(weights.embed, wb), i.embed); !st)
    return std::unexpected(st.error());
  if (!weights.lm_head.empty()) {
    if (auto st = take(upload_matrix(weights.lm_head, wb), i.lm_head); !st) {
      return std::unexpected(st.error());
    }
  }
  if (auto st = take(upload_vector(weights.final_norm, true, wb), i.final_norm); !st) {
    return std::unexpected(st.error());
  }
  i.layers.resize(weights.layers.size());
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    const LayerWeights& lw = weights.layers[l];
    GpuLayer& g = i.layers[l];
    for (const Status& st : {
             take(upload_matrix(lw.qkv, wb), g.qkv),
             take(upload_matrix(lw.o, wb), g.o),
             take(upload_matrix(lw.gate_up, wb), g.gate_up),
             take(upload_matrix(lw.down, wb), g.down),
             take(upload_vector(lw.attn_norm, true, wb), g.attn_norm),
             take(upload_vector(lw.mlp_norm, true, wb), g.mlp_norm),
             take(upload_vector(lw.q_norm, true, wb), g.q_norm),
             take(upload_vector(lw.k_norm, true, wb), g.k_norm),
             take(upload_vector(lw.qkv_bias, false, wb), g.qkv_bias),
             take(upload_vector(lw.o_bias, false, wb), g.o_bias),
         }) {
      if (!st) return std::unexpected(st.error());
    }
  }

  // KV pages and the batch scratch.
  auto kv =
      DeviceBuffer::allocate(static_cast<size_t>(gpu_kv_page_bytes(config, options.page_size)) *
                             static_cast<size_t>(options.num_pages));
  if (!kv) return std::unexpected(kv.error());
  i.kv = std::move(*kv);
  const ScratchSizes sizes = scratch_sizes(config, options, i.device.multiprocessors);
  const std::pair<DeviceBuffer*, size_t> scratch[] = {
      {&i.x, sizes.x},
      {&i.residual, sizes.residual},
      {&i.qkv, sizes.qkv},
      {&i.attn, sizes.attn},
      {&i.gate_up, sizes.gate_up},
      {&i.act, sizes.act},
      {&i.last, sizes.last},
      {&i.logits, sizes.logits},
      {&i.sampled, sizes.sampled},
      {&i.workspace, sizes.workspace},
      {&i.meta_i32, sizes.meta_i32},
      {&i.meta_f32, sizes.meta_f32},
  };
  for (const auto& [buf, bytes] : scratch) {
    auto b = DeviceBuffer::allocate(bytes);
    if (!b) return std::unexpected(b.error());
    *buf = std::move(*b);
  }
  const auto pin = [](auto array, auto& into) -> Status {
    if (!array) return std::unexpected(array.error());
    into = std::move(*array);
    return {};
  };
  const size_t rows = static_cast<size_t>(options.max_batch_sequences);
  const SampledLayout at(rows);
  for (const Status& st : {
           pin(PinnedArray<int32_t>::allocate(i.meta_i32_capacity(), "the batch's metadata"),
               i.host_i32),
           pin(PinnedArray<float>::allocate(sizes.meta_f32 / 4, "the rotary angles"), i.host_f32),
           pin(PinnedArray<SampleRowArg>::allocate(rows, "the sampling rules"), i.host_sample),
           pin(PinnedArray<uint32_t>::allocate((at.bytes - at.tokens) / 4, "the sampled tokens"),
               i.host_results),
       }) {
    if (!st) return std::unexpected(st.error());
  }
  // The weights went up with cudaMemcpy from pageable memory, which may return before the
  // copy has landed, and the compute stream does not wait for the legacy default stream
  // (it is non-blocking): the first forward could read weights still crossing the bus.
  if (const cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
    return std::unexpected(
        detail::cuda_error(e, "GpuModel::create: waiting for the weights' upload to land"));
  }
  return m;
}

const ModelConfig& GpuModel::config() const {
  return impl_->config;
}
const GpuModelOptions& GpuModel::options() const {
  return impl_->options;
}
GpuModel::Counters GpuModel::counters() const {
  return impl_->counters;
}
int64_t GpuModel::weight_bytes() const {
  return impl_->weight_bytes;
}
int64_t GpuModel::kv_bytes() const {
  return static_cast<int64_t>(impl_->kv.size());
}

KvPoolShape GpuModel::kv_pool_shape(int32_t num_pages, int32_t page_size, KvDtype dtype) const {
  return KvPoolShape{1, 1, kPoolHeadDim, num_pages, page_size, dtype};
}

std::optional<ExternalKv> GpuModel::external_kv() const {
  const Impl& m = *impl_;
  ExternalKv e;
  e.shape = KvPoolShape{m.config.num_layers, m.config.num_kv_heads, m.config.head_dim,
                        m.options.num_pages, m.options.page_size,   KvDtype::kBF16};
  const size_t block = static_cast<size_t>(m.config.num_kv_heads) * m.options.page_size *
                       m.config.head_dim * sizeof(uint16_t);
  e.blocks = KvBlockLayout{.base = static_cast<std::byte*>(m.kv.data()),
                           .num_layers = m.config.num_layers,
                           .num_pages = m.options.num_pages,
                           .block_bytes = block,
                           .region_stride = m.layer_elems() * sizeof(uint16_t),
                           .page_stride = block};
  return e;
}

Result<std::unique_ptr<CopyDevice>> GpuModel::make_copy_device(std::span<std::byte> host,
                                                               CopyPath path) {
  auto device = CudaCopyDevice::create(impl_->stream.handle(), path, host);
  if (!device) return std::unexpected(device.error());
  return std::unique_ptr<CopyDevice>(std::move(*device));
}

Status GpuModel::Impl::validate(std::span<const ForwardSequence> batch, const KvPool& pool) const {
  const auto bad = [](const std::string& what) { return bad_argument("forward (GPU): " + what); };
  if (pool.num_pages() != options.num_pages || pool.page_size() != options.page_size) {
    return bad(fmt::format("the engine's pool has {} pages of {}; the GPU's {} of {}",
                           pool.num_pages(), pool.page_size(), options.num_pages,
                           options.page_size));
  }
  if (static_cast<int64_t>(batch.size()) > options.max_batch_sequences) {
    return bad(fmt::format("{} sequences; at most {}", batch.size(), options.max_batch_sequences));
  }
  int64_t tokens = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const ForwardSequence& seq = batch[s];
    const std::string where = fmt::format("sequence {}: ", s);
    if (seq.token_ids.empty()) return bad(where + "no tokens");
    if (seq.start_position < 0) return bad(where + "negative start_position");
    tokens += static_cast<int64_t>(seq.token_ids.size());
    const int64_t end = seq.start_position + static_cast<int64_t>(seq.token_ids.size());
    if (end > config.max_position_embeddings) {
      return bad(where + fmt::format("positions up to {} exceed max_position_embeddings {}", end,
                                     config.max_position_embeddings));
    }
    for (int32_t id : seq.token_ids) {
      if (id < 0 || id >= config.vocab_size) {
        return bad(where +
                   fmt::format("token id {} outside the vocabulary of {}", id, config.vocab_size));
      }
    }
    if (seq.want_logits && seq.sampling) {
      const RowSampling& r = *seq.sampling;
      if (auto arg = sample_row_arg(r.uniform, r.temperature, r.top_k, r.top_p, r.top_logprobs,
                                    r.logprobs);
          !arg) {
        return bad(where + arg.error().message);
      }
    }
    const int64_t pages = (end + options.page_size - 1) / options.page_size;
    if (static_cast<int64_t>(seq.page_table.size()) < pages) {
      return bad(where + fmt::format("page table has {} pages, positions [0, {}) need {}",
                                     seq.page_table.size(), end, pages));
    }
    for (int64_t p = 0; p < pages; ++p) {
      if (!pool.is_valid_page(seq.page_table[static_cast<size_t>(p)])) {
        return bad(where + fmt::format("page table entry {} is not a page of the pool", p));
      }
    }
  }
  if (tokens > options.max_batch_tokens) {
    return bad(fmt::format("{} tokens; at most {}", tokens, options.max_batch_tokens));
  }
  return {};
}

Status GpuModel::forward(std::span<const ForwardSequence> batch, KvPool& pool, ForwardOutput& out) {
  out.tokens.clear();
  if (auto st = impl_->validate(batch, pool); !st) return st;
  return impl_->run(batch, out);
}

// One forward's shape and where its metadata lies in meta_i32 (GpuModel::Impl::upload). A
// decode step is padded to its DecodeShape: then every field depends on that shape only, as
// a captured graph needs and as an eager step must to give a replay's bits.
struct GpuModel::Impl::Step {
  int32_t num_seqs = 0, num_tokens = 0, num_logit_rows = 0, num_tiles = 0;
  int32_t real_logit_rows = 0;  // the batch's own (the rest pad a bucket)
  int32_t table_stride = 1, num_splits = 1;
  bool all_decode = false;
  bool sample = false;  // sample_rows runs (rules uploaded for every logit row)
  size_t o_tokens = 0, o_slots = 0, o_qo = 0, o_kv = 0, o_rows = 0, o_tile_seq = 0,
         o_tile_first = 0, o_table = 0;
};

// The batch's metadata (laid out as meta_i32_capacity() describes) and the rows' sampling
// rules, built on the host in page-locked staging and copied to the device in one copy each.
// With shape.seqs > 0 (a decode step) the batch is padded to shape.seqs sequences that write
// nothing (slot -1), read one key of page 0 and are never sampled, its page table is
// shape.table_pages wide and attention cuts it into shape.num_splits key ranges.
Status GpuModel::Impl::upload(std::span<const ForwardSequence> batch, const DecodeShape& shape,
                              Step& st) {
  const ModelConfig& c = config;
  const int32_t ps = options.page_size;
  const int32_t d = c.head_dim;
  const int32_t half = d / 2;
  const auto real_seqs = static_cast<int32_t>(batch.size());
  const int32_t pad_to = shape.seqs;
  // The staging is rewritten below: the last step's copies from it must have run (download
  // waited for them, unless that step failed on the way).
  if (staged) {
    if (auto s = stream.synchronize(); !s) {
      return make_error(ErrorCode::kInternal, "forward (GPU): " + s.error().message);
    }
    staged = false;
  }
  st = Step{};
  st.num_seqs = pad_to > 0 ? pad_to : real_seqs;
  int32_t max_kv_len = 1;
  new_tokens.assign(static_cast<size_t>(st.num_seqs), 1);
  for (size_t s = 0; s < batch.size(); ++s) {
    new_tokens[s] = static_cast<int32_t>(batch[s].token_ids.size());
    const int64_t end = batch[s].start_position + new_tokens[s];
    max_kv_len = std::max(max_kv_len, static_cast<int32_t>(end));
    st.table_stride = std::max(st.table_stride, static_cast<int32_t>((end + ps - 1) / ps));
    if (batch[s].want_logits) ++st.real_logit_rows;
    if (batch[s].want_logits && batch[s].sampling) st.sample = true;
  }
  for (int32_t n : new_tokens) st.num_tokens += n;
  st.num_logit_rows = pad_to > 0 ? pad_to : st.real_logit_rows;
  st.all_decode = st.num_tokens == st.num_seqs;
  if (pad_to > 0) {
    // Fixed for the shape: its table width and key ranges, sample_rows on every row (a row
    // without rules gets token -1 and its logits read).
    STRATA_CHECK(shape.table_pages >= st.table_stride);
    st.table_stride = shape.table_pages;
    st.num_splits = shape.num_splits;
    st.sample = true;
  } else {
    st.num_splits =
        decode_attention_splits(st.num_seqs, c.num_kv_heads, max_kv_len, device.multiprocessors);
  }
  const ExtendKernel extend_kernel =
      options.tensor_core_prefill ? ExtendKernel::kTensorCores : ExtendKernel::kCudaCores;
  const ExtendTiles tiles = plan_extend_tiles(new_tokens, c.group_size(), extend_kernel);
  st.num_tiles = static_cast<int32_t>(tiles.seq.size());
  st.o_tokens = 0;
  st.o_slots = st.o_tokens + st.num_tokens;
  st.o_qo = st.o_slots + st.num_tokens;
  st.o_kv = st.o_qo + st.num_seqs + 1;
  st.o_rows = st.o_kv + st.num_seqs;
  st.o_tile_seq = st.o_rows + st.num_logit_rows;
  st.o_tile_first = st.o_tile_seq + st.num_tiles;
  st.o_table = st.o_tile_first + st.num_tiles;
  const size_t used = st.o_table + static_cast<size_t>(st.num_seqs) * st.table_stride;
  const size_t used_f32 = static_cast<size_t>(st.num_tokens) * d;
  STRATA_CHECK(used <= host_i32.size() && used_f32 <= host_f32.size());
  std::fill_n(host_i32.data(), used, 0);
  std::fill_n(host_f32.data(), used_f32, 0.0f);
  {
    int32_t row = 0, logit_row = 0;
    for (int32_t s = 0; s < st.num_seqs; ++s) {
      host_i32[st.o_qo + s] = row;
      if (s >= real_seqs) {  // padding: one key (page 0's first slot), nothing written
        host_i32[st.o_kv + s] = 1;
        host_i32[st.o_tokens + row] = 0;
        host_i32[st.o_slots + row] = -1;
        host_i32[st.o_rows + logit_row++] = row;
        ++row;
        continue;
      }
      const ForwardSequence& seq = batch[static_cast<size_t>(s)];
      host_i32[st.o_kv + s] = static_cast<int32_t>(seq.start_position) + new_tokens[s];
      const int32_t pages = (host_i32[st.o_kv + s] + ps - 1) / ps;
      for (int32_t p = 0; p < pages; ++p) {
        host_i32[st.o_table + static_cast<size_t>(s) * st.table_stride + p] =
            static_cast<int32_t>(page_index(seq.page_table[static_cast<size_t>(p)]));
      }
      for (int32_t k = 0; k < new_tokens[s]; ++k, ++row) {
        const int64_t pos = seq.start_position + k;
        host_i32[st.o_tokens + row] = seq.token_ids[static_cast<size_t>(k)];
        host_i32[st.o_slots + row] =
            static_cast<int32_t>(page_index(seq.page_table[static_cast<size_t>(pos / ps)])) * ps +
            static_cast<int32_t>(pos % ps);
        float* cs = host_f32.data() + static_cast<size_t>(row) * d;
        rope.angles(pos, cs, cs + half);
      }
      if (seq.want_logits) host_i32[st.o_rows + logit_row++] = row - 1;
    }
    host_i32[st.o_qo + st.num_seqs] = row;
    std::copy(tiles.seq.begin(), tiles.seq.end(), host_i32.data() + st.o_tile_seq);
    std::copy(tiles.first.begin(), tiles.first.end(), host_i32.data() + st.o_tile_first);
  }
  const auto cs = static_cast<cudaStream_t>(stream.handle());
  staged = true;
  if (auto s = cuda_ok(
          cudaMemcpyAsync(meta_i32.data(), host_i32.data(), used * 4, cudaMemcpyHostToDevice, cs),
          "forward: copying the batch's metadata");
      !s) {
    return s;
  }
  if (auto s = cuda_ok(cudaMemcpyAsync(meta_f32.data(), host_f32.data(), used_f32 * 4,
                                       cudaMemcpyHostToDevice, cs),
                       "forward: copying the rotary angles");
      !s) {
    return s;
  }
  if (!st.sample) return {};
  // The rows' sampling rules (a row without: flags 0, token -1, its logits read).
  STRATA_CHECK(static_cast<size_t>(st.num_logit_rows) <= host_sample.size());
  std::fill_n(host_sample.data(), st.num_logit_rows, SampleRowArg{});
  size_t r = 0;
  for (const ForwardSequence& f : batch) {
    if (!f.want_logits) continue;
    if (f.sampling) {
      const RowSampling& rs = *f.sampling;
      auto arg = sample_row_arg(rs.uniform, rs.temperature, rs.top_k, rs.top_p, rs.top_logprobs,
                                rs.logprobs);
      STRATA_CHECK(arg.has_value());  // validate() checked it
      host_sample[r] = *arg;
    }
    ++r;
  }
  const SampledLayout at(static_cast<size_t>(st.num_logit_rows));
  return cuda_ok(cudaMemcpyAsync(sampled.as<std::byte>() + at.params, host_sample.data(),
                                 static_cast<size_t>(st.num_logit_rows) * sizeof(SampleRowArg),
                                 cudaMemcpyHostToDevice, cs),
                 "forward: copying the sampling rules");
}

// The pass itself, queued on the stream: embeddings, the layers, the final norm, the LM head
// on the logit rows and, with st.sample, sample_rows. Nothing here copies to or from the host
// or waits for it, except a prefix still landing (layer_wait): without one it is captured
// as a CUDA graph as it is.
Status GpuModel::Impl::compute(std::span<const ForwardSequence> batch, const Step& step) {
  const ModelConfig& c = config;
  const int32_t ps = options.page_size;
  const int32_t d = c.head_dim;
  const int32_t hidden = c.hidden_size;
  const int32_t qkv_width = c.q_size() + 2 * c.kv_size();
  const int32_t inter = c.intermediate_size;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  const int32_t num_seqs = step.num_seqs;
  const int32_t num_tokens = step.num_tokens;
  const int32_t num_tiles = step.num_tiles;
  const int32_t table_stride = step.table_stride;
  const bool all_decode = step.all_decode;
  const size_t o_tokens = step.o_tokens, o_slots = step.o_slots, o_qo = step.o_qo, o_kv = step.o_kv,
               o_tile_seq = step.o_tile_seq, o_tile_first = step.o_tile_first,
               o_table = step.o_table;
  const ExtendKernel extend_kernel =
      options.tensor_core_prefill ? ExtendKernel::kTensorCores : ExtendKernel::kCudaCores;
  const StreamHandle st = stream.handle();
  const auto cs = static_cast<cudaStream_t>(st);
  const int32_t* dev_i32 = meta_i32.as<int32_t>();

  // Embeddings into x; the residual stream starts at zero (the first fused add makes it the
  // embeddings).
  if (auto s = gather_rows(embed.as<uint16_t>(), dev_i32 + o_tokens, x.as<uint16_t>(), num_tokens,
                           hidden, st);
      !s) {
    return s;
  }
  if (auto s = cuda_ok(
          cudaMemsetAsync(residual.data(), 0, static_cast<size_t>(num_tokens) * hidden * 4, cs),
          "forward: clearing the residual stream");
      !s) {
    return s;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  uint16_t* xb = x.as<uint16_t>();
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const GpuLayer& g = layers[static_cast<size_t>(l)];
    if (auto s = fused_add_rms_norm(xb, residual.as<float>(), g.attn_norm.as<uint16_t>(),
                                    num_tokens, hidden, eps, st);
        !s) {
      return s;
    }
    if (auto s = gemm->linear(xb, g.qkv.as<uint16_t>(), qkv.data(), false, num_tokens, qkv_width,
                              hidden, st);
        !s) {
      return s;
    }
    if (g.qkv_bias.size() > 0) {
      if (auto s = add_bias(qkv.as<uint16_t>(), g.qkv_bias.as<float>(), num_tokens, qkv_width, st);
          !s) {
        return s;
      }
    }
    QkNormRopeStoreArgs r;
    r.qkv = qkv.as<uint16_t>();
    r.q_norm_weight = ptr<uint16_t>(g.q_norm);
    r.k_norm_weight = ptr<uint16_t>(g.k_norm);
    r.cos_sin = meta_f32.as<float>();
    r.slots = dev_i32 + o_slots;
    r.k_pages = k_pages(l);
    r.v_pages = v_pages(l);
    r.num_tokens = num_tokens;
    r.num_heads = c.num_heads;
    r.num_kv_heads = c.num_kv_heads;
    r.head_dim = d;
    r.page_size = ps;
    r.eps = eps;
    if (auto s = qk_norm_rope_store(r, st); !s) return s;
    // A prefix still landing (a load-back overlapped with this pass): the stream waits for
    // this layer's copy event, so the later layers keep crossing the bus meanwhile.
    for (const ForwardSequence& seq : batch) {
      if (seq.layer_wait == nullptr) continue;
      if (auto s = (*seq.layer_wait)(l); !s) return s;
    }
    Status attended;
    if (all_decode) {
      DecodeAttentionArgs a;
      a.q = qkv.as<uint16_t>();
      a.q_stride = qkv_width;
      a.k_pages = k_pages(l);
      a.v_pages = v_pages(l);
      a.page_table = dev_i32 + o_table;
      a.page_table_stride = table_stride;
      a.seq_lens = dev_i32 + o_kv;
      a.out = attn.as<uint16_t>();
      a.workspace = workspace.as<float>();
      a.num_seqs = num_seqs;
      a.num_heads = c.num_heads;
      a.num_kv_heads = c.num_kv_heads;
      a.head_dim = d;
      a.page_size = ps;
      a.num_splits = step.num_splits;
      a.scale = scale;
      attended = decode_attention(a, st);
    } else {
      ExtendAttentionArgs a;
      a.q = qkv.as<uint16_t>();
      a.q_stride = qkv_width;
      a.k_pages = k_pages(l);
      a.v_pages = v_pages(l);
      a.page_table = dev_i32 + o_table;
      a.page_table_stride = table_stride;
      a.qo_start = dev_i32 + o_qo;
      a.kv_lens = dev_i32 + o_kv;
      a.tile_seq = dev_i32 + o_tile_seq;
      a.tile_first = dev_i32 + o_tile_first;
      a.out = attn.as<uint16_t>();
      a.num_tiles = num_tiles;
      a.num_seqs = num_seqs;
      a.num_heads = c.num_heads;
      a.num_kv_heads = c.num_kv_heads;
      a.head_dim = d;
      a.page_size = ps;
      a.scale = scale;
      attended = extend_attention(a, st, extend_kernel);
    }
    if (!attended) return attended;
    if (auto s = gemm->linear(attn.as<uint16_t>(), g.o.as<uint16_t>(), xb, false, num_tokens,
                              hidden, c.q_size(), st);
        !s) {
      return s;
    }
    if (g.o_bias.size() > 0) {
      if (auto s = add_bias(xb, g.o_bias.as<float>(), num_tokens, hidden, st); !s) return s;
    }
    if (auto s = fused_add_rms_norm(xb, residual.as<float>(), g.mlp_norm.as<uint16_t>(), num_tokens,
                                    hidden, eps, st);
        !s) {
      return s;
    }
    if (auto s = gemm->linear(xb, g.gate_up.as<uint16_t>(), gate_up.data(), false, num_tokens,
                              2 * inter, hidden, st);
        !s) {
      return s;
    }
    if (auto s = silu_mul(gate_up.as<uint16_t>(), act.as<uint16_t>(), num_tokens, inter, st); !s) {
      return s;
    }
    if (auto s = gemm->linear(act.as<uint16_t>(), g.down.as<uint16_t>(), xb, false, num_tokens,
                              hidden, inter, st);
        !s) {
      return s;
    }
  }
  // The last MLP's output joins the residual stream, normalized by the final norm.
  if (auto s = fused_add_rms_norm(xb, residual.as<float>(), final_norm.as<uint16_t>(), num_tokens,
                                  hidden, eps, st);
      !s) {
    return s;
  }
  const int32_t rows = step.num_logit_rows;
  if (rows == 0) return {};
  if (auto s = gather_rows(xb, dev_i32 + step.o_rows, last.as<uint16_t>(), rows, hidden, st); !s) {
    return s;
  }
  const DeviceBuffer& w = lm_head.size() > 0 ? lm_head : embed;
  if (auto s = gemm->linear(last.as<uint16_t>(), w.as<uint16_t>(), logits.data(), true, rows,
                            c.vocab_size, hidden, st);
      !s) {
    return s;
  }
  if (!step.sample) return {};
  const SampledLayout at(static_cast<size_t>(rows));
  std::byte* base = sampled.as<std::byte>();
  SampleRowsArgs a;
  a.logits = logits.as<float>();
  a.params = reinterpret_cast<const SampleRowArg*>(base + at.params);
  a.tokens = reinterpret_cast<int32_t*>(base + at.tokens);
  a.logprobs = reinterpret_cast<float*>(base + at.logprobs);
  a.top_ids = reinterpret_cast<int32_t*>(base + at.top_ids);
  a.top_logprobs = reinterpret_cast<float*>(base + at.top_logprobs);
  a.rows = rows;
  a.cols = c.vocab_size;
  return sample_rows(a, st);
}

// What comes back, then the stream synchronized: the drawn tokens of the rows with sampling
// (ForwardOutput::sampled) and the logits of the others, and of any row sample_rows could not
// draw; without sampling every row's logits.
Status GpuModel::Impl::download(const Step& step, ForwardOutput& out) {
  const auto cs = static_cast<cudaStream_t>(stream.handle());
  const size_t vocab = static_cast<size_t>(config.vocab_size);
  const auto n = static_cast<size_t>(step.real_logit_rows);
  out.logits.resize(n * vocab);
  out.sampled.clear();
  const auto copy_rows = [&](size_t first, size_t count) {
    return cuda_ok(
        cudaMemcpyAsync(out.logits.data() + first * vocab, logits.as<float>() + first * vocab,
                        count * vocab * 4, cudaMemcpyDeviceToHost, cs),
        "forward: copying the logits back");
  };
  const auto synchronized = [&]() -> Status {
    if (auto s = stream.synchronize(); !s) {
      return make_error(ErrorCode::kInternal, "forward (GPU): " + s.error().message);
    }
    staged = false;
    return {};
  };
  if (n == 0) return synchronized();
  if (!step.sample) {
    if (auto s = copy_rows(0, n); !s) return s;
    return synchronized();
  }
  // The results lie one after the other (SampledLayout): one copy brings them all back.
  const SampledLayout at(static_cast<size_t>(step.num_logit_rows));
  STRATA_CHECK((at.bytes - at.tokens) / 4 <= host_results.size());
  if (auto s = cuda_ok(cudaMemcpyAsync(host_results.data(), sampled.as<std::byte>() + at.tokens,
                                       at.bytes - at.tokens, cudaMemcpyDeviceToHost, cs),
                       "forward: copying the sampled tokens back");
      !s) {
    return s;
  }
  const auto word = [&](size_t offset, size_t i) {
    return host_results[(offset - at.tokens) / 4 + i];
  };
  if (auto s = synchronized(); !s) return s;
  out.sampled.assign(n, SampledToken{});
  for (size_t k = 0; k < n; ++k) {
    SampledToken& t = out.sampled[k];
    t.token = static_cast<int32_t>(word(at.tokens, k));
    if (t.token < 0) {
      // No sampling, or a row the kernel could not draw: the host draws from its logits.
      t.token = -1;
      if (auto s = copy_rows(k, 1); !s) return s;
      continue;
    }
    const SampleRowArg& p = host_sample[k];
    if ((p.flags & kSampleLogprob) != 0 || p.top_logprobs > 0) {
      t.logprob = std::bit_cast<float>(word(at.logprobs, k));
    }
    const size_t alternatives = std::min(static_cast<size_t>(p.top_logprobs), vocab);
    for (size_t j = 0; j < alternatives; ++j) {
      const size_t i = k * kSampleMaxTop + j;
      t.top_logprobs.push_back(TokenLogprob{static_cast<int32_t>(word(at.top_ids, i)),
                                            std::bit_cast<float>(word(at.top_logprobs, i))});
    }
  }
  return synchronized();
}

// The shape a decode step runs in (gpu_decode_shape), graph or not; seqs 0 for any other
// step.
DecodeShape GpuModel::Impl::decode_shape(std::span<const ForwardSequence> batch) {
  contexts.clear();
  for (const ForwardSequence& f : batch) {
    if (f.token_ids.size() != 1 || !f.want_logits) return DecodeShape{};
    contexts.push_back(f.start_position + 1);
  }
  return gpu_decode_shape(config, options, device.multiprocessors, contexts);
}

Status GpuModel::Impl::run(std::span<const ForwardSequence> batch, ForwardOutput& out) {
  const DecodeShape shape = decode_shape(batch);
  Step step;
  if (auto s = upload(batch, shape, step); !s) return s;
  const auto eager = [&]() -> Status {
    if (auto s = compute(batch, step); !s) return s;
    ++counters.eager_steps;
    return download(step, out);
  };
  // A prefix still landing makes the stream wait on copy events: never captured.
  const bool waits = std::any_of(batch.begin(), batch.end(),
                                 [](const ForwardSequence& f) { return f.layer_wait != nullptr; });
  const ShapeKey key{shape.seqs, shape.table_pages};
  if (!options.cuda_graphs || shape.seqs == 0 || waits || failed_shapes.count(key) > 0) {
    return eager();
  }
  const auto cs = static_cast<cudaStream_t>(stream.handle());
  auto it = graphs.find(key);
  if (it == graphs.end()) {
    // Captured once per shape, on the first step that needs it; a capture that fails leaves
    // the shape to eager steps (logged once), which run the same kernels at the same sizes.
    cudaGraph_t graph = nullptr;
    Status captured = cuda_ok(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal),
                              "forward: starting a graph capture");
    if (captured) captured = compute(batch, step);
    const cudaError_t ended = cudaStreamEndCapture(cs, &graph);
    if (captured && ended != cudaSuccess) captured = cuda_ok(ended, "forward: ending a capture");
    GraphExec exec;
    if (captured) {
      captured = cuda_ok(cudaGraphInstantiate(&exec.handle, graph, 0),
                         "forward: instantiating a decode graph");
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (!captured) {
      cudaGetLastError();  // the capture's error is the capture's, not the next call's
      STRATA_LOG_WARN(
          "decode steps of {} sequences over {}-page tables run without a CUDA graph: {}",
          shape.seqs, shape.table_pages, captured.error().message);
      failed_shapes.insert(key);
      return eager();
    }
    ++counters.graphs_captured;
    it = graphs.emplace(key, std::move(exec)).first;
  }
  if (auto s = cuda_ok(cudaGraphLaunch(it->second.handle, cs), "forward: replaying a decode graph");
      !s) {
    return s;
  }
  ++counters.graph_replays;
  return download(step, out);
}

#else  // without CUDA

struct GpuModel::Impl {
  ModelConfig config;
  GpuModelOptions options;
  GpuModel::Counters counters;
};

GpuModel::GpuModel() : impl_(std::make_unique<Impl>()) {}
GpuModel::~GpuModel() = default;

Result<std::unique_ptr<GpuModel>> GpuModel::create(const ModelConfig& config, const ModelWeights&,
                                                   const GpuModelOptions& options) {
  if (auto st = check(config, options); !st) return std::unexpected(st.error());
  return make_error(ErrorCode::kUnsupported,
                    "this strata was built without CUDA (STRATA_CUDA=OFF, or nvcc was not found "
                    "when it was configured)");
}

const ModelConfig& GpuModel::config() const {
  return impl_->config;
}
const GpuModelOptions& GpuModel::options() const {
  return impl_->options;
}
GpuModel::Counters GpuModel::counters() const {
  return impl_->counters;
}
int64_t GpuModel::weight_bytes() const {
  return 0;
}
int64_t GpuModel::kv_bytes() const {
  return 0;
}

KvPoolShape GpuModel::kv_pool_shape(int32_t num_pages, int32_t page_size, KvDtype dtype) const {
  return KvPoolShape{1, 1, kPoolHeadDim, num_pages, page_size, dtype};
}

Status GpuModel::forward(std::span<const ForwardSequence>, KvPool&, ForwardOutput&) {
  return make_error(ErrorCode::kUnsupported, "this strata was built without CUDA");
}

std::optional<ExternalKv> GpuModel::external_kv() const {
  return std::nullopt;  // never created without CUDA
}

Result<std::unique_ptr<CopyDevice>> GpuModel::make_copy_device(std::span<std::byte>, CopyPath) {
  return make_error(ErrorCode::kUnsupported, "this strata was built without CUDA");
}

#endif

}  // namespace strata::cuda
