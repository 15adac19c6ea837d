// The float64 decode reference and the comparison (see reference.hpp).
#include "testing/reference.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace metrale::test {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Element d of row `row` (= t * num_kv_heads + h) of one page, dequantized.
double page_value(const KvCacheView& c, const uint8_t* page, bool is_v, int64_t row, int32_t d) {
  const KvCacheLayout& l = c.layout;
  const int32_t D = l.head_dim;
  switch (l.format) {
    case KvFormat::bf16: {
      const uint8_t* e = page + (row * D + d) * 2;
      return double(codec::bf16_to_float(bf16{uint16_t(e[0] | (e[1] << 8))}));
    }
    case KvFormat::fp8_e4m3:
      return double(codec::e4m3_to_float(page[row * D + d])) * (is_v ? c.scales.v_scale : c.scales.k_scale);
    case KvFormat::nvfp4: {
      const uint8_t byte = page[row * D / 2 + d / 2];
      const uint8_t code = (d % 2 == 0) ? (byte & 15) : (byte >> 4);
      const uint8_t s = page[l.data_section_bytes + row * (D / 16) + d / 16];
      const double g = is_v ? c.scales.v_global_scale : c.scales.k_global_scale;
      return double(codec::e2m1_to_float(code)) * double(codec::e4m3_to_float(s)) * g;
    }
  }
  return kNaN;
}

// The page holding position `pos` of sequence `seq`, or nullptr for an invalid page id.
const uint8_t* page_of(const AttnArgs& a, bool is_v, int32_t seq, int32_t pos) {
  const KvCacheLayout& l = a.cache.layout;
  const int64_t id = a.block_tables[size_t(seq) * a.max_blocks_per_seq + pos / l.block_size];
  if (id < 0 || id >= l.num_blocks) return nullptr;
  return static_cast<const uint8_t*>(is_v ? a.cache.v : a.cache.k) + id * l.page_stride_bytes;
}

// Runs `work(i)` for i in [0, n) on the host's cores, each core taking the
// next i as it finishes one (the items' costs differ by orders of magnitude).
template <class F>
void parallel_for(size_t n, const F& work) {
  const size_t workers = std::max<size_t>(1, std::min<size_t>(n, std::thread::hardware_concurrency()));
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (size_t w = 0; w < workers; ++w)
    pool.emplace_back([&] {
      for (size_t i = next++; i < n; i = next++) work(i);
    });
  for (auto& t : pool) t.join();
}

}  // namespace

KvRows cache_rows(const AttnArgs& a) {
  return [a](int32_t seq, int32_t pos, int32_t kv_head, double* k, double* v) {
    const KvCacheLayout& l = a.cache.layout;
    const int64_t row = int64_t(pos % l.block_size) * l.num_kv_heads + kv_head;
    const uint8_t* kp = page_of(a, false, seq, pos);
    const uint8_t* vp = page_of(a, true, seq, pos);
    for (int32_t d = 0; d < l.head_dim; ++d) {
      k[d] = kp ? page_value(a.cache, kp, false, row, d) : kNaN;
      v[d] = vp ? page_value(a.cache, vp, true, row, d) : kNaN;
    }
  };
}

std::vector<double> reference_attention(const AttnArgs& a) { return attention_f64(a, cache_rows(a)); }

std::vector<double> attention_f64(const AttnArgs& a, const KvRows& rows, std::vector<double>* lse) {
  const int32_t Hq = a.num_q_heads, H = a.cache.layout.num_kv_heads, D = a.cache.layout.head_dim;
  const int32_t group = Hq / H;
  const double ninf = -std::numeric_limits<double>::infinity();
  std::vector<double> out(size_t(a.rows()) * Hq * D, 0.0);
  if (lse) lse->assign(size_t(a.rows()) * Hq, ninf);
  auto run_of = [&](int32_t s) {  // (first row, rows) of sequence s's run
    return std::pair<int32_t, int32_t>{a.q_start ? a.q_start[s] : s, a.q_start ? a.q_start[s + 1] - a.q_start[s] : 1};
  };
  // The work: (sequence, kv head, a block of its run's rows), checked here
  // rather than on the worker threads (a throw there ends the process).
  constexpr int32_t kRowBlock = 16;
  struct Item {
    int32_t s, kvh, j0, j1;
  };
  std::vector<Item> items;
  for (int32_t s = 0; s < a.num_seqs; ++s) {
    const int32_t L = a.seq_lens[s], n = run_of(s).second;
    if (L < 0 || n > std::max(L, 1) || int64_t(L) > int64_t(a.max_blocks_per_seq) * a.cache.layout.block_size)
      throw std::invalid_argument("attention_f64: sequence " + std::to_string(s) + " does not fit its row");
    for (int32_t kvh = 0; kvh < H; ++kvh)
      for (int32_t j0 = 0; j0 < n; j0 += kRowBlock) items.push_back({s, kvh, j0, std::min(n, j0 + kRowBlock)});
  }
  auto first_of = [&](int32_t pos) { return a.sliding_window > 0 ? std::max(0, pos + 1 - a.sliding_window) : 0; };
  parallel_for(items.size(), [&](size_t i) {
    const Item it = items[i];
    const int32_t L = a.seq_lens[it.s];
    const auto [r0, n] = run_of(it.s);
    // The block's rows attend positions base .. its last row's position.
    const int32_t base = first_of(L - n + it.j0), end = L - n + it.j1;
    std::vector<double> k(size_t(std::max(end - base, 0)) * D), v(k.size());
    for (int32_t t = base; t < end; ++t) rows(it.s, t, it.kvh, &k[size_t(t - base) * D], &v[size_t(t - base) * D]);
    std::vector<double> logit;
    for (int32_t j = it.j0; j < it.j1; ++j) {
      const int32_t pos = L - n + j;  // this row's position; it attends [first, pos]
      const int32_t first = first_of(pos);
      for (int32_t h = it.kvh * group; h < (it.kvh + 1) * group; ++h) {
        const bf16* q = a.q + size_t(r0 + j) * a.q_stride + size_t(h) * (a.q_head_stride ? a.q_head_stride : D);
        double* o = out.data() + (size_t(r0 + j) * Hq + h) * D;
        logit.clear();
        bool nan = false;
        double mx = ninf;
        for (int32_t t = first; t <= pos; ++t) {
          double dot = 0.0;
          for (int32_t d = 0; d < D; ++d) dot += double(codec::bf16_to_float(q[d])) * k[size_t(t - base) * D + d];
          double z = dot * double(a.sm_scale);
          if (a.softcap > 0.0f) z = double(a.softcap) * std::tanh(z / double(a.softcap));
          nan |= std::isnan(z);
          mx = std::max(mx, z);
          logit.push_back(z);
        }
        double* row_lse = lse ? &(*lse)[size_t(r0 + j) * Hq + h] : nullptr;
        if (nan) {
          std::fill(o, o + D, kNaN);
          if (row_lse) *row_lse = kNaN;
          continue;
        }
        if (logit.empty()) continue;  // nothing attended: 0, lse -inf
        double sum = 0.0;
        for (double z : logit) sum += std::exp(z - mx);
        if (row_lse) *row_lse = mx + std::log(sum);
        const double sink = a.sinks ? double(a.sinks[h]) : ninf;
        const double M = std::max(mx, sink);
        double denom = (sink == ninf ? 0.0 : std::exp(sink - M));
        for (double z : logit) denom += std::exp(z - M);
        for (size_t e = 0; e < logit.size(); ++e) {
          const double w = std::exp(logit[e] - M) / denom;  // once per position, not per element
          for (int32_t d = 0; d < D; ++d) o[d] += w * v[size_t(first - base + e) * D + d];
        }
      }
    }
  });
  return out;
}

