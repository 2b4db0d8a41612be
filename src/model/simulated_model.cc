#include "model/simulated_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>

#include "model/sampler.h"

namespace strata {
namespace {

constexpr uint32_t kSimSeed = 0x5bd1e995u;  // the hash before a sequence's first token
constexpr int32_t kSimHeadDim = 2;          // K and V of one head: four bytes of hash

// MurmurHash3's finalizer: every input bit affects every output bit.
uint32_t sim_fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

uint32_t sim_extend(uint32_t h, int32_t token) {
  return sim_fmix32(h ^ (static_cast<uint32_t>(token) * 0x9e3779b1u + 0x7f4a7c15u));
}

void sim_store(KvPool& pool, PageId page, int32_t slot, uint32_t h) {
  const float k[kSimHeadDim] = {static_cast<float>(h & 0xff), static_cast<float>((h >> 8) & 0xff)};
  const float v[kSimHeadDim] = {static_cast<float>((h >> 16) & 0xff), static_cast<float>(h >> 24)};
  pool.write_token(0, page, slot, k, v);
}

uint32_t sim_load(const KvPool& pool, PageId page, int32_t slot) {
  float k[kSimHeadDim];
  float v[kSimHeadDim];
  pool.read_token(0, page, slot, k, v);
  auto byte = [](float f) { return static_cast<uint32_t>(std::lround(f)) & 0xff; };
  return byte(k[0]) | byte(k[1]) << 8 | byte(v[0]) << 16 | byte(v[1]) << 24;
}

}  // namespace

Result<std::unique_ptr<SimulatedModel>> SimulatedModel::create(ModelConfig config,
                                                               TimingProfile profile,
                                                               SimulatedModelOptions options) {
  if (config.vocab_size <= kMaxTopLogprobs || config.vocab_size > (1 << 24)) {
    return bad_argument("the simulator needs a vocabulary of 21 to 2^24 tokens (it has " +
                        std::to_string(config.vocab_size) + ")");
  }
  if (!(options.time_scale > 0 && options.time_scale <= 1000)) {
    return bad_argument("time_scale must be in (0, 1000]");
  }
  if (options.spin_tail_us < 0 || options.spin_tail_us > 1'000'000) {
    return bad_argument("spin_tail_us must be in [0, 1000000]");
  }
  if (options.output_token_ids.empty()) {
    for (int32_t t = 0; t < config.vocab_size; ++t) {
      if (t == config.bos_token_id) continue;
      if (std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(), t) !=
          config.eos_token_ids.end()) {
        continue;
      }
      options.output_token_ids.push_back(t);
    }
    if (options.output_token_ids.empty()) options.output_token_ids.push_back(0);
  }
  for (int32_t t : options.output_token_ids) {
    if (t < 0 || t >= config.vocab_size) {
      return bad_argument("output token id " + std::to_string(t) + " is outside the vocabulary");
    }
  }
  return std::unique_ptr<SimulatedModel>(
      new SimulatedModel(std::move(config), std::move(profile), std::move(options)));
}

SimulatedModel::SimulatedModel(ModelConfig config, TimingProfile profile,
                               SimulatedModelOptions options)
    : config_(std::move(config)), profile_(std::move(profile)), options_(std::move(options)) {}

KvPoolShape SimulatedModel::kv_pool_shape(int32_t num_pages, int32_t page_size,
                                          KvDtype dtype) const {
  return KvPoolShape{1, 1, kSimHeadDim, num_pages, page_size, dtype};
}

double SimulatedModel::predict_ms(std::span<const ForwardSequence> batch) const {
  double decode_seqs = 0;
  double decode_context = 0;
  double prefill_tokens = 0;
  double prefill_context = 0;  // sum over tokens of their sequence's cached context
  for (const ForwardSequence& s : batch) {
    const auto n = static_cast<double>(s.token_ids.size());
    const auto start = static_cast<double>(s.start_position);
    if (s.token_ids.size() == 1) {
      decode_seqs += 1;
      decode_context += start;
    } else {
      prefill_tokens += n;
      prefill_context += n * start;
    }
  }
  double ms = 0;
  if (decode_seqs > 0) ms += profile_.decode_ms(decode_seqs, decode_context / decode_seqs);
  if (prefill_tokens > 0) {
    ms += profile_.prefill_ms(prefill_tokens, prefill_context / prefill_tokens);
  }
  return ms * options_.time_scale;
}

