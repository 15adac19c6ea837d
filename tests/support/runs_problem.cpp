// See runs_problem.hpp.
#include "support/runs_problem.hpp"

namespace metrale::test {

void expect_runs_match(const RunsProblem& rp, const std::vector<bf16>& out, const std::string& what,
                       const std::vector<float>* lse) {
  std::vector<double> ref_lse;
  const PagedAttnArgs a = rp.args(nullptr);
  const std::vector<double> ref = attention_runs_f64(a, cache_rows(a), &ref_lse);
  const Comparison cmp = compare_decode(out.data(), ref, rp.rows(), rp.p.num_q_heads(), rp.p.layout.head_dim);
  EXPECT_TRUE(cmp.ok) << what << ": " << cmp.report;
  if (lse)
    for (size_t i = 0; i < ref_lse.size(); ++i) {
      const double r = ref_lse[i], g = (*lse)[i];
      if (std::isnan(r)) {
        ASSERT_TRUE(std::isnan(g)) << what << " lse " << i;
      } else if (std::isinf(r)) {
        ASSERT_EQ(g, float(r)) << what << " lse " << i;
      } else {
        ASSERT_NEAR(g, r, 1e-3 * std::max(1.0, std::abs(r))) << what << " lse " << i;
      }
    }
}

}  // namespace metrale::test
