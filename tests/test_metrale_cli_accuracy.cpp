// `metrale accuracy` (apps/metrale/accuracy.hpp) on a small batch on the CPU
// backend: every output finite, and the error ordered as the formats' bits
// are (bf16 < fp8 < nvfp4); a per-tensor second scale g does not hurt NVFP4
// on average; NVFP4's adaptive group scales cut the K, V and output errors of
// max6 at the same bytes. Also the model-like data keeps its promised structure.
#include <gtest/gtest.h>

#if __has_include("accuracy.hpp")  // apps/ is built (METRALE_BUILD_APPS)
#include <cmath>

#include "accuracy.hpp"
#include "backend.hpp"
#include "metrale/cpu.hpp"
#include "metrale/cuda.hpp"
#include "realistic_kv.hpp"

namespace {

using namespace metrale;
using namespace metrale::cli;

TEST(MetraleCliAccuracy, ErrorsAreFiniteAndOrderedByFormat) {
  AccuracyOptions o;
  o.seqs = 3;
  o.max_len = 300;
  const AccuracyReport r = run_accuracy(o, *make_cpu_backend());
  ASSERT_EQ(r.rows.size(), 10u);
  for (const AccuracyRow& row : r.rows) {
    SCOPED_TRACE(std::string(to_string(row.format)) + " " + row.calibration);
    EXPECT_EQ(row.error.nonfinite, 0);
    EXPECT_GT(row.error.blocks, 0);
    EXPECT_TRUE(std::isfinite(row.error.worst_rel_l2));
  }
  const AccuracyRow &bf16 = r.rows[0], &fp8 = r.rows[1], &nvfp4_g1 = r.rows[3], &nvfp4_g = r.rows[4];
  EXPECT_LT(bf16.error.worst_rel_l2, 1e-2);  // output rounding only
  EXPECT_LT(bf16.error.mean_rel_l2, fp8.error.mean_rel_l2);
  EXPECT_LT(fp8.error.mean_rel_l2, nvfp4_g.error.mean_rel_l2);
  EXPECT_LT(nvfp4_g.error.mean_rel_l2, 1.1 * nvfp4_g1.error.mean_rel_l2);
  EXPECT_EQ(nvfp4_g1.scales.k_global_scale, 1.0f);
  EXPECT_FLOAT_EQ(nvfp4_g.scales.k_global_scale, r.k_absmax / (448.0f * 6.0f));
  EXPECT_FLOAT_EQ(fp8.scales.k_scale, r.k_absmax / 448.0f);
  // Rows 3-5 max6, 6-8 adaptive under the same calibrations (g = 1, same
  // batch, separate batch), 9 adaptive with g = absmax / 1792.
  for (int i = 3; i < 6; ++i) {
    const AccuracyRow &m = r.rows[size_t(i)], &a = r.rows[size_t(i + 3)];
    SCOPED_TRACE(m.calibration);
    EXPECT_EQ(m.nvfp4_scales, Nvfp4ScaleRule::max6);
    EXPECT_EQ(a.nvfp4_scales, Nvfp4ScaleRule::adaptive);
    EXPECT_EQ(a.calibration, m.calibration);
    EXPECT_EQ(a.scales.k_global_scale, m.scales.k_global_scale);  // one calibration for both rules
    EXPECT_EQ(a.kv_bytes_per_token, m.kv_bytes_per_token);
    EXPECT_LT(a.k_rel_rms, m.k_rel_rms);
    EXPECT_LT(a.v_rel_rms, 0.95 * m.v_rel_rms);
    EXPECT_LT(a.error.mean_rel_l2, m.error.mean_rel_l2);
    EXPECT_GT(m.k_rel_rms, fp8.k_rel_rms);
  }
  EXPECT_FLOAT_EQ(r.rows[9].scales.k_global_scale, r.calib_k_absmax / 1792.0f);
  EXPECT_GT(fp8.k_rel_rms, 0.0);
  EXPECT_EQ(bf16.k_rel_rms, 0.0);
}

// The GPU must give the same table up to rounding (same codes and scales,
// outputs within the library's 1e-2 of each other).
TEST(MetraleCliAccuracy, GpuGivesTheCpuNumbersUpToRounding) {
  if (!cuda::available()) GTEST_SKIP() << "no sm_90 GPU";
  AccuracyOptions o;
  o.seqs = 3;
  o.max_len = 300;
  const AccuracyReport cpu_rep = run_accuracy(o, *make_cpu_backend());
  const AccuracyReport gpu_rep = run_accuracy(o, *make_cuda_backend());
  ASSERT_EQ(cpu_rep.rows.size(), gpu_rep.rows.size());
  for (size_t i = 0; i < cpu_rep.rows.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(gpu_rep.rows[i].error.nonfinite, 0);
    EXPECT_NEAR(gpu_rep.rows[i].error.mean_rel_l2, cpu_rep.rows[i].error.mean_rel_l2, 5e-3);
    EXPECT_NEAR(gpu_rep.rows[i].error.worst_rel_l2, cpu_rep.rows[i].error.worst_rel_l2, 1e-2);
  }
}

TEST(MetraleCliAccuracy, RealisticKeysHaveOutliersAndDependOnlyOnSeeds) {
  LayerShape shape;
  HostBatch a = make_batch(shape, 2, 64, 5), b = make_batch(shape, 2, 64, 5);
  RealisticKv model;
  fill_realistic(a, model, 9);
  fill_realistic(b, model, 9);
  ASSERT_EQ(a.key.size(), b.key.size());
  for (size_t i = 0; i < a.key.size(); ++i) ASSERT_EQ(a.key[i].bits, b.key[i].bits) << i;
  // K's absmax is far above its typical magnitude (outlier channels); V's is not.
  float k_max = 0.0f, v_max = 0.0f;
  double k_sq = 0.0;
  cpu::bf16_absmax(a.key.data(), a.num_tokens(), a.kv_row(), a.kv_row(), &k_max);
  cpu::bf16_absmax(a.value.data(), a.num_tokens(), a.kv_row(), a.kv_row(), &v_max);
  for (const bf16 x : a.key) k_sq += double(codec::bf16_to_float(x)) * codec::bf16_to_float(x);
  const double k_rms = std::sqrt(k_sq / double(a.key.size()));
  EXPECT_GT(k_max, 8.0 * k_rms);
  EXPECT_GT(v_max, 0.0f);
}

}  // namespace

#else
TEST(MetraleCliAccuracy, NeedsTheApps) { GTEST_SKIP() << "apps/ not built (METRALE_BUILD_APPS=OFF)"; }
#endif