Comparison compare_decode(const bf16* out, const std::vector<double>& ref, int32_t num_seqs, int32_t num_q_heads,
                          int32_t head_dim, double tol) {
  Comparison c;
  if (ref.size() != size_t(num_seqs) * num_q_heads * head_dim) {
    c.ok = false;
    c.report = "compare_decode: reference size does not match the output shape";
    return c;
  }
  std::ostringstream fails;
  int64_t failed_blocks = 0;
  double rel_sum = 0.0;
  int32_t worst_s = -1, worst_h = -1;
  for (int32_t s = 0; s < num_seqs; ++s)
    for (int32_t h = 0; h < num_q_heads; ++h) {
      const size_t base = (size_t(s) * num_q_heads + h) * head_dim;
      double err2 = 0.0, ref2 = 0.0;
      int64_t bad_nonfinite = 0, missing_nan = 0;
      bool ref_zero = true, out_zero = true, ref_nan = false;
      for (int32_t d = 0; d < head_dim; ++d) {
        const double r = ref[base + d];
        const double o = double(codec::bf16_to_float(out[base + d]));
        if (std::isnan(r)) {
          missing_nan += !std::isnan(o);
          ref_zero = false;
          ref_nan = true;
          continue;
        }
        if (!std::isfinite(o)) {
          ++bad_nonfinite;
          continue;
        }
        err2 += (o - r) * (o - r);
        ref2 += r * r;
        ref_zero &= (r == 0.0);
        out_zero &= (o == 0.0);
      }
      c.nonfinite += bad_nonfinite;
      double rel = 0.0;
      bool ok = bad_nonfinite == 0 && missing_nan == 0;
      if (ref_zero) {
        ok &= out_zero;
        rel = out_zero ? 0.0 : std::numeric_limits<double>::infinity();
      } else if (ref2 > 0.0) {
        rel = std::sqrt(err2 / ref2);
        ok &= rel <= tol;
      }
      if (bad_nonfinite) rel = std::numeric_limits<double>::infinity();
      if (!ref_nan && (ref2 > 0.0 || bad_nonfinite)) {
        rel_sum += rel;
        ++c.blocks;
      }
      if (rel > c.worst_rel_l2 || (worst_s < 0 && !ok)) {
        c.worst_rel_l2 = std::max(c.worst_rel_l2, rel);
        worst_s = s;
        worst_h = h;
      }
      if (!ok) {
        if (failed_blocks < 8)
          fails << "  seq " << s << " head " << h << ": rel_l2 = " << rel << ", non-finite = " << bad_nonfinite
                << ", missing NaN = " << missing_nan << (ref_zero ? " (reference is all zero)" : "") << "\n";
        ++failed_blocks;
      }
    }
  c.ok = failed_blocks == 0;
  c.mean_rel_l2 = c.blocks ? rel_sum / double(c.blocks) : 0.0;
  std::ostringstream os;
  os << (c.ok ? "PASS" : "FAIL") << ": " << failed_blocks << " of " << int64_t(num_seqs) * num_q_heads
     << " (seq, head) blocks fail (tol " << tol << "); worst rel_l2 = " << c.worst_rel_l2;
  if (worst_s >= 0) os << " at seq " << worst_s << " head " << worst_h;
  os << "; non-finite outputs = " << c.nonfinite << "\n" << fails.str();
  c.report = os.str();
  return c;
}

}  // namespace metrale::test
