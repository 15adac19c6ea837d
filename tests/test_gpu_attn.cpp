// Query runs on the GPU (docs/spec.md 8): the runs kernel (columns = (query
// row, q head) pairs of a kv head's group) against the float64 reference,
// over formats x head dims x GQA x run lengths x ragged batches x windows x
// splits x sinks x soft-cap x strided q, with poisoned outputs and guards;
// decode with sinks / soft-cap / lse through the same kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>
#include <vector>

#include "testing/forced_plans.hpp"
#include "metrale/cuda.hpp"
#include "metrale/error.hpp"
#include "support/device_problem.hpp"
#include "support/runs_problem.hpp"
#include "testing/device_buffer.hpp"

namespace metrale::test {
namespace {

constexpr KvFormat kFormats[] = {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4};

// rp's inputs on the device, and a run of one plan (or forced split count)
// into poisoned outputs; returns out (and lse).
struct DeviceRuns {
  explicit DeviceRuns(const RunsProblem& rp)
      : rp(rp), k(rp.p.k_cache), v(rp.p.v_cache), q(rp.q), q_start(rp.q_start), tables(rp.p.block_tables),
        lens(rp.p.seq_lens), sinks(rp.sinks.empty() ? std::vector<float>{0.0f} : rp.sinks),
        out(std::max<size_t>(rp.out_elems(), 1)),
        lse(std::max<size_t>(size_t(rp.rows()) * rp.p.num_q_heads(), 1)) {}

  AttnArgs args(bool with_lse) {
    AttnArgs a = rp.args(out.get(), with_lse ? lse.get() : nullptr);
    a.q = q.get();
    a.q_start = q_start.get();
    a.cache.k = k.get();
    a.cache.v = v.get();
    a.block_tables = tables.get();
    a.seq_lens = lens.get();
    a.sinks = rp.sinks.empty() ? nullptr : sinks.get();
    return a;
  }
  // options.num_splits 0: the planner's. Returns whether every guard held.
  bool run(const test::PlanChoices& options, bool with_lse) {
    out.fill_bytes(0xFF);
    lse.fill_bytes(0xFF);
    const AttnArgs a = args(with_lse);
    int32_t max_run = 1;
    for (size_t s = 0; s + 1 < rp.q_start.size(); ++s) max_run = std::max(max_run, rp.q_start[s + 1] - rp.q_start[s]);
    plan = test::plan_with(attention_problem(a, -1, max_run), cuda::attention_target(), options);
    DeviceBuffer<float> ws(std::max<size_t>(plan.workspace_bytes / 4, 1));
    cuda::run_attention(plan, a, SplitKWorkspace{ws.get(), plan.workspace_bytes, plan.num_splits});
    METRALE_CUDA_OK(cudaDeviceSynchronize());
    return ws.guards_intact() && out.guards_intact() && lse.guards_intact() && k.guards_intact() &&
           q.guards_intact() && k.download() == rp.p.k_cache && v.download() == rp.p.v_cache;
  }
  std::vector<bf16> out_host() const {
    std::vector<bf16> o = out.download();
    o.resize(rp.out_elems());
    return o;
  }
  std::vector<float> lse_host() const {
    std::vector<float> l = lse.download();
    l.resize(size_t(rp.rows()) * rp.p.num_q_heads());
    return l;
  }