int32_t SimulatedModel::token_of(uint32_t hash) const {
  const uint32_t h = sim_fmix32(hash ^ 0xa5a5a5a5u);
  return options_.output_token_ids[h % options_.output_token_ids.size()];
}

int32_t SimulatedModel::next_token(std::span<const int32_t> tokens) const {
  uint32_t h = kSimSeed;
  for (int32_t t : tokens) h = sim_extend(h, t);
  return token_of(h);
}

Status SimulatedModel::validate(std::span<const ForwardSequence> batch, const KvPool& pool) const {
  const KvPoolShape want = kv_pool_shape(pool.num_pages(), pool.page_size(), pool.dtype());
  if (pool.num_layers() != want.num_layers || pool.num_kv_heads() != want.num_kv_heads ||
      pool.head_dim() != want.head_dim) {
    return bad_argument("the KV pool's shape is not the simulator's (1 layer, 1 head, dim 2)");
  }
  const int64_t ps = pool.page_size();
  for (size_t i = 0; i < batch.size(); ++i) {
    const ForwardSequence& s = batch[i];
    const std::string which = "sequence " + std::to_string(i) + ": ";
    if (s.token_ids.empty()) return bad_argument(which + "no tokens");
    if (s.start_position < 0) return bad_argument(which + "negative start position");
    for (int32_t t : s.token_ids) {
      if (t < 0 || t >= config_.vocab_size) {
        return bad_argument(which + "token id " + std::to_string(t) + " outside the vocabulary");
      }
    }
    const int64_t end = s.start_position + static_cast<int64_t>(s.token_ids.size());
    if (end > config_.max_position_embeddings) {
      return bad_argument(which + "positions beyond max_position_embeddings");
    }
    if (static_cast<int64_t>(s.page_table.size()) * ps < end) {
      return bad_argument(which + "the page table is too short");
    }
    for (int64_t p = 0; p < (end + ps - 1) / ps; ++p) {
      if (!pool.is_valid_page(s.page_table[static_cast<size_t>(p)])) {
        return bad_argument(which + "a page outside the pool");
      }
    }
  }
  return {};
}

Status SimulatedModel::forward(std::span<const ForwardSequence> batch, KvPool& pool,
                               ForwardOutput& out) {
  const auto t0 = std::chrono::steady_clock::now();
  if (auto st = validate(batch, pool); !st) return st;
  out.logits.clear();
  out.tokens.clear();
  out.sampled.clear();
  const int32_t ps = pool.page_size();
  for (const ForwardSequence& s : batch) {
    int64_t pos = s.start_position;
    uint32_t h = kSimSeed;
    if (pos > 0) {
      // The pool has one layer: its wait is the whole prefix's.
      if (s.layer_wait != nullptr) {
        if (auto st = (*s.layer_wait)(0); !st) return st;
      }
      h = sim_load(pool, s.page_table[static_cast<size_t>((pos - 1) / ps)],
                   static_cast<int32_t>((pos - 1) % ps));
    }
    for (int32_t t : s.token_ids) {
      h = sim_extend(h, t);
      sim_store(pool, s.page_table[static_cast<size_t>(pos / ps)], static_cast<int32_t>(pos % ps),
                h);
      ++pos;
    }
    if (s.want_logits) out.tokens.push_back(token_of(h));
  }
  // Sleeping, not spinning: dozens of simulated workers share a few cores, and a spinning
  // one would take a core for its whole step. A sleep overshoots by the timer slack and the
  // wake-up latency (tens of microseconds on an idle machine), small beside profile times of
  // milliseconds; spin_tail_us buys sub-millisecond precision where one worker runs alone.
  const double predicted_ms = predict_ms(batch);
  const auto deadline = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double, std::milli>(predicted_ms));
  const auto spin_from = deadline - std::chrono::microseconds(options_.spin_tail_us);
  std::this_thread::sleep_until(spin_from);
  while (std::chrono::steady_clock::now() < deadline) {
  }
  const double elapsed_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard lock(stats_mutex_);
  ++stats_.passes;
  stats_.predicted_ms += predicted_ms;
  stats_.elapsed_ms += elapsed_ms;
  stats_.max_overshoot_ms = std::max(stats_.max_overshoot_ms, elapsed_ms - predicted_ms);
  return {};
}

SimulatedModelStats SimulatedModel::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

}  // namespace strata
