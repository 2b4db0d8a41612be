#include "model/reference_forward.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "common/check.h"

namespace strata {

namespace {

using Vec = std::vector<double>;

Vec matvec(const WeightMatrix& w, const Vec& x, int64_t row_begin, int64_t rows) {
  Vec y(static_cast<size_t>(rows), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0.0;
    for (int64_t c = 0; c < w.cols(); ++c) {
      sum += static_cast<double>(w.at(row_begin + r, c)) * x[static_cast<size_t>(c)];
    }
    y[static_cast<size_t>(r)] = sum;
  }
  return y;
}

Vec rmsnorm(const Vec& x, const std::vector<float>& weight, double eps) {
  double ss = 0.0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * static_cast<double>(weight[i]);
  return y;
}

// Hugging Face's inverse frequencies, written out again rather than shared with the
// fast path so that a mistake in one shows up as a difference.
Vec inverse_frequencies(const ModelConfig& c) {
  const int32_t half = c.head_dim / 2;
  Vec inv(static_cast<size_t>(half));
  for (int32_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / c.head_dim);
    const RopeScaling& s = c.rope_scaling;
    if (s.type == RopeScalingType::kLinear) {
      f = f / s.factor;
    } else if (s.type == RopeScalingType::kLlama3) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      const double old = static_cast<double>(s.original_max_position_embeddings);
      if (wavelen < old / s.high_freq_factor) {
        // high frequency: unchanged
      } else if (wavelen > old / s.low_freq_factor) {
        f = f / s.factor;
      } else {
        const double smooth =
            (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1.0 - smooth) * f / s.factor + smooth * f;
      }
    }
    inv[static_cast<size_t>(i)] = f;
  }
  return inv;
}

void rotate(double* head, int32_t head_dim, int64_t position, const Vec& inv_freq) {
  const int32_t half = head_dim / 2;
  for (int32_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(position) * inv_freq[static_cast<size_t>(i)];
    const double a = head[i];
    const double b = head[i + half];
    head[i] = a * std::cos(angle) - b * std::sin(angle);
    head[i + half] = b * std::cos(angle) + a * std::sin(angle);
  }
}

void head_norm(double* head, int32_t head_dim, const std::vector<float>& weight, double eps) {
  Vec h(head, head + head_dim);
  const Vec y = rmsnorm(h, weight, eps);
  std::copy(y.begin(), y.end(), head);
}

}  // namespace