  const RunsProblem& rp;
  DeviceBuffer<uint8_t> k, v;
  DeviceBuffer<bf16> q;
  DeviceBuffer<int32_t> q_start, tables, lens;
  DeviceBuffer<float> sinks;
  DeviceBuffer<bf16> out;
  DeviceBuffer<float> lse;
  AttnPlan plan;
};

TEST(GpuAttn, RaggedRunsMatchTheFloat64Reference) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const char* iters_env = std::getenv("METRALE_GPU_TEST_ITERS");
  const int iters = iters_env ? std::atoi(iters_env) : 40;
  for (int iter = 0; iter < iters; ++iter) {
    DecodeCase c;
    c.format = kFormats[iter % 3];
    c.head_dim = int32_t(pick(rng, 64, 128, 256));
    c.num_kv_heads = int32_t(pick(rng, 1, 2, 4));
    c.group = int32_t(pick(rng, 1, 2, 4, 7, 8, 16));
    if (c.group > 8) c.num_kv_heads = 1;  // the float64 reference's time
    c.block_size = int32_t(pick(rng, 16, 32, 64));
    c.sliding_window = int32_t(pick(rng, 0, 0, 9, 100));
    c.q_stride_pad = 8 * int64_t(rng() % 2);
    c.q_head_major = rng() % 3 == 0;  // q as transformers hands it at batch 1
    const int32_t max_run = int32_t(pick(rng, 1, 2, 4, 8, 16, 16, 70));
    c.seq_lens = {int32_t(1 + rng() % 300), int32_t(rng() % 3), int32_t(16 + rng() % 2000), 1, int32_t(rng() % 40)};
    RunsProblem rp(c, random_runs(c.seq_lens, max_run, rng), rng());
    if (rng() % 2) rp.sinks = random_sinks(c.num_q_heads(), rng);
    rp.softcap = float(pick(rng, 0, 0, 5, 30));
    SCOPED_TRACE(c.describe() + " rows " + std::to_string(rp.rows()) + " softcap " + std::to_string(rp.softcap) +
                 (rp.sinks.empty() ? "" : " sinks"));
    DeviceRuns dr(rp);
    const RunsReference ref = runs_reference(rp);  // rp is final: one reference for every kernel below
    for (int32_t ns : {0, 1, 3, int32_t(2 + rng() % 7), int32_t(9 + rng() % 30)}) {
      for (SplitMerge merge : {SplitMerge::automatic, SplitMerge::workspace}) {
        test::PlanChoices o;
        o.num_splits = ns;
        if (ns > 1 || ns == 0) o.merge = merge;
        if (ns == 1 && merge == SplitMerge::workspace) continue;
        const bool with_lse = rng() % 2;
        const bool intact = dr.run(o, with_lse);
        const std::string what = "splits " + std::to_string(dr.plan.num_splits) + " merge " + to_string(dr.plan.merge) +
                                 " load " + to_string(dr.plan.launch.load_path);
        EXPECT_TRUE(intact) << what << ": a guard or an input was overwritten";
        const std::vector<float> lse = dr.lse_host();
        expect_runs_match(rp, ref, dr.out_host(), what, with_lse ? &lse : nullptr);
        if (c.format != KvFormat::nvfp4 && ns == 3) {
          o.load_path = detail::LoadPath::registers;
          EXPECT_TRUE(dr.run(o, false));
          expect_runs_match(rp, ref, dr.out_host(), what + " registers");
          o.load_path = detail::LoadPath::automatic;
        }
        // The prefill kernel (tensor-core tiles of 128 packed rows) on the
        // same runs, with the same split count (0: the planner's; more splits
        // than a CTA has tiles leave empty records).
        if (merge == SplitMerge::automatic) {
          test::PlanChoices po;
          po.prefill = detail::Toggle::on;
          po.num_splits = ns;
          EXPECT_TRUE(dr.run(po, with_lse));
          const std::vector<float> lse_p = dr.lse_host();
          expect_runs_match(rp, ref, dr.out_host(), "prefill kernel, splits " + std::to_string(dr.plan.num_splits),
                            with_lse ? &lse_p : nullptr);
        }
        // The other column tiling where the planner took two n-tiles per CTA.
        if (ns == 3 && dr.plan.launch.col_tiles == 2) {
          o.col_tiles = 1;
          EXPECT_TRUE(dr.run(o, with_lse));
          const std::vector<float> lse1 = dr.lse_host();
          expect_runs_match(rp, ref, dr.out_host(), what + " one column tile", with_lse ? &lse1 : nullptr);
        }
        // NVFP4 at head_dim 256: head_dim split over teams of two warps
        // (two n-tiles) and whole rows (one), whatever the planner took.
        if ((ns == 1 || ns == 3) && c.format == KvFormat::nvfp4 && c.head_dim == 256) {
          for (int32_t parts : {1, 2}) {
            test::PlanChoices h = o;
            h.head_dim_parts = parts;
            h.col_tiles = parts;
            EXPECT_TRUE(dr.run(h, with_lse));
            const std::vector<float> lse_h = dr.lse_host();
            expect_runs_match(rp, ref, dr.out_host(), what + " head_dim parts " + std::to_string(parts),
                              with_lse ? &lse_h : nullptr);
          }
        }
      }
    }
    if (HasFailure()) break;
  }
}

// A corrupt page id makes its whole run NaN and a NaN in K reaches exactly
// the rows that attend it (later rows of the run: causal), with one and two
// column tiles, single pass, workspace and cluster split-K; the other runs
// are unaffected.
TEST(GpuAttn, CorruptPagesAndNanKeysStayWithTheRowsThatReadThem) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (KvFormat f : kFormats) {
    for (int32_t D : {64, 128, 256}) {
      DecodeCase c;
      c.format = f;
      c.head_dim = D;
      c.num_kv_heads = 2;
      c.group = int32_t(pick(rng, 2, 4, 8));
      c.block_size = 16;
      c.seq_lens = {int32_t(200 + rng() % 300), int32_t(100 + rng() % 600), int32_t(50 + rng() % 100)};
      RunsProblem rp(c, {int32_t(1 + rng() % 16), 12, int32_t(1 + rng() % 16)}, rng());
      // Sequence 0: its first page is corrupt (every row attends it: its run
      // is NaN by both the float64 reference's rule and the kernels' rule,
      // which makes the whole run NaN wherever a row attends a bad page).
      // Sequence 1: K of kv head 1 at its next-to-last position is NaN
      // (element d), seen by its last two rows.
      const int32_t L1 = rp.p.seq_lens[1];
      rp.p.block_tables[0] = int32_t(rp.p.layout.num_blocks) + 3;
      poison_cache(rp.p, 'k', 1, L1 - 2, 1, int32_t(rng() % D));
      SCOPED_TRACE(c.describe());
      DeviceRuns dr(rp);
      const RunsReference ref = runs_reference(rp);  // rp is final: one reference for every kernel below
      for (int32_t ns : {1, 3, 12}) {
        // Column tiles: the planner's, one, and for NVFP4 at 256 the teams
        // that split head_dim (two n-tiles).
        for (auto [tiles, parts] : {std::pair{0, 0}, std::pair{1, 1}, std::pair{2, 2}}) {
          if (parts == 2 && (f != KvFormat::nvfp4 || D != 256)) continue;
          if (tiles == 1 && D > 128 && f != KvFormat::nvfp4) continue;  // the planner's: one column tile
          test::PlanChoices o;
          o.num_splits = ns;
          o.col_tiles = tiles;
          o.head_dim_parts = parts;
          EXPECT_TRUE(dr.run(o, true));
          const std::vector<float> lse = dr.lse_host();
          const std::vector<bf16> out = dr.out_host();
          const std::string what = "splits " + std::to_string(ns) + " merge " + to_string(dr.plan.merge) +
                                   " col_tiles " + std::to_string(dr.plan.launch.col_tiles) + " head_dim parts " +
                                   std::to_string(dr.plan.launch.head_dim_parts);
          expect_runs_match(rp, ref, out, what, &lse);
          // The reference's NaN rows are the rule; check the rule itself once.
          const int32_t H = c.num_q_heads(), row1 = rp.q_start[1];
          EXPECT_TRUE(std::isnan(codec::bf16_to_float(out[size_t(rp.q_start[0]) * H * D]))) << what;
          EXPECT_TRUE(std::isnan(codec::bf16_to_float(out[(size_t(row1 + 11) * H + c.group) * D]))) << what;
          EXPECT_FALSE(std::isnan(codec::bf16_to_float(out[(size_t(row1 + 9) * H + c.group) * D]))) << what;
          EXPECT_FALSE(std::isnan(codec::bf16_to_float(out[(size_t(row1 + 11) * H + 0) * D]))) << what;
        }
      }
      for (int32_t ns : {1, 3, 12}) {
        test::PlanChoices o;
        o.prefill = detail::Toggle::on;
        o.num_splits = ns;
        EXPECT_TRUE(dr.run(o, true));
        const std::vector<float> lse = dr.lse_host();
        const std::vector<bf16> out = dr.out_host();
        const std::string what = "prefill kernel, splits " + std::to_string(ns);
        expect_runs_match(rp, ref, out, what, &lse);
        const int32_t H = c.num_q_heads(), row1 = rp.q_start[1];
        EXPECT_TRUE(std::isnan(codec::bf16_to_float(out[size_t(rp.q_start[0]) * H * D]))) << what;
        EXPECT_TRUE(std::isnan(codec::bf16_to_float(out[(size_t(row1 + 11) * H + c.group) * D]))) << what;
        EXPECT_FALSE(std::isnan(codec::bf16_to_float(out[(size_t(row1 + 9) * H + c.group) * D]))) << what;
        EXPECT_FALSE(std::isnan(codec::bf16_to_float(out[(size_t(row1 + 11) * H + 0) * D]))) << what;
      }
      EXPECT_TRUE(dr.k.guards_intact() && dr.out.guards_intact());
      if (HasFailure()) return;
    }
  }
}

