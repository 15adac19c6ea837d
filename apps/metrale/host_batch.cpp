// The demo's host batch and the per-format cache setup (see host_batch.hpp).
#include "host_batch.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

#include "metrale/cpu.hpp"

namespace metrale::cli {
namespace {

// splitmix64: fast, good enough for test data.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Sum of 4 uniforms on [-0.5, 0.5] (Irwin-Hall): bell-shaped on [-2, 2], variance 1/3.
  float uniform_sum4() {
    const uint64_t h = next();
    const float s4 = float(h & 0xffff) + float((h >> 16) & 0xffff) + float((h >> 32) & 0xffff) + float(h >> 48);
    return s4 / 65535.0f - 2.0f;
  }
};

}  // namespace

int32_t HostBatch::max_seq_len() const {
  return seq_lens.empty() ? 0 : *std::max_element(seq_lens.begin(), seq_lens.end());
}

HostBatch make_batch(const LayerShape& shape, int32_t num_seqs, int32_t max_len, uint64_t seed) {
  if (num_seqs < 1) throw std::invalid_argument("--seqs must be >= 1, got " + std::to_string(num_seqs));
  if (max_len < 1) throw std::invalid_argument("--max-len must be >= 1, got " + std::to_string(max_len));
  const double bytes = double(num_seqs) * max_len * shape.num_kv_heads * shape.head_dim * 2 * sizeof(bf16);
  if (bytes > double(8ull << 30))
    throw std::invalid_argument("--seqs x --max-len too large: up to " + std::to_string(int64_t(bytes / (1 << 20))) +
                                " MiB of host K/V rows (limit 8 GiB)");
  HostBatch b;
  b.shape = shape;
  Rng rng{seed * 0x2545f4914f6cdd1dull + 1};
  const int32_t lo = std::max(1, max_len / 8);
  for (int32_t s = 0; s < num_seqs; ++s)
    b.seq_lens.push_back(s == 0 ? max_len : lo + int32_t(rng.next() % uint64_t(max_len - lo + 1)));

  const int32_t B = shape.block_size;
  b.max_blocks_per_seq = (max_len + B - 1) / B;
  for (int32_t len : b.seq_lens) b.num_blocks += (len + B - 1) / B;
  std::vector<int32_t> pages(size_t(b.num_blocks));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), std::mt19937_64(seed));
  b.block_tables.assign(size_t(num_seqs) * b.max_blocks_per_seq, 0);
  size_t next_page = 0;
  for (int32_t s = 0; s < num_seqs; ++s) {
    b.first_token.push_back(b.num_tokens());
    int32_t* row = &b.block_tables[size_t(s) * b.max_blocks_per_seq];
    for (int32_t p = 0; p < (b.seq_lens[s] + B - 1) / B; ++p) row[p] = pages[next_page++];
    for (int32_t pos = 0; pos < b.seq_lens[s]; ++pos) b.slot_mapping.push_back(int64_t(row[pos / B]) * B + pos % B);
  }

  // The distribution of bench::DecodeWorkload (the GPU benchmarks' data):
  // values roughly normal in [-2, 2] (a sum of 4 uniforms), and in K the
  // channels at row index % 41 == 7 (about 3 per kv head) 12x larger, like the
  // outlier channels of real models' keys. q and V have no outliers.
  const int64_t n = b.num_tokens() * b.kv_row();
  b.key.resize(size_t(n));
  b.value.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) {
    const float outlier = (i % b.kv_row()) % 41 == 7 ? 12.0f : 1.0f;
    b.key[i] = codec::float_to_bf16(outlier * rng.uniform_sum4());
    b.value[i] = codec::float_to_bf16(rng.uniform_sum4());
  }
  b.q.resize(size_t(b.out_elems()));
  for (auto& x : b.q) x = codec::float_to_bf16(rng.uniform_sum4());
  b.sm_scale = 1.0f / std::sqrt(float(shape.head_dim));
  return b;
}

CacheWriteArgs HostBatch::write_args(const bf16* key_rows, const bf16* value_rows, const int64_t* slots,
                                     const KvCacheView& cache) const {
  CacheWriteArgs w;
  w.key = key_rows;
  w.key_stride = kv_row();
  w.value = value_rows;
  w.value_stride = kv_row();
  w.slot_mapping = slots;
  w.num_tokens = num_tokens();
  w.cache = cache;
  return w;
}

AttnArgs HostBatch::decode_args(const bf16* q_rows, const KvCacheView& cache, const int32_t* tables,
                                  const int32_t* lens, bf16* out) const {
  AttnArgs a;
  a.q = q_rows;
  a.q_stride = q_row();
  a.num_seqs = num_seqs();
  a.num_q_heads = shape.num_q_heads;
  a.cache = cache;
  a.block_tables = tables;
  a.max_blocks_per_seq = max_blocks_per_seq;
  a.seq_lens = lens;
  a.sm_scale = sm_scale;
  a.out = out;
  return a;
}

test::KvRows bf16_rows(const HostBatch& b) {
  return [&b](int32_t seq, int32_t pos, int32_t kvh, double* k, double* v) {
    const int64_t row = (b.first_token[size_t(seq)] + pos) * b.kv_row() + int64_t(kvh) * b.shape.head_dim;
    for (int32_t d = 0; d < b.shape.head_dim; ++d) {
      k[d] = codec::bf16_to_float(b.key[size_t(row + d)]);
      v[d] = codec::bf16_to_float(b.value[size_t(row + d)]);
    }
  };
}

KvCacheLayout make_layout(KvFormat format, const LayerShape& s, int64_t num_blocks) {
  return KvCacheLayout::make(format, num_blocks, s.block_size, s.num_kv_heads, s.head_dim);
}

KvScales calibrated_scales(const HostBatch& b, KvFormat format) {
  float k_absmax = 0.0f, v_absmax = 0.0f;
  cpu::bf16_absmax(b.key.data(), b.num_tokens(), b.kv_row(), b.kv_row(), &k_absmax);
  cpu::bf16_absmax(b.value.data(), b.num_tokens(), b.kv_row(), b.kv_row(), &v_absmax);
  return kv_scales_from_absmax(format, k_absmax, v_absmax);
}

}  // namespace metrale::cli
