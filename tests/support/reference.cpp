// The float64 decode reference and the comparison (see reference.hpp).
#include "support/reference.hpp"

#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace metrale::test {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace

double cache_value(const HostProblem& p, char which, int32_t seq, int32_t pos, int32_t h, int32_t d) {
  const KvCacheLayout& l = p.layout;
  const int32_t B = l.block_size, H = l.num_kv_heads, D = l.head_dim;
  const int64_t block = p.block_tables[size_t(seq) * p.max_blocks_per_seq + pos / B];
  const int64_t t = pos % B;
  const uint8_t* page = (which == 'k' ? p.k_cache.data() : p.v_cache.data()) + block * l.page_stride_bytes;
  const int64_t row = t * H + h;
  switch (l.format) {
    case KvFormat::bf16: {
      const uint8_t* e = page + (row * D + d) * 2;
      const bf16 v{uint16_t(e[0] | (e[1] << 8))};
      return double(codec::bf16_to_float(v));
    }
    case KvFormat::fp8_e4m3: {
      const double scale = which == 'k' ? p.scales.k_scale : p.scales.v_scale;
      return double(codec::e4m3_to_float(page[row * D + d])) * scale;
    }
    case KvFormat::nvfp4: {
      const uint8_t byte = page[row * D / 2 + d / 2];
      const uint8_t code = (d % 2 == 0) ? (byte & 15) : (byte >> 4);
      const uint8_t s = page[l.data_section_bytes + row * (D / 16) + d / 16];
      const double g = which == 'k' ? p.scales.k_global_scale : p.scales.v_global_scale;
      return double(codec::e2m1_to_float(code)) * double(codec::e4m3_to_float(s)) * g;
    }
  }
  return kNaN;
}

std::vector<double> reference_decode(const HostProblem& p) {
  const int32_t S = p.num_seqs(), Hq = p.num_q_heads(), H = p.layout.num_kv_heads, D = p.layout.head_dim;
  const int32_t B = p.layout.block_size, group = Hq / H, W = p.c.sliding_window;
  std::vector<double> out(size_t(S) * Hq * D, 0.0);
  for (int32_t s = 0; s < S; ++s) {
    const int32_t L = p.seq_lens[s];
    if (L < 0 || int64_t(L) > int64_t(p.max_blocks_per_seq) * B)
      throw std::invalid_argument("reference_decode: seq_lens[" + std::to_string(s) + "] does not fit its row");
    const int32_t first = (W > 0 && L > W) ? L - W : 0;
    if (L == 0) continue;
    bool bad_page = false;
    for (int32_t pos = first; pos < L; ++pos) {
      const int32_t id = p.block_tables[size_t(s) * p.max_blocks_per_seq + pos / B];
      bad_page |= (id < 0 || id >= p.layout.num_blocks);
    }
    if (bad_page) {
      for (size_t i = 0; i < size_t(Hq) * D; ++i) out[size_t(s) * Hq * D + i] = kNaN;
      continue;
    }
    for (int32_t h = 0; h < Hq; ++h) {
      const int32_t kvh = h / group;
      const bf16* q = p.q.data() + size_t(s) * p.q_stride + size_t(h) * D;
      std::vector<double> logits;
      bool nan = false;
      double mx = -std::numeric_limits<double>::infinity();
      for (int32_t pos = first; pos < L; ++pos) {
        double dot = 0.0;
        for (int32_t d = 0; d < D; ++d) dot += double(codec::bf16_to_float(q[d])) * cache_value(p, 'k', s, pos, kvh, d);
        const double z = dot * double(p.sm_scale);
        nan |= std::isnan(z);
        if (z > mx) mx = z;
        logits.push_back(z);
      }
      double* o = out.data() + (size_t(s) * Hq + h) * D;
      if (nan) {
        for (int32_t d = 0; d < D; ++d) o[d] = kNaN;
        continue;
      }
      double denom = 0.0;
      for (double& z : logits) denom += (z = std::exp(z - mx));
      for (int32_t pos = first; pos < L; ++pos) {
        const double w = logits[size_t(pos - first)] / denom;
        for (int32_t d = 0; d < D; ++d) o[d] += w * cache_value(p, 'v', s, pos, kvh, d);
      }
    }
  }
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
  int32_t worst_s = -1, worst_h = -1;
  for (int32_t s = 0; s < num_seqs; ++s)
    for (int32_t h = 0; h < num_q_heads; ++h) {
      const size_t base = (size_t(s) * num_q_heads + h) * head_dim;
      double err2 = 0.0, ref2 = 0.0;
      int64_t bad_nonfinite = 0, missing_nan = 0;
      bool ref_zero = true, out_zero = true;
      for (int32_t d = 0; d < head_dim; ++d) {
        const double r = ref[base + d];
        const double o = double(codec::bf16_to_float(out[base + d]));
        if (std::isnan(r)) {
          missing_nan += !std::isnan(o);
          ref_zero = false;
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
  std::ostringstream os;
  os << (c.ok ? "PASS" : "FAIL") << ": " << failed_blocks << " of " << int64_t(num_seqs) * num_q_heads
     << " (seq, head) blocks fail (tol " << tol << "); worst rel_l2 = " << c.worst_rel_l2;
  if (worst_s >= 0) os << " at seq " << worst_s << " head " << worst_h;
  os << "; non-finite outputs = " << c.nonfinite << "\n" << fails.str();
  c.report = os.str();
  return c;
}

}  // namespace metrale::test