// Long query runs (prompts, chunks over a cached prefix, ragged batches with
// runs of one row among them) through the prefill kernel, forced and as the
// planner picks it, over formats x head dims x GQA x pages x windows x
// sinks x soft-cap, against the float64 reference.
TEST(GpuAttn, PrefillKernelMatchesTheFloat64Reference) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const char* iters_env = std::getenv("METRALE_GPU_TEST_ITERS");
  const int iters = iters_env ? std::max(3, std::atoi(iters_env) / 2) : 18;
  for (int iter = 0; iter < iters; ++iter) {
    DecodeCase c;
    c.format = kFormats[iter % 3];
    c.head_dim = int32_t(pick(rng, 64, 128, 256));
    c.num_kv_heads = int32_t(pick(rng, 1, 2));
    c.group = int32_t(pick(rng, 1, 3, 4, 7, 8, 16));
    if (c.group > 8) c.num_kv_heads = 1;  // the float64 reference's time
    c.block_size = int32_t(pick(rng, 16, 32, 64, 128));
    c.sliding_window = int32_t(pick(rng, 0, 0, 0, 77, 600));
    c.q_head_major = rng() % 3 == 0;
    // Prompts (run = length), chunks over prefixes, a one-row run, an empty one.
    const int32_t n0 = int32_t(17 + rng() % 700), n1 = int32_t(17 + rng() % 400), p1 = int32_t(rng() % 1800);
    const int32_t n2 = int32_t(100 + rng() % 300);
    c.seq_lens = {n0, n1 + p1, int32_t(1 + rng() % 900), n2, int32_t(rng() % 50)};
    const std::vector<int32_t> runs = {n0, n1, 1, n2 - int32_t(rng() % 3) * 37, 0};
    RunsProblem rp(c, runs, rng());
    if (rng() % 2) rp.sinks = random_sinks(c.num_q_heads(), rng);
    rp.softcap = float(pick(rng, 0, 0, 7, 30));
    SCOPED_TRACE(c.describe() + " rows " + std::to_string(rp.rows()) + " softcap " + std::to_string(rp.softcap) +
                 (rp.sinks.empty() ? "" : " sinks"));
    DeviceRuns dr(rp);
    const RunsReference ref = runs_reference(rp);  // rp is final: one reference for every kernel below
    for (int32_t variant = 0; variant < 3; ++variant) {
      test::PlanChoices o;  // forced single pass, forced splits, the planner's choice
      o.prefill = variant < 2 ? detail::Toggle::on : detail::Toggle::automatic;
      if (variant == 1) o.num_splits = int32_t(2 + rng() % 11);
      // The launch orders: the planner's, the 3-D grid, bands of 1-4 tiles.
      if (variant < 2) o.tile_band = int32_t(pick(rng, -1, 0, 1, 2, 4));
      // CTA pairs: the planner's, off, on.
      if (variant < 2) o.tile_pairs = int32_t(pick(rng, -1, 0, 1));
      // FP8 / NVFP4 pages: the planner's, dequantised in the producer, staged as bf16.
      if (variant < 2 && c.format != KvFormat::bf16)
        o.stage_kv = static_cast<detail::Toggle>(pick(rng, int(detail::Toggle::automatic), int(detail::Toggle::off),
                                                      int(detail::Toggle::on)));
      const bool with_lse = rng() % 2;
      EXPECT_TRUE(dr.run(o, with_lse)) << "a guard or an input was overwritten";
      const std::vector<float> lse = dr.lse_host();
      expect_runs_match(rp, ref, dr.out_host(),
                        std::string(test::is_prefill(dr.plan) ? "prefill kernel" : "runs kernel") + ", splits " +
                            std::to_string(dr.plan.num_splits) + ", tile band " + std::to_string(dr.plan.launch.tile_band) +
                            (dr.plan.launch.tile_pairs ? ", pairs" : "") + (dr.plan.launch.stage_kv ? ", staged" : ""),
                        with_lse ? &lse : nullptr);
    }
    if (HasFailure()) break;
  }
}

