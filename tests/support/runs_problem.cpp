// See runs_problem.hpp.
#include "support/runs_problem.hpp"

#include <algorithm>

namespace metrale::test {
namespace {

// lse within 1e-3 relative, -inf / NaN exactly where the reference has them.
void expect_lse_match(const std::vector<double>& ref, const std::vector<float>& got, const std::string& what) {
  for (size_t i = 0; i < ref.size(); ++i) {
    const double r = ref[i], g = got[i];
    if (std::isnan(r)) {
      ASSERT_TRUE(std::isnan(g)) << what << " lse " << i;
    } else if (std::isinf(r)) {
      ASSERT_EQ(g, float(r)) << what << " lse " << i;
    } else {
      ASSERT_NEAR(g, r, 1e-3 * std::max(1.0, std::abs(r))) << what << " lse " << i;
    }
  }
}

}  // namespace

RunsReference runs_reference(const RunsProblem& rp) {
  RunsReference ref;
  const AttnArgs a = rp.args(nullptr);
  ref.out = attention_f64(a, cache_rows(a), &ref.lse);
  return ref;
}

void expect_runs_match(const RunsProblem& rp, const RunsReference& ref, const std::vector<bf16>& out,
                       const std::string& what, const std::vector<float>* lse) {
  const Comparison cmp = compare_decode(out.data(), ref.out, rp.rows(), rp.p.num_q_heads(), rp.p.layout.head_dim);
  EXPECT_TRUE(cmp.ok) << what << ": " << cmp.report;
  if (lse) expect_lse_match(ref.lse, *lse, what);
}

void expect_runs_match(const RunsProblem& rp, const std::vector<bf16>& out, const std::string& what,
                       const std::vector<float>* lse) {
  expect_runs_match(rp, runs_reference(rp), out, what, lse);
}

void expect_rows_match(const RunsProblem& rp, const std::vector<int32_t>& rows, const std::vector<bf16>& out,
                       const std::string& what, const std::vector<float>* lse) {
  const int32_t Hq = rp.p.num_q_heads(), D = rp.p.layout.head_dim, m = int32_t(rows.size());
  const int32_t mb = rp.p.max_blocks_per_seq;
  std::vector<bf16> q(size_t(m) * Hq * D), got(size_t(m) * Hq * D);  // q: the sampled rows, packed
  std::vector<int32_t> q_start(size_t(m) + 1, 0), lens(size_t(m), 0), tables(size_t(m) * mb, 0);
  std::vector<float> got_lse(size_t(m) * Hq);
  for (int32_t i = 0; i < m; ++i) {
    const int32_t r = rows[size_t(i)];
    const auto it = std::upper_bound(rp.q_start.begin(), rp.q_start.end(), r);
    ASSERT_TRUE(r >= 0 && it != rp.q_start.begin() && it != rp.q_start.end()) << what << ": row " << r;
    const int32_t s = int32_t(it - rp.q_start.begin()) - 1;
    const int32_t j = r - rp.q_start[size_t(s)], n = rp.q_start[size_t(s) + 1] - rp.q_start[size_t(s)];
    lens[size_t(i)] = rp.p.seq_lens[size_t(s)] - n + j + 1;
    q_start[size_t(i) + 1] = i + 1;
    for (int32_t h = 0; h < Hq; ++h)
      std::copy_n(rp.q.begin() + ptrdiff_t(r * rp.q_stride + h * rp.q_head_stride), D,
                  q.begin() + ptrdiff_t(i * Hq + h) * D);
    std::copy_n(rp.p.block_tables.begin() + ptrdiff_t(s) * mb, mb, tables.begin() + ptrdiff_t(i) * mb);
    std::copy_n(out.begin() + ptrdiff_t(r) * Hq * D, size_t(Hq) * D, got.begin() + ptrdiff_t(i) * Hq * D);
    if (lse) std::copy_n(lse->begin() + ptrdiff_t(r) * Hq, Hq, got_lse.begin() + ptrdiff_t(i) * Hq);
  }
  AttnArgs a = rp.args(nullptr);
  a.q = q.data();
  a.q_stride = int64_t(Hq) * D;
  a.q_head_stride = D;
  a.q_start = q_start.data();
  a.num_seqs = m;
  a.num_q_rows = m;
  a.block_tables = tables.data();
  a.seq_lens = lens.data();
  std::vector<double> ref_lse;
  const std::vector<double> ref = attention_f64(a, cache_rows(a), &ref_lse);
  const Comparison cmp = compare_decode(got.data(), ref, m, Hq, D);
  EXPECT_TRUE(cmp.ok) << what << " (" << m << " sampled rows): " << cmp.report;
  if (lse) expect_lse_match(ref_lse, got_lse, what + " (sampled rows)");
}

}  // namespace metrale::test