std::vector<double> reference_forward(const ModelConfig& c, const ModelWeights& w,
                                      std::span<const int32_t> tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t hidden = c.hidden_size;
  const int32_t hd = c.head_dim;
  const int64_t q_size = c.q_size();
  const int64_t kv_size = c.kv_size();
  const int32_t group = c.group_size();
  const Vec inv_freq = inverse_frequencies(c);

  std::vector<Vec> x(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = tokens[static_cast<size_t>(t)];
    STRATA_CHECK(id >= 0 && id < c.vocab_size);
    x[static_cast<size_t>(t)].resize(static_cast<size_t>(hidden));
    for (int64_t i = 0; i < hidden; ++i) {
      x[static_cast<size_t>(t)][static_cast<size_t>(i)] = w.embed.at(id, i);
    }
  }

  for (const LayerWeights& l : w.layers) {
    std::vector<Vec> q(static_cast<size_t>(n)), k(static_cast<size_t>(n)),
        v(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) {
      const Vec xn = rmsnorm(x[static_cast<size_t>(t)], l.attn_norm, c.rms_norm_eps);
      Vec& qt = q[static_cast<size_t>(t)];
      Vec& kt = k[static_cast<size_t>(t)];
      Vec& vt = v[static_cast<size_t>(t)];
      qt = matvec(l.qkv, xn, 0, q_size);
      kt = matvec(l.qkv, xn, q_size, kv_size);
      vt = matvec(l.qkv, xn, q_size + kv_size, kv_size);
      if (!l.qkv_bias.empty()) {
        for (int64_t i = 0; i < q_size; ++i)
          qt[static_cast<size_t>(i)] += l.qkv_bias[static_cast<size_t>(i)];
        for (int64_t i = 0; i < kv_size; ++i) {
          kt[static_cast<size_t>(i)] += l.qkv_bias[static_cast<size_t>(q_size + i)];
          vt[static_cast<size_t>(i)] += l.qkv_bias[static_cast<size_t>(q_size + kv_size + i)];
        }
      }
      for (int32_t h = 0; h < c.num_heads; ++h) {
        double* head = qt.data() + static_cast<size_t>(h) * hd;
        if (!l.q_norm.empty()) head_norm(head, hd, l.q_norm, c.rms_norm_eps);
        rotate(head, hd, t, inv_freq);
      }
      for (int32_t h = 0; h < c.num_kv_heads; ++h) {
        double* head = kt.data() + static_cast<size_t>(h) * hd;
        if (!l.k_norm.empty()) head_norm(head, hd, l.k_norm, c.rms_norm_eps);
        rotate(head, hd, t, inv_freq);
      }
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    for (int64_t t = 0; t < n; ++t) {
      Vec attn(static_cast<size_t>(q_size), 0.0);
      const int64_t first =
          c.sliding_window > 0 ? std::max<int64_t>(0, t - c.sliding_window + 1) : 0;
      for (int32_t h = 0; h < c.num_heads; ++h) {
        const int32_t kvh = h / group;
        Vec scores;
        double max_score = -std::numeric_limits<double>::infinity();
        for (int64_t s = first; s <= t; ++s) {
          double dot = 0.0;
          for (int32_t d = 0; d < hd; ++d) {
            dot += q[static_cast<size_t>(t)][static_cast<size_t>(h * hd + d)] *
                   k[static_cast<size_t>(s)][static_cast<size_t>(kvh * hd + d)];
          }
          scores.push_back(dot * scale);
          max_score = std::max(max_score, dot * scale);
        }
        double total = 0.0;
        for (double& sc : scores) {
          sc = std::exp(sc - max_score);
          total += sc;
        }
        for (int64_t s = first; s <= t; ++s) {
          const double p = scores[static_cast<size_t>(s - first)] / total;
          for (int32_t d = 0; d < hd; ++d) {
            attn[static_cast<size_t>(h * hd + d)] +=
                p * v[static_cast<size_t>(s)][static_cast<size_t>(kvh * hd + d)];
          }
        }
      }
      const Vec o = matvec(l.o, attn, 0, hidden);
      Vec& xt = x[static_cast<size_t>(t)];
      for (int64_t i = 0; i < hidden; ++i) {
        xt[static_cast<size_t>(i)] +=
            o[static_cast<size_t>(i)] + (l.o_bias.empty() ? 0.0 : l.o_bias[static_cast<size_t>(i)]);
      }
    }
    for (int64_t t = 0; t < n; ++t) {
      Vec& xt = x[static_cast<size_t>(t)];
      const Vec xn = rmsnorm(xt, l.mlp_norm, c.rms_norm_eps);
      const int64_t ffn = c.intermediate_size;
      const Vec gate = matvec(l.gate_up, xn, 0, ffn);
      const Vec up = matvec(l.gate_up, xn, ffn, ffn);
      Vec act(static_cast<size_t>(ffn));
      for (int64_t i = 0; i < ffn; ++i) {
        const double g = gate[static_cast<size_t>(i)];
        act[static_cast<size_t>(i)] = g / (1.0 + std::exp(-g)) * up[static_cast<size_t>(i)];
      }
      const Vec down = matvec(l.down, act, 0, hidden);
      for (int64_t i = 0; i < hidden; ++i)
        xt[static_cast<size_t>(i)] += down[static_cast<size_t>(i)];
    }
  }

  std::vector<double> logits(static_cast<size_t>(n) * static_cast<size_t>(c.vocab_size));
  const WeightMatrix& out = w.output();
  for (int64_t t = 0; t < n; ++t) {
    const Vec h = rmsnorm(x[static_cast<size_t>(t)], w.final_norm, c.rms_norm_eps);
    const Vec row = matvec(out, h, 0, c.vocab_size);
    std::copy(row.begin(), row.end(), logits.begin() + t * c.vocab_size);
  }
  return logits;
}

}  // namespace strata