// Long runs through the prefill kernel: a prompt of 1024-8192 tokens and a
// chunk of 512-2048 over a cached prefix of up to 30720, every format and
// head dim, windows, sinks, soft-cap; sampled rows against the float64
// reference (each row as the decode of its prefix; the whole reference of
// such runs is too slow), every row against the runs kernel.
TEST(GpuAttn, PrefillLongRunsMatchTheirPrefixes) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 3; ++iter) {
    DecodeCase c;
    c.format = kFormats[iter % 3];
    c.head_dim = int32_t(pick(rng, 64, 128, 256));
    c.num_kv_heads = int32_t(pick(rng, 1, 2));
    c.group = int32_t(pick(rng, 1, 4, 7));
    c.block_size = int32_t(pick(rng, 16, 64));
    c.sliding_window = int32_t(pick(rng, 0, 0, 4096));
    c.q_head_major = rng() % 2 == 0;
    const int32_t n0 = int32_t(1024 + rng() % 7169), n1 = int32_t(512 + rng() % 1537), p1 = int32_t(rng() % 30721);
    c.seq_lens = {n0, n1 + p1};
    RunsProblem rp(c, {n0, n1}, rng());
    if (rng() % 2) rp.sinks = random_sinks(c.num_q_heads(), rng);
    rp.softcap = float(pick(rng, 0, 0, 30));
    SCOPED_TRACE(c.describe() + " runs " + std::to_string(n0) + ", " + std::to_string(n1) + " over " +
                 std::to_string(p1) + " softcap " + std::to_string(rp.softcap) + (rp.sinks.empty() ? "" : " sinks"));
    DeviceRuns dr(rp);
    test::PlanChoices o;
    o.prefill = detail::Toggle::on;
    const int32_t pairs = int32_t(pick(rng, -1, 0, 1));
    o.tile_pairs = pairs;
    const bool with_lse = rng() % 2;
    EXPECT_TRUE(dr.run(o, with_lse)) << "a guard or an input was overwritten";
    ASSERT_TRUE(test::is_prefill(dr.plan));
    const bool staged = dr.plan.launch.stage_kv;
    const std::vector<bf16> out = dr.out_host();
    const std::vector<float> lse = dr.lse_host();
    std::vector<int32_t> sample;
    for (size_t s = 0; s + 1 < rp.q_start.size(); ++s) {
      const int32_t r0 = rp.q_start[s], n = rp.q_start[s + 1] - r0;
      sample.push_back(r0);
      sample.push_back(r0 + n - 1);
      for (int k = 0; k < 6; ++k) sample.push_back(r0 + int32_t(rng() % uint64_t(n)));
    }
    expect_rows_match(rp, sample, out, staged ? "prefill kernel, staged" : "prefill kernel", with_lse ? &lse : nullptr);
    o.prefill = detail::Toggle::off;
    o.tile_pairs = -1;  // the prefill kernel's only
    EXPECT_TRUE(dr.run(o, false)) << "a guard or an input was overwritten";
    const std::vector<bf16> other = dr.out_host();
    std::vector<double> ref(other.size());
    for (size_t i = 0; i < other.size(); ++i) ref[i] = codec::bf16_to_float(other[i]);
    const Comparison cmp = compare_decode(out.data(), ref, rp.rows(), c.num_q_heads(), c.head_dim, 2e-2);
    EXPECT_TRUE(cmp.ok) << "prefill kernel against the runs kernel: " << cmp.report;
    // Split-K through the workspace, every row against the single pass, in
    // bands of tiles (the order above L2) or the 3-D grid.
    o.prefill = detail::Toggle::on;
    o.num_splits = int32_t(2 + rng() % 15);
    o.tile_band = int32_t(pick(rng, 0, 1, 3, 8, 64));
    o.tile_pairs = pairs == 0 ? 1 : 0;  // pairs off where the single pass had them (the planner's: on)
    // FP8 / NVFP4: the other way to their pages (the planner's, staged, was the single pass's).
    if (c.format != KvFormat::bf16) o.stage_kv = staged ? detail::Toggle::off : detail::Toggle::on;
    EXPECT_TRUE(dr.run(o, false)) << "a guard or an input was overwritten";
    const std::vector<bf16> split = dr.out_host();
    const Comparison cmp_split = compare_decode(split.data(), ref, rp.rows(), c.num_q_heads(), c.head_dim, 2e-2);
    EXPECT_TRUE(cmp_split.ok) << "prefill kernel, " << o.num_splits << " splits, tile band " << dr.plan.launch.tile_band
                              << (dr.plan.launch.tile_pairs ? ", pairs" : "")
                              << (dr.plan.launch.stage_kv ? ", staged" : "")
                              << ", against the runs kernel: " << cmp_split.report;
    if (HasFailure()) break;
  }
}

