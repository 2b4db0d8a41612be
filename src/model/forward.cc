// Model::forward: the batched forward pass. All new tokens of all sequences form one
// matrix of T rows, so every projection is one GEMM over the whole batch; only
// attention looks at sequences (each over its own pages).
#include <algorithm>
#include <chrono>
#include <new>
#include <string>

#include "model/model.h"

namespace strata {

namespace {

using Clock = std::chrono::steady_clock;

// Below this many elements a row kernel runs on the calling thread alone: waking the
// pool costs more than it saves.
constexpr int64_t kParallelMinElements = 16384;

class PhaseTimer {
 public:
  PhaseTimer(bool enabled, double& slot) : enabled_(enabled), slot_(slot) {
    if (enabled_) start_ = Clock::now();
  }
  ~PhaseTimer() {
    if (enabled_) slot_ += std::chrono::duration<double>(Clock::now() - start_).count();
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  bool enabled_;
  double& slot_;
  Clock::time_point start_;
};

// Calls fn(row) for every row in [0, rows), spread over the pool in blocks when the
// work (rows x row_elements) is large enough to pay for it.
template <typename Fn>
void for_rows(ThreadPool& pool, int64_t rows, int64_t row_elements, Fn&& fn) {
  if (rows * row_elements < kParallelMinElements || pool.num_threads() == 1) {
    for (int64_t r = 0; r < rows; ++r) fn(r);
    return;
  }
  const int64_t blocks = std::min<int64_t>(rows, 4 * static_cast<int64_t>(pool.num_threads()));
  const int64_t per_block = (rows + blocks - 1) / blocks;
  pool.run(blocks, [&](int64_t block, int) {
    const int64_t end = std::min(rows, (block + 1) * per_block);
    for (int64_t r = block * per_block; r < end; ++r) fn(r);
  });
}

// A fused projection, or its parts one after another into consecutive columns of c.
void project(Matmul& matmul, ThreadPool& pool, const float* a, int64_t m, int64_t lda,
             const WeightMatrix& fused, const std::vector<WeightMatrix>& parts, float* c,
             int64_t ldc) {
  if (parts.empty()) {
    matmul.run(pool, a, m, lda, fused, c, ldc, false);
    return;
  }
  int64_t column = 0;
  for (const WeightMatrix& part : parts) {
    matmul.run(pool, a, m, lda, part, c + column, ldc, false);
    column += part.rows();
  }
}

}  // namespace

Status Model::validate(std::span<const ForwardSequence> batch, const KvPool& pool) const {
  auto bad = [](const std::string& what) {
    return make_error(ErrorCode::kInvalidArgument, "forward: " + what);
  };
  if (pool.num_layers() != config_.num_layers || pool.num_kv_heads() != config_.num_kv_heads ||
      pool.head_dim() != config_.head_dim) {
    return bad("the KV pool's shape (layers, KV heads, head_dim) is not the model's");
  }
  for (size_t s = 0; s < batch.size(); ++s) {
    const ForwardSequence& seq = batch[s];
    const std::string where = "sequence " + std::to_string(s) + ": ";
    if (seq.token_ids.empty()) return bad(where + "no tokens");
    if (seq.start_position < 0) return bad(where + "negative start_position");
    const int64_t end = seq.start_position + static_cast<int64_t>(seq.token_ids.size());
    if (end > config_.max_position_embeddings) {
      return bad(where + "positions up to " + std::to_string(end) +
                 " exceed max_position_embeddings " +
                 std::to_string(config_.max_position_embeddings));
    }
    for (int32_t id : seq.token_ids) {
      if (id < 0 || id >= config_.vocab_size) {
        return bad(where + "token id " + std::to_string(id) + " outside the vocabulary of " +
                   std::to_string(config_.vocab_size));
      }
    }
    const int64_t pages_needed = (end + pool.page_size() - 1) / pool.page_size();
    if (static_cast<int64_t>(seq.page_table.size()) < pages_needed) {
      return bad(where + "page table has " + std::to_string(seq.page_table.size()) +
                 " pages, positions [0, " + std::to_string(end) + ") need " +
                 std::to_string(pages_needed));
    }
    for (int64_t p = 0; p < pages_needed; ++p) {
      if (!pool.is_valid_page(seq.page_table[static_cast<size_t>(p)])) {
        return bad(where + "page table entry " + std::to_string(p) + " (page " +
                   std::to_string(page_index(seq.page_table[static_cast<size_t>(p)])) +
                   ") is not a page of the pool");
      }
    }
  }
  return {};
}

void Model::grow_scratch(int64_t num_tokens) {
  if (num_tokens <= scratch_tokens_) return;
  const size_t t = static_cast<size_t>(num_tokens);
  const size_t f = sizeof(float);
  x_.resize(t * static_cast<size_t>(config_.hidden_size) * f);
  xn_.resize(t * static_cast<size_t>(config_.hidden_size) * f);
  qkv_.resize(t * static_cast<size_t>(config_.q_size() + 2 * config_.kv_size()) * f);
  attn_.resize(t * static_cast<size_t>(config_.q_size()) * f);
  gate_up_.resize(t * 2 * static_cast<size_t>(config_.intermediate_size) * f);
  rope_cs_.resize(t * static_cast<size_t>(config_.head_dim) * f);
  last_.resize(t * static_cast<size_t>(config_.hidden_size) * f);
  scratch_tokens_ = num_tokens;
}

Status Model::forward(std::span<const ForwardSequence> batch, KvPool& pool,
                      std::vector<float>& logits) {
  if (auto s = validate(batch, pool); !s) return s;
  // Scratch grows on the calling thread (never inside pool tasks); running out of
  // memory there is an error value, not an exception through the API.
  try {
    return forward_validated(batch, pool, logits);
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kResourceExhausted,
                      "forward: out of memory for the scratch of a batch of " +
                          std::to_string(batch.size()) + " sequences");
  }
}

Status Model::forward_validated(std::span<const ForwardSequence> batch, KvPool& pool,
                                std::vector<float>& logits) {
  int64_t num_tokens = 0;
  int64_t num_logit_rows = 0;
  for (const ForwardSequence& seq : batch) {
    num_tokens += static_cast<int64_t>(seq.token_ids.size());
    if (seq.want_logits) ++num_logit_rows;
  }
  logits.resize(static_cast<size_t>(num_logit_rows) * static_cast<size_t>(config_.vocab_size));
  if (num_tokens == 0) return {};
  grow_scratch(num_tokens);

  const int64_t hidden = config_.hidden_size;
  const int64_t q_size = config_.q_size();
  const int64_t kv_size = config_.kv_size();
  const int64_t qkv_stride = q_size + 2 * kv_size;
  const int64_t ffn = config_.intermediate_size;
  const int32_t head_dim = config_.head_dim;
  const int32_t half = head_dim / 2;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const bool prof = profiling_;
  ForwardProfile& pr = profile_;

  float* x = x_.as<float>();
  float* xn = xn_.as<float>();
  float* qkv = qkv_.as<float>();
  float* attn = attn_.as<float>();
  float* gu = gate_up_.as<float>();
  float* cs = rope_cs_.as<float>();

  // ---- per-token metadata, embeddings, rotary angles ----
  token_position_.resize(static_cast<size_t>(num_tokens));
  token_sequence_.resize(static_cast<size_t>(num_tokens));
  attention_batch_.clear();
  {
    int64_t row = 0;
    for (size_t s = 0; s < batch.size(); ++s) {
      const ForwardSequence& seq = batch[s];
      attention_batch_.push_back(AttentionSequence{row, static_cast<int32_t>(seq.token_ids.size()),
                                                   seq.start_position, seq.page_table});
      for (size_t i = 0; i < seq.token_ids.size(); ++i, ++row) {
        token_position_[static_cast<size_t>(row)] = seq.start_position + static_cast<int64_t>(i);
        token_sequence_[static_cast<size_t>(row)] = static_cast<int32_t>(s);
      }
    }
  }
  {
    PhaseTimer timer(prof, pr.embed_s);
    for_rows(pool_, num_tokens, hidden + 8 * half, [&](int64_t t) {
      const ForwardSequence& seq =
          batch[static_cast<size_t>(token_sequence_[static_cast<size_t>(t)])];
      const int64_t i = token_position_[static_cast<size_t>(t)] - seq.start_position;
      weights_.embed.row_to_f32(seq.token_ids[static_cast<size_t>(i)], x + t * hidden);
      rope_.angles(token_position_[static_cast<size_t>(t)], cs + t * head_dim,
                   cs + t * head_dim + half);
    });
  }

  const int32_t page_size = pool.page_size();
  const bool waits_prefix = std::any_of(
      batch.begin(), batch.end(), [](const ForwardSequence& s) { return s.layer_wait != nullptr; });

  for (int32_t layer = 0; layer < config_.num_layers; ++layer) {
    const LayerWeights& lw = weights_.layers[static_cast<size_t>(layer)];
    {
      PhaseTimer timer(prof, pr.norm_s);
      for_rows(pool_, num_tokens, hidden, [&](int64_t t) {
        rmsnorm_row(x + t * hidden, lw.attn_norm.data(), xn + t * hidden, hidden, eps);
      });
    }
    {
      PhaseTimer timer(prof, pr.qkv_s);
      project(matmul_, pool_, xn, num_tokens, hidden, lw.qkv, lw.qkv_parts, qkv, qkv_stride);
    }
    {
      PhaseTimer timer(prof, pr.rope_store_s);
      for_rows(pool_, num_tokens, qkv_stride, [&](int64_t t) {
        float* row = qkv + t * qkv_stride;
        if (!lw.qkv_bias.empty()) add_row(row, lw.qkv_bias.data(), qkv_stride);
        const float* cos = cs + t * head_dim;
        const float* sin = cos + half;
        for (int32_t h = 0; h < config_.num_heads; ++h) {
          float* head = row + static_cast<int64_t>(h) * head_dim;
          if (!lw.q_norm.empty()) rmsnorm_row(head, lw.q_norm.data(), head, head_dim, eps);
          rope_apply(head, cos, sin, half);
        }
        for (int32_t h = 0; h < config_.num_kv_heads; ++h) {
          float* k = row + q_size + static_cast<int64_t>(h) * head_dim;
          if (!lw.k_norm.empty()) rmsnorm_row(k, lw.k_norm.data(), k, head_dim, eps);
          rope_apply(k, cos, sin, half);
        }
        const int64_t position = token_position_[static_cast<size_t>(t)];
        const ForwardSequence& seq =
            batch[static_cast<size_t>(token_sequence_[static_cast<size_t>(t)])];
        pool.write_token(layer, seq.page_table[static_cast<size_t>(position / page_size)],
                         static_cast<int32_t>(position % page_size), row + q_size,
                         row + q_size + kv_size);
      });
    }
    if (waits_prefix) {
      PhaseTimer timer(prof, pr.kv_wait_s);
      for (const ForwardSequence& seq : batch) {
        if (seq.layer_wait == nullptr) continue;
        if (auto st = (*seq.layer_wait)(layer); !st) return st;
      }
    }
    {
      PhaseTimer timer(prof, pr.attention_s);
      attention_.run(pool_, attention_batch_, qkv, qkv_stride, pool, layer, attn, q_size);
    }
    {
      PhaseTimer timer(prof, pr.o_proj_s);
      matmul_.run(pool_, attn, num_tokens, q_size, lw.o, x, hidden, true);
      if (!lw.o_bias.empty()) {
        for_rows(pool_, num_tokens, hidden,
                 [&](int64_t t) { add_row(x + t * hidden, lw.o_bias.data(), hidden); });
      }
    }
    {
      PhaseTimer timer(prof, pr.norm_s);
      for_rows(pool_, num_tokens, hidden, [&](int64_t t) {
        rmsnorm_row(x + t * hidden, lw.mlp_norm.data(), xn + t * hidden, hidden, eps);
      });
    }
    {
      PhaseTimer timer(prof, pr.gate_up_s);
      project(matmul_, pool_, xn, num_tokens, hidden, lw.gate_up, lw.gate_up_parts, gu, 2 * ffn);
    }
    {
      PhaseTimer timer(prof, pr.silu_s);
      for_rows(pool_, num_tokens, ffn, [&](int64_t t) {
        float* row = gu + t * 2 * ffn;
        silu_mul_row(row, row + ffn, row, ffn);
      });
    }
    {
      PhaseTimer timer(prof, pr.down_s);
      matmul_.run(pool_, gu, num_tokens, 2 * ffn, lw.down, x, hidden, true);
    }
  }

  // ---- logits of the last token of each sequence that wants them ----
  if (num_logit_rows > 0) {
    PhaseTimer timer(prof, pr.logits_s);
    float* last = last_.as<float>();
    int64_t out_row = 0;
    int64_t row = 0;
    for (const ForwardSequence& seq : batch) {
      row += static_cast<int64_t>(seq.token_ids.size());
      if (!seq.want_logits) continue;
      rmsnorm_row(x + (row - 1) * hidden, weights_.final_norm.data(), last + out_row * hidden,
                  hidden, eps);
      ++out_row;
    }
    matmul_.run(pool_, last, num_logit_rows, hidden, weights_.output(), logits.data(),
                config_.vocab_size, false);
  }
  if (prof) {
    ++pr.calls;
    pr.tokens += num_tokens;
  }
  return {};
}

}  // namespace strata
