// Float64 reference attention and error statistics (see reference_f64.hpp).
#include "reference_f64.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

namespace metrale::cli {

KvRowSource bf16_rows(const HostBatch& b) {
  return [&b](int32_t seq, int32_t pos, int32_t kvh, double* k, double* v) {
    const int64_t row = (b.first_token[seq] + pos) * b.kv_row() + int64_t(kvh) * b.shape.head_dim;
    for (int32_t d = 0; d < b.shape.head_dim; ++d) {
      k[d] = codec::bf16_to_float(b.key[row + d]);
      v[d] = codec::bf16_to_float(b.value[row + d]);
    }
  };
}

KvRowSource cache_rows(const HostBatch& b, const KvCacheView& c) {
  return [&b, c](int32_t seq, int32_t pos, int32_t kvh, double* k, double* v) {
    const KvCacheLayout& l = c.layout;
    const int32_t D = l.head_dim;
    const int64_t page = b.block_tables[size_t(seq) * b.max_blocks_per_seq + pos / l.block_size];
    const int64_t row = int64_t(pos % l.block_size) * l.num_kv_heads + kvh;  // (t*H + h)
    const uint8_t* pages[2] = {static_cast<const uint8_t*>(c.k) + page * l.page_stride_bytes,
                               static_cast<const uint8_t*>(c.v) + page * l.page_stride_bytes};
    double* dst[2] = {k, v};
    for (int which = 0; which < 2; ++which) {
      const uint8_t* p = pages[which];
      for (int32_t d = 0; d < D; ++d) {
        double x = 0.0;
        switch (l.format) {
          case KvFormat::bf16: {
            bf16 raw;
            std::memcpy(&raw, p + (row * D + d) * 2, 2);
            x = codec::bf16_to_float(raw);
            break;
          }
          case KvFormat::fp8_e4m3:
            x = double(codec::e4m3_to_float(p[row * D + d])) * (which ? c.scales.v_scale : c.scales.k_scale);
            break;
          case KvFormat::nvfp4: {
            const uint8_t byte = p[row * D / 2 + d / 2];
            const double s = codec::e4m3_to_float(p[l.data_section_bytes + row * (D / 16) + d / 16]);
            x = double(codec::e2m1_to_float(d % 2 ? byte >> 4 : byte & 15)) * s *
                (which ? c.scales.v_global_scale : c.scales.k_global_scale);
            break;
          }
        }
        dst[which][d] = x;
      }
    }
  };
}

std::vector<double> attention_f64(const HostBatch& b, const KvRowSource& rows) {
  const int32_t Hq = b.shape.num_q_heads, D = b.shape.head_dim;
  const int32_t group = Hq / b.shape.num_kv_heads;
  std::vector<double> out(size_t(b.out_elems()), 0.0);
  auto one_seq = [&](int32_t s) {
    const int32_t L = b.seq_lens[s];
    std::vector<double> k(size_t(L) * D), v(size_t(L) * D), logits(static_cast<size_t>(L));
    for (int32_t kvh = 0; kvh < b.shape.num_kv_heads; ++kvh) {
      for (int32_t j = 0; j < L; ++j) rows(s, j, kvh, &k[size_t(j) * D], &v[size_t(j) * D]);
      for (int32_t g = 0; g < group; ++g) {
        const int32_t h = kvh * group + g;
        const bf16* q = &b.q[size_t(s) * b.q_row() + size_t(h) * D];
        double m = -INFINITY;
        for (int32_t j = 0; j < L; ++j) {
          double dot = 0.0;
          for (int32_t d = 0; d < D; ++d) dot += double(codec::bf16_to_float(q[d])) * k[size_t(j) * D + d];
          logits[j] = dot * double(b.sm_scale);
          m = std::max(m, logits[j]);
        }
        double sum = 0.0;
        double* o = &out[(size_t(s) * Hq + h) * D];
        for (int32_t j = 0; j < L; ++j) {
          const double p = std::exp(logits[j] - m);
          sum += p;
          for (int32_t d = 0; d < D; ++d) o[d] += p * v[size_t(j) * D + d];
        }
        if (sum > 0.0)
          for (int32_t d = 0; d < D; ++d) o[d] /= sum;
      }
    }
  };
  // Sequences are independent: spread them over the host's cores.
  const int32_t n = b.num_seqs();
  const int32_t workers = std::max(1, std::min<int32_t>(n, int32_t(std::thread::hardware_concurrency())));
  std::vector<std::thread> pool;
  for (int32_t w = 0; w < workers; ++w)
    pool.emplace_back([&, w] {
      for (int32_t s = w; s < n; s += workers) one_seq(s);
    });
  for (auto& t : pool) t.join();
  return out;
}

ErrorStats compare_to_reference(const bf16* out, const std::vector<double>& ref, int32_t num_seqs,
                                int32_t num_q_heads, int32_t head_dim) {
  ErrorStats e;
  double sum = 0.0;
  for (int64_t blk = 0; blk < int64_t(num_seqs) * num_q_heads; ++blk) {
    double err2 = 0.0, ref2 = 0.0;
    bool finite = true;
    for (int32_t d = 0; d < head_dim; ++d) {
      const int64_t i = blk * head_dim + d;
      const double o = codec::bf16_to_float(out[i]);
      if (!std::isfinite(o)) {
        ++e.nonfinite;
        finite = false;
      }
      err2 += (o - ref[i]) * (o - ref[i]);
      ref2 += ref[i] * ref[i];
    }
    if (ref2 == 0.0) continue;
    const double rel = finite ? std::sqrt(err2 / ref2) : INFINITY;
    e.max_rel_l2 = std::max(e.max_rel_l2, rel);
    sum += rel;
    ++e.blocks;
  }
  e.mean_rel_l2 = e.blocks ? sum / double(e.blocks) : 0.0;
  return e;
}

}  // namespace metrale::cli