// Decode with sinks, soft-cap and lse runs the runs kernel (q_start null).
TEST(GpuAttn, DecodeWithSinksSoftCapAndLse) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (KvFormat f : kFormats) {
    DecodeCase c;
    c.format = f;
    c.seq_lens = {0, 1, 500, 3000};
    RunsProblem rp(c, {1, 1, 1, 1}, rng());
    for (int32_t h = 0; h < c.num_q_heads(); ++h) rp.sinks.push_back(float(h) - 3.0f);
    rp.softcap = 20.0f;
    DeviceRuns dr(rp);
    const RunsReference ref = runs_reference(rp);  // rp is final: one reference for every kernel below
    for (int32_t ns : {1, 4, 20}) {
      test::PlanChoices o;
      o.num_splits = ns;
      AttnArgs a = dr.args(true);
      a.q_start = nullptr;  // one row per sequence: decode
      dr.out.fill_bytes(0xFF);
      const AttnPlan plan = test::plan_with(attention_problem(a), cuda::attention_target(), o);
      DeviceBuffer<float> ws(std::max<size_t>(plan.workspace_bytes / 4, 1));
      cuda::run_attention(plan, a, SplitKWorkspace{ws.get(), plan.workspace_bytes, plan.num_splits});
      METRALE_CUDA_OK(cudaDeviceSynchronize());
      const std::vector<float> lse = dr.lse_host();
      expect_runs_match(rp, ref, dr.out_host(), std::string(to_string(f)) + " decode splits " + std::to_string(ns),
                        &lse);
    }
  }
}

TEST(GpuAttn, ForcedSplitsOnPrefillSizedRunsAreRefusedBeforeAnyAllocation) {
  METRALE_SKIP_WITHOUT_GPU();
  // 130 sequences of up to 4,000 rows, 64 forced splits: a workspace of
  // 277 GB, refused by the plan (nothing is allocated or launched).
  AttnProblem p;
  p.num_seqs = 130;
  p.num_q_heads = 32;
  p.layout = KvCacheLayout::bf16(40000, 16, 8, 128);
  p.max_seq_len = 4000;
  p.max_q_len = 4000;
  p.query_runs = true;
  test::PlanChoices o;
  o.num_splits = 64;
  EXPECT_THROW(test::plan_with(p, cuda::attention_target(), o), InvalidArgument);
  const AttnPlan own = plan_attention(p, cuda::attention_target());
  EXPECT_LE(own.workspace_bytes, kDefaultMaxWorkspaceBytes);
}

}  // namespace
}  // namespace metrale::test
