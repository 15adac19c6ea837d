// Model-like K/V/q rows (see realistic_kv.hpp).
#include "realistic_kv.hpp"

#include <cmath>
#include <random>
#include <vector>

namespace metrale::cli {
namespace {

struct HeadModel {
  float k_scale = 1.0f, v_scale = 1.0f, q_scale = 1.0f;
  std::vector<float> k_offset;  // [D]: nonzero on the outlier channels
  std::vector<float> v_mean;    // [D]: the component all of the head's V rows share
};

std::vector<HeadModel> make_model(const LayerShape& s, const RealisticKv& m) {
  std::mt19937_64 rng(m.model_seed);
  std::uniform_real_distribution<float> log_scale(-1.0f, 1.0f), mag(6.0f, 15.0f);
  std::vector<HeadModel> heads(size_t(s.num_kv_heads));
  const int32_t half = s.head_dim / 2;
  for (HeadModel& h : heads) {
    h.k_scale = std::exp(log_scale(rng));
    h.v_scale = std::exp(log_scale(rng));
    h.q_scale = std::exp(0.5f * log_scale(rng));
    h.k_offset.assign(size_t(s.head_dim), 0.0f);
    std::normal_distribution<float> n01(0.0f, 1.0f);
    for (int32_t d = 0; d < s.head_dim; ++d) h.v_mean.push_back(n01(rng));
    // Outliers sit in the slow-rotating (low-frequency) upper pairs, where
    // real models have them; an offset on either channel of a pair.
    for (int32_t i = 0; i < m.outlier_channels; ++i) {
      const int32_t pair = half / 2 + int32_t(rng() % uint64_t(half - half / 2));
      const int32_t ch = pair + (rng() % 2 ? half : 0);
      h.k_offset[size_t(ch)] = (rng() % 2 ? 1.0f : -1.0f) * mag(rng);
    }
  }
  return heads;
}

// Rotates the pairs (i, i + D/2) of x by pos * theta^(-2i/D) (NeoX-style RoPE).
void rope(float* x, int32_t D, int64_t pos, double theta) {
  const int32_t half = D / 2;
  for (int32_t i = 0; i < half; ++i) {
    const double a = double(pos) * std::pow(theta, -2.0 * i / D);
    const double c = std::cos(a), s = std::sin(a);
    const double x0 = x[i], x1 = x[i + half];
    x[i] = float(x0 * c - x1 * s);
    x[i + half] = float(x0 * s + x1 * c);
  }
}

}  // namespace

void fill_realistic(HostBatch& b, const RealisticKv& m, uint64_t data_seed) {
  const LayerShape& s = b.shape;
  const int32_t D = s.head_dim, H = s.num_kv_heads, group = s.num_q_heads / s.num_kv_heads;
  const std::vector<HeadModel> heads = make_model(s, m);
  std::mt19937_64 rng(data_seed * 0x9e3779b97f4a7c15ull + 3);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(D));
  for (int32_t seq = 0; seq < b.num_seqs(); ++seq) {
    for (int32_t pos = 0; pos < b.seq_lens[size_t(seq)]; ++pos) {
      const int64_t base = (b.first_token[size_t(seq)] + pos) * b.kv_row();
      for (int32_t h = 0; h < H; ++h) {
        const HeadModel& hm = heads[size_t(h)];
        for (int32_t d = 0; d < D; ++d) row[size_t(d)] = hm.k_scale * (n01(rng) + hm.k_offset[size_t(d)]);
        rope(row.data(), D, pos, m.rope_theta);
        for (int32_t d = 0; d < D; ++d) b.key[size_t(base + h * D + d)] = codec::float_to_bf16(row[size_t(d)]);
        for (int32_t d = 0; d < D; ++d)
          b.value[size_t(base + h * D + d)] = codec::float_to_bf16(hm.v_scale * (hm.v_mean[size_t(d)] + n01(rng)));
      }
    }
    // The query of the next token (RoPE'd at its position). It has no
    // outliers of its own: q . k over K's outlier channels already gives
    // logits a spread of a few units (sm_scale = 1/sqrt(D)), as in real layers.
    for (int32_t qh = 0; qh < s.num_q_heads; ++qh) {
      const HeadModel& hm = heads[size_t(qh / group)];
      for (int32_t d = 0; d < D; ++d) row[size_t(d)] = hm.q_scale * n01(rng);
      rope(row.data(), D, b.seq_lens[size_t(seq)], m.rope_theta);
      for (int32_t d = 0; d < D; ++d)
        b.q[size_t(int64_t(seq) * b.q_row() + qh * D + d)] = codec::float_to_bf16(row[size_t(d)]);
    }
  }
}

}  // namespace metrale::cli
