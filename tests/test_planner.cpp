// The planner (plan_attention) and the split rule (split_pages,
// attended_pages): properties every backend relies on.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <tuple>
#include <vector>

#include "testing/forced_plans.hpp"
#include "plan/prefill_staging.hpp"
#include "metrale/error.hpp"
#include "metrale/ops.hpp"
#include "metrale/plan.hpp"
#include "support/problem.hpp"

namespace metrale::test {
namespace {

constexpr int32_t kH200Sms = 132;

AttnProblem problem(int32_t seqs, int32_t kv_heads, int32_t group, int32_t max_len, int32_t window = 0,
                      KvFormat f = KvFormat::bf16, int32_t head_dim = 128, int32_t block_size = 16) {
  AttnProblem p;
  p.num_seqs = seqs;
  p.num_q_heads = kv_heads * group;
  switch (f) {
    case KvFormat::bf16: p.layout = KvCacheLayout::bf16(1000, block_size, kv_heads, head_dim); break;
    case KvFormat::fp8_e4m3: p.layout = KvCacheLayout::fp8(1000, block_size, kv_heads, head_dim); break;
    case KvFormat::nvfp4: p.layout = KvCacheLayout::nvfp4(1000, block_size, kv_heads, head_dim); break;
  }
  p.max_seq_len = max_len;
  p.sliding_window = window;
  return p;
}

// A target of `sms` SMs without TMA or clusters (the split rule alone).
AttnPlan plan_for(const AttnProblem& p, int32_t sms, const test::PlanChoices& o = {}) {
  AttnTarget t;
  t.num_sms = sms;
  return test::plan_with(p, t, o);
}

// An H200-like target: TMA, and `resident` clusters of any size resident at once.
AttnTarget gpu_like(int64_t resident) {
  AttnTarget t;
  t.num_sms = kH200Sms;
  t.tma = true;
  t.l2_bytes = 50 << 20;
  t.resident_clusters = [resident](const detail::KernelId&, int32_t) { return resident; };
  return t;
}

void expect_well_formed(const AttnProblem& p, const AttnPlan& plan) {
  EXPECT_GE(plan.num_splits, 1);
  EXPECT_LE(plan.num_splits, kMaxSplits);
  if (plan.num_splits > 1)
    EXPECT_EQ(plan.workspace_bytes,
              splitk_workspace_bytes(p.num_seqs, p.num_q_heads, p.layout.head_dim, plan.num_splits));
  else
    EXPECT_EQ(plan.workspace_bytes, 0u);
}

TEST(Planner, SinglePassWhenTheBatchFillsTheMachine) {
  for (KvFormat f : {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4})
    for (int32_t len : {100, 4096, 131072}) {
      const AttnProblem p = problem(256, 8, 4, len, 0, f);
      const AttnPlan plan = plan_for(p, kH200Sms);
      EXPECT_EQ(plan.num_splits, 1) << "len " << len;
      expect_well_formed(p, plan);
    }
}

TEST(Planner, SplitsBatchOneLongContexts) {
  for (int32_t len : {8192, 32768, 131072}) {
    const AttnProblem p = problem(1, 8, 4, len);
    const AttnPlan plan = plan_for(p, kH200Sms);
    EXPECT_GT(plan.num_splits, 1) << "len " << len;
    expect_well_formed(p, plan);
  }
  // Longer contexts never get fewer splits.
  int32_t prev = 0;
  for (int32_t len = 512; len <= (1 << 20); len *= 2) {
    const AttnPlan plan = plan_for(problem(1, 2, 8, len), kH200Sms);
    EXPECT_GE(plan.num_splits, prev) << "len " << len;
    prev = plan.num_splits;
  }
  EXPECT_GT(prev, 1);
}

// merge = single_pass with the split count left to the planner is one pass
// for decode and query runs, also where the planner alone would split.
TEST(Planner, SinglePassMergeWithoutASplitCountIsOnePass) {
  test::PlanChoices o;
  o.merge = SplitMerge::single_pass;
  for (int32_t q_len : {1, 8}) {
    AttnProblem p = problem(1, 8, 4, 32768);
    p.max_q_len = q_len;
    ASSERT_GT(plan_for(p, kH200Sms).num_splits, 1) << "q_len " << q_len;
    const AttnPlan plan = test::plan_with(p, gpu_like(1000), o);
    EXPECT_EQ(plan.num_splits, 1) << "q_len " << q_len;
    EXPECT_EQ(plan.merge, SplitMerge::single_pass);
    EXPECT_EQ(plan.workspace_bytes, 0u);
  }
}

// head_dim 64 serves two kv heads per CTA (decode_pairs_kv_heads) where the
// group allows and the batch still fills a third of a wave: half the CTAs
// per split, so twice the splits of head_dim 128, at most 2.
TEST(Planner, HeadDim64CountsPairsOfKvHeads) {
  for (KvFormat f : {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4}) {
    EXPECT_EQ(plan_for(problem(32, 8, 4, 32768, 0, f, 64), kH200Sms).num_splits, 2);
    EXPECT_EQ(plan_for(problem(32, 8, 4, 32768, 0, f, 128), kH200Sms).num_splits, 1);
    // Smaller batches and groups of 8 keep one kv head per CTA.
    for (auto [seqs, group] : std::vector<std::pair<int32_t, int32_t>>{{16, 4}, {1, 4}, {32, 8}})
      EXPECT_EQ(plan_for(problem(seqs, 8, group, 32768, 0, f, 64), kH200Sms).num_splits,
                plan_for(problem(seqs, 8, group, 32768, 0, f, 128), kH200Sms).num_splits)
          << seqs << " seqs, group " << group;
  }
}

TEST(Planner, ShortContextsAreNotCutIntoTinyPieces) {
  for (int32_t len : {0, 1, 16, 100, 255})
    EXPECT_EQ(plan_for(problem(1, 1, 1, len), kH200Sms).num_splits, 1) << "len " << len;
  // A sliding window bounds the attended length whatever the context.
  const AttnPlan windowed = plan_for(problem(1, 8, 4, 1 << 20, 128), kH200Sms);
  EXPECT_EQ(windowed.num_splits, 1);
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 500; ++i) {
    const int32_t len = int32_t(rng() % 200000), window = (rng() % 3 == 0) ? int32_t(rng() % 5000) : 0;
    const AttnProblem p = problem(1 + int32_t(rng() % 64), 1 + int32_t(rng() % 8), 1 << (rng() % 4), len, window);
    const AttnPlan plan = plan_for(p, 1 + int32_t(rng() % 200));
    expect_well_formed(p, plan);
    const int64_t attended = window > 0 ? std::min<int64_t>(len, window + 16) : len;
    if (plan.num_splits > 1) {
      EXPECT_GE(attended / plan.num_splits, 128) << "len " << len << " window " << window;
    }
  }
}

TEST(Planner, NumSplitsWithinBoundsAndDeterministic) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 300; ++i) {
    const AttnProblem p =
        problem(int32_t(rng() % 300), 1 + int32_t(rng() % 16), 1 + int32_t(rng() % 8), int32_t(rng() % (1 << 22)));
    const int32_t sms = 1 + int32_t(rng() % 1000);
    const AttnPlan a = plan_for(p, sms), b = plan_for(p, sms);
    expect_well_formed(p, a);
    EXPECT_EQ(a.num_splits, b.num_splits);
    EXPECT_EQ(a.workspace_bytes, b.workspace_bytes);
  }
  // Even an extreme machine with one huge sequence stays within kMaxSplits.
  EXPECT_LE(plan_for(problem(1, 1, 1, 1 << 30), 100000).num_splits, kMaxSplits);
  // An empty batch is a single pass with no workspace.
  const AttnPlan empty = plan_for(problem(0, 8, 4, 4096), kH200Sms);
  EXPECT_EQ(empty.num_splits, 1);
  EXPECT_EQ(empty.workspace_bytes, 0u);
}

// The plan records each decision the launcher acts on, and the grid it
// counts is the kernel's: (sequence, kv unit, q-head tile) x splits.
TEST(Planner, RecordsLoadPathMergeAndGrid) {
  for (KvFormat f : {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4}) {
    // 1 x 8192, 8 kv heads of 4 q heads: 8 CTAs per split, so splits.
    const AttnProblem p = problem(1, 8, 4, 8192, 0, f);
    const AttnPlan resident = plan_attention(p, gpu_like(1000));
    EXPECT_EQ(resident.launch.load_path, f == KvFormat::nvfp4 ? detail::LoadPath::registers : detail::LoadPath::tma);
    EXPECT_EQ(resident.launch.ctas_per_seq, 8);
    EXPECT_EQ(resident.grid_x(1), 8);
    ASSERT_GT(resident.num_splits, 1);
    if (resident.num_splits <= 8) {
      EXPECT_EQ(resident.merge, SplitMerge::cluster);
      EXPECT_EQ(resident.workspace_bytes, 0u);  // merged in shared memory
    }
    // Not every cluster resident at once: the workspace and the reduce.
    const AttnPlan waves = plan_attention(p, gpu_like(4));
    EXPECT_EQ(waves.merge, SplitMerge::workspace);
    EXPECT_EQ(waves.workspace_bytes, splitk_workspace_bytes(1, 32, 128, waves.num_splits));
    // A target without TMA or clusters.
    const AttnPlan plain = plan_for(p, kH200Sms);
    EXPECT_EQ(plain.launch.load_path, detail::LoadPath::registers);
    EXPECT_EQ(plain.merge, SplitMerge::workspace);
    // Forced options win where they can run.
    test::PlanChoices o;
    o.num_splits = 3;
    o.load_path = detail::LoadPath::registers;
    o.merge = SplitMerge::workspace;
    const AttnPlan forced = test::plan_with(p, gpu_like(1000), o);
    EXPECT_EQ(forced.num_splits, 3);
    EXPECT_EQ(forced.launch.load_path, detail::LoadPath::registers);
    EXPECT_EQ(forced.merge, SplitMerge::workspace);
    o.merge = SplitMerge::cluster;
    EXPECT_EQ(test::plan_with(p, gpu_like(1), o).merge, SplitMerge::cluster);
  }
  // Group of 12: two q-head tiles per kv head; paired heads halve the units.
  EXPECT_EQ(plan_for(problem(1, 2, 12, 100), kH200Sms).launch.ctas_per_seq, 4);
  test::PlanChoices pair;
  pair.pairing = detail::Toggle::on;
  const AttnPlan paired = plan_for(problem(1, 8, 2, 100, 0, KvFormat::fp8_e4m3, 64), kH200Sms, pair);
  EXPECT_TRUE(paired.launch.pair_kv_heads);
  EXPECT_EQ(paired.launch.kv_units, 4);
  EXPECT_EQ(paired.launch.unit_group, 4);
  EXPECT_EQ(paired.kernel_id().head_dim, 128);
}

// Query runs: a CTA's columns are (row, q head) pairs, 8 per n-tile, two
// n-tiles at head_dim <= 128 (geometry::runs_col_tiles), one at 256 and
// for decode, and one where two would leave short splits or, for the TMA
// formats, where the one-tile grid is below half a wave; a forced tiling
// wins where it can run.
TEST(Planner, QueryRunsTileTheirColumns) {
  AttnProblem p = problem(64, 8, 4, 4096);
  p.max_q_len = 4;  // 16 columns per kv head
  const AttnPlan two = plan_attention(p, gpu_like(1000));
  EXPECT_TRUE(two.kernel_id().runs);
  EXPECT_EQ(two.launch.col_tiles, 2);
  EXPECT_EQ(two.kernel_id().col_tiles, 2);
  EXPECT_EQ(two.launch.head_tiles, 1);
  EXPECT_EQ(two.launch.ctas_per_seq, 8);
  // Batch 1: bf16 (TMA) takes one tile, NVFP4 two at 32768 tokens, one at 4096 (short splits).
  for (auto [f, len, tiles] : {std::tuple{KvFormat::bf16, 32768, 1}, std::tuple{KvFormat::fp8_e4m3, 32768, 1},
                               std::tuple{KvFormat::nvfp4, 32768, 2}, std::tuple{KvFormat::nvfp4, 4096, 1}}) {
    AttnProblem one = problem(1, 8, 4, len, 0, f);
    one.max_q_len = 4;
    EXPECT_EQ(test::plan_with(one, gpu_like(1000)).launch.col_tiles, tiles) << to_string(f) << " " << len;
  }
  p.max_q_len = 16;  // 64 columns: 4 tiles of 16 (the planner's choice is the prefill kernel)
  test::PlanChoices runs_only;
  runs_only.prefill = detail::Toggle::off;
  EXPECT_EQ(test::plan_with(p, gpu_like(1000), runs_only).launch.head_tiles, 4);
  p.max_q_len = 2;  // 8 columns: one n-tile does
  EXPECT_EQ(plan_attention(p, gpu_like(1000)).launch.col_tiles, 1);
  AttnProblem wide = problem(4, 8, 4, 4096, 0, KvFormat::fp8_e4m3, 256);
  wide.max_q_len = 4;
  const AttnPlan one = plan_attention(wide, gpu_like(1000));
  EXPECT_EQ(one.launch.col_tiles, 1);
  EXPECT_EQ(one.launch.head_tiles, 2);
  test::PlanChoices o;
  o.col_tiles = 1;
  p.max_q_len = 8;
  const AttnPlan forced = test::plan_with(p, gpu_like(1000), o);
  EXPECT_EQ(forced.launch.col_tiles, 1);
  EXPECT_EQ(forced.launch.head_tiles, 4);
  o.col_tiles = 2;
  EXPECT_THROW(test::plan_with(wide, gpu_like(1000), o), Unsupported);
  EXPECT_THROW(test::plan_with(problem(4, 8, 4, 4096), gpu_like(1000), o), Unsupported);  // decode
  o.col_tiles = 3;
  EXPECT_THROW(test::plan_with(p, gpu_like(1000), o), InvalidArgument);
  EXPECT_EQ(plan_attention(problem(4, 8, 4, 4096), gpu_like(1000)).launch.col_tiles, 1);
}

// NVFP4 runs at head_dim 256 of more than 8 columns per kv head split
// head_dim over teams of two warps with 2 n-tiles (geometry::
// runs_can_split_head_dim); 8 columns or fewer, or one tile (short splits),
// keep whole rows; head_dim 128 and the other formats never split it, and
// forcing it where it cannot run throws.
TEST(Planner, Nvfp4RunsSplitHeadDim256OverTeamsOfTwoWarps) {
  AttnProblem p = problem(16, 8, 4, 8192, 0, KvFormat::nvfp4, 256);
  p.max_q_len = 4;  // 16 columns
  const AttnPlan q4 = plan_attention(p, gpu_like(1000));
  EXPECT_EQ(q4.launch.head_dim_parts, 2);
  EXPECT_EQ(q4.launch.col_tiles, 2);
  EXPECT_EQ(q4.launch.head_tiles, 1);
  EXPECT_EQ(q4.kernel_id().head_dim_parts, 2);
  test::PlanChoices runs_only;
  runs_only.prefill = detail::Toggle::off;
  p.max_q_len = 8;  // 32 columns: two tiles of 16
  const AttnPlan q8 = test::plan_with(p, gpu_like(1000), runs_only);
  EXPECT_EQ(q8.launch.head_dim_parts, 2);
  EXPECT_EQ(q8.launch.head_tiles, 2);
  EXPECT_TRUE(test::is_prefill(plan_attention(p, gpu_like(1000))));  // the planner's: the prefill kernel
  p.max_q_len = 2;  // 8 columns: whole rows
  EXPECT_EQ(plan_attention(p, gpu_like(1000)).launch.head_dim_parts, 1);
  AttnProblem one = problem(1, 8, 4, 4096, 0, KvFormat::nvfp4, 256);
  one.max_q_len = 4;  // short splits: one tile, whole rows
  EXPECT_EQ(plan_attention(one, gpu_like(1000)).launch.col_tiles, 1);
  EXPECT_EQ(plan_attention(one, gpu_like(1000)).launch.head_dim_parts, 1);
  for (auto [f, d] : {std::pair{KvFormat::nvfp4, 128}, std::pair{KvFormat::fp8_e4m3, 256}}) {
    AttnProblem other = problem(16, 8, 4, 8192, 0, f, d);
    other.max_q_len = 4;
    EXPECT_EQ(plan_attention(other, gpu_like(1000)).launch.head_dim_parts, 1) << to_string(f) << " d" << d;
    test::PlanChoices o;
    o.head_dim_parts = 2;
    EXPECT_THROW(test::plan_with(other, gpu_like(1000), o), Unsupported) << to_string(f) << " d" << d;
  }
  test::PlanChoices o;
  o.head_dim_parts = 2;
  EXPECT_THROW(test::plan_with(problem(4, 8, 4, 4096, 0, KvFormat::nvfp4, 256), gpu_like(1000), o), Unsupported);  // decode
  p.max_q_len = 4;
  o.col_tiles = 1;
  EXPECT_THROW(test::plan_with(p, gpu_like(1000), o), Unsupported);
  o.col_tiles = 2;
  EXPECT_EQ(test::plan_with(p, gpu_like(1000), o).launch.head_dim_parts, 2);
  o.head_dim_parts = 1;
  EXPECT_THROW(test::plan_with(p, gpu_like(1000), o), Unsupported);  // two tiles of whole rows at 256
  o.head_dim_parts = 3;
  EXPECT_THROW(test::plan_with(p, gpu_like(1000), o), InvalidArgument);
  test::PlanChoices whole;
  whole.head_dim_parts = 1;
  const AttnPlan w = test::plan_with(p, gpu_like(1000), whole);
  EXPECT_EQ(w.launch.head_dim_parts, 1);
  EXPECT_EQ(w.launch.col_tiles, 1);
  EXPECT_EQ(w.launch.head_tiles, 2);
  whole.prefill = detail::Toggle::on;
  EXPECT_THROW(test::plan_with(p, gpu_like(1000), whole), Unsupported);
}

// FP8 / NVFP4 prefill plans stage their pages as bf16 in the workspace
// (plan/prefill_staging.hpp) for runs of kPrefillStageMinRun rows, on a
// target with TMA, within half the workspace bound; the plan then names the
// bf16 kernel, and its workspace holds the records and the pages.
TEST(Planner, LongDequantisedRunsStageTheirPagesAsBf16) {
  for (const KvFormat f : {KvFormat::fp8_e4m3, KvFormat::nvfp4}) {
    AttnProblem p = problem(2, 8, 4, 4096, 0, f);
    p.max_q_len = 4096;  // 128 row tiles
    const AttnPlan plan = plan_attention(p, gpu_like(1000));
    ASSERT_TRUE(test::is_prefill(plan));
    EXPECT_TRUE(plan.launch.stage_kv);
    EXPECT_EQ(plan.kernel_id().format, KvFormat::bf16);
    EXPECT_EQ(plan.launch.load_path, detail::LoadPath::tma);
    const geometry::PrefillStaging s = geometry::prefill_staging(p);
    EXPECT_EQ(s.table_stride, 4096 / 16);
    EXPECT_EQ(s.slots, 4096 / 16);  // no window: the whole sequence
    EXPECT_EQ(s.page_bytes, 16 * 8 * 128 * 2);
    EXPECT_GE(s.bytes, size_t(2) * 2 * 256 * s.page_bytes + 2 * 256 * 4);
    EXPECT_EQ(plan.workspace_bytes, s.bytes);  // single pass: the pages only
    // A window bounds the slots by its span: run - 1 + window positions.
    AttnProblem w = p;
    w.sliding_window = 1000;
    EXPECT_EQ(geometry::prefill_staging(w).slots, 256);  // at most the table's 256 pages
    w.max_q_len = 64;
    EXPECT_EQ(geometry::prefill_staging(w).slots, 68);  // 1063 positions: 67 pages, and one for their alignment
    // Split-K plans keep their records first.
    AttnProblem chunk = problem(1, 1, 1, 32768, 0, f);
    chunk.max_q_len = 2048;  // 16 tiles: 16 CTAs per split
    const AttnPlan cp = plan_attention(chunk, gpu_like(1000));
    ASSERT_TRUE(cp.launch.stage_kv);
    ASSERT_GT(cp.num_splits, 1);
    EXPECT_EQ(cp.workspace_bytes, splitk_workspace_bytes(chunk.rows(), chunk.num_q_heads, 128, cp.num_splits) +
                                      geometry::prefill_staging(chunk).bytes);
    // Shorter runs: dequantised in the kernel's producer.
    p.max_q_len = geometry::kPrefillStageMinRun - 1;
    EXPECT_FALSE(plan_attention(p, gpu_like(1000)).launch.stage_kv);
    p.max_q_len = 4096;
    // No TMA: never (the bf16 kernel's loads); nothing to stage: never.
    AttnTarget no_tma = gpu_like(1000);
    no_tma.tma = false;
    EXPECT_FALSE(plan_attention(p, no_tma).launch.stage_kv);
    AttnProblem empty = p;
    empty.max_seq_len = 0;
    EXPECT_FALSE(plan_attention(empty, gpu_like(1000)).launch.stage_kv);
    // A workspace bound under twice the pages: not staged; forced past the bound: refused.
    AttnPlanOptions small;
    small.max_workspace_bytes = s.bytes * 2 - 1;
    EXPECT_FALSE(plan_attention(p, gpu_like(1000), small).launch.stage_kv);
    test::PlanChoices forced;
    forced.prefill = detail::Toggle::on;
    forced.stage_kv = detail::Toggle::on;
    forced.max_workspace_bytes = s.bytes * 2 - 1;
    EXPECT_TRUE(test::plan_with(p, gpu_like(1000), forced).launch.stage_kv);
    forced.max_workspace_bytes = s.bytes - 1;
    EXPECT_THROW(test::plan_with(p, gpu_like(1000), forced), InvalidArgument);
    forced.max_workspace_bytes = 0;
    forced.stage_kv = detail::Toggle::off;
    const AttnPlan fused = test::plan_with(p, gpu_like(1000), forced);
    EXPECT_FALSE(fused.launch.stage_kv);
    EXPECT_EQ(fused.kernel_id().format, f);
    EXPECT_EQ(fused.workspace_bytes, 0u);
  }
  // bf16 has nothing to stage; the toggle needs the prefill kernel on.
  AttnProblem b = problem(1, 8, 4, 4096);
  b.max_q_len = 4096;
  EXPECT_FALSE(plan_attention(b, gpu_like(1000)).launch.stage_kv);
  test::PlanChoices on;
  on.prefill = detail::Toggle::on;
  on.stage_kv = detail::Toggle::on;
  EXPECT_THROW(test::plan_with(b, gpu_like(1000), on), Unsupported);
  on.prefill = detail::Toggle::automatic;
  b.layout = problem(1, 8, 4, 4096, 0, KvFormat::fp8_e4m3).layout;
  EXPECT_THROW(test::plan_with(b, gpu_like(1000), on), Unsupported);
}

// Long runs take the prefill kernel where its grid (a CTA per 128 packed rows
// of a kv head and split) fills half the SMs: long prompts in one pass, short
// chunks over a long context with splits of >= kPrefillMinTokensPerSplit
// positions merged through the workspace; short runs, and few CTAs over a
// short context, the runs kernel.
TEST(Planner, LongRunsTakeThePrefillKernel) {
  AttnProblem p = problem(1, 8, 4, 8192);
  p.max_q_len = 8192;  // a prompt: 256 tiles of 128 rows per kv head
  const AttnPlan pre = plan_attention(p, gpu_like(1000));
  EXPECT_TRUE(test::is_prefill(pre));
  EXPECT_TRUE(pre.kernel_id().prefill);
  EXPECT_EQ(pre.launch.head_tiles, 256);
  EXPECT_TRUE(pre.launch.tile_pairs);  // CTA pairs wherever a run has two row tiles
  EXPECT_EQ(pre.launch.tile_band, 0);  // 8 kv heads' K and V over 8192 positions: 32 MiB, within L2
  EXPECT_EQ(pre.num_splits, 1);
  EXPECT_EQ(pre.merge, SplitMerge::single_pass);
  EXPECT_EQ(pre.workspace_bytes, 0u);
  p.max_q_len = 16;  // verification over 8192: 8 CTAs x 8 splits fill less than half the SMs
  EXPECT_FALSE(test::is_prefill(plan_attention(p, gpu_like(1000))));
  // The launch order's bands, where the K and V exceed L2: a wave per unit
  // (132 CTAs over the sequences), but at least 4 bands, and at least a tile.
  AttnProblem longer = problem(1, 8, 4, 16384);  // 64 MiB
  longer.max_q_len = 16384;                          // 512 tiles: a quarter, 128
  EXPECT_EQ(plan_attention(longer, gpu_like(1000)).launch.tile_band, 128);
  longer.max_q_len = 1024;
  EXPECT_EQ(plan_attention(longer, gpu_like(1000)).launch.tile_band, 8);
  AttnTarget no_l2 = gpu_like(1000);
  no_l2.l2_bytes = 0;  // unknown: tile major
  EXPECT_EQ(plan_attention(longer, no_l2).launch.tile_band, 0);
  AttnProblem ragged = problem(8, 8, 4, 4096);  // at most 128 MiB
  ragged.max_q_len = 4096;
  ragged.num_q_rows = 8 * 2048;
  EXPECT_EQ(plan_attention(ragged, gpu_like(1000)).launch.tile_band, (kH200Sms + 7) / 8 + 1);  // 17, whole pairs: 18
  ragged.max_q_len = 64;  // 2 tiles: bands of one, of a pair with pairs
  EXPECT_EQ(plan_attention(ragged, gpu_like(1000)).launch.tile_band, 2);
  test::PlanChoices alone;
  alone.prefill = detail::Toggle::on;
  alone.tile_pairs = 0;
  EXPECT_EQ(test::plan_with(ragged, gpu_like(1000), alone).launch.tile_band, 1);
  EXPECT_FALSE(test::plan_with(ragged, gpu_like(1000), alone).launch.tile_pairs);
  ragged.max_q_len = 32;  // a tile per run: no CTAs share pages, the 3-D grid
  ragged.num_q_rows = 8 * 32;
  test::PlanChoices on;
  on.prefill = detail::Toggle::on;
  EXPECT_EQ(test::plan_with(ragged, gpu_like(1000), on).launch.tile_band, 0);
  on.tile_band = 3;  // forced: at most the plan's tiles (one here)
  EXPECT_EQ(test::plan_with(ragged, gpu_like(1000), on).launch.tile_band, 1);
  on.tile_band = 0;
  EXPECT_EQ(test::plan_with(longer, gpu_like(1000), on).launch.tile_band, 0);
  on.tile_band = -2;
  EXPECT_THROW(test::plan_with(longer, gpu_like(1000), on), InvalidArgument);
  on = {};
  on.tile_band = 2;  // only for the prefill kernel
  EXPECT_THROW(test::plan_with(longer, gpu_like(1000), on), Unsupported);
  on = {};
  on.tile_pairs = 1;  // likewise
  EXPECT_THROW(test::plan_with(longer, gpu_like(1000), on), Unsupported);
  on.prefill = detail::Toggle::on;
  on.tile_pairs = 2;
  EXPECT_THROW(test::plan_with(longer, gpu_like(1000), on), InvalidArgument);
  // CTA pairs: an odd tile count gets an empty last tile; one tile has no
  // pair; the dequantising formats at head_dim 256 run alone.
  on.tile_pairs = 1;
  AttnProblem three = problem(4, 8, 4, 4096);
  three.max_q_len = 96;  // 384 rows: 3 tiles
  const AttnPlan paired = test::plan_with(three, gpu_like(1000), on);
  EXPECT_TRUE(paired.launch.tile_pairs);
  EXPECT_EQ(paired.launch.head_tiles, 4);
  EXPECT_EQ(paired.launch.ctas_per_seq, 8 * 4);
  three.max_q_len = 32;
  EXPECT_FALSE(test::plan_with(three, gpu_like(1000), on).launch.tile_pairs);
  for (const KvFormat f : {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4})
    for (const int32_t d : {64, 128, 256}) {
      AttnProblem q = problem(4, 8, 4, 4096, 0, f, d);
      q.max_q_len = 96;
      EXPECT_EQ(test::plan_with(q, gpu_like(1000), on).launch.tile_pairs, f == KvFormat::bf16 || d < 256) << int(f) << " d" << d;
      // The planner's: head_dim 128 and 256 (where they can), from 2048
      // attended positions.
      EXPECT_EQ(plan_attention(q, gpu_like(1000)).launch.tile_pairs, d >= 128 && (f == KvFormat::bf16 || d < 256))
          << int(f) << " d" << d;
      q.max_seq_len = q.max_q_len = 2048;  // 64 row tiles: FP8 / NVFP4 staged as bf16, paired as bf16
      const AttnPlan staged = plan_attention(q, gpu_like(1000));
      EXPECT_EQ(staged.launch.stage_kv, f != KvFormat::bf16) << int(f) << " d" << d;
      EXPECT_EQ(staged.launch.tile_pairs, d >= 128) << int(f) << " d" << d;
      q.max_seq_len = q.max_q_len = 1024;
      EXPECT_FALSE(plan_attention(q, gpu_like(1000)).launch.tile_pairs) << int(f) << " d" << d;
    }
  p.max_q_len = 8192;
  // Verification over a long context: every format from 8 tokens at GQA 4
  // (32 rows), 8 CTAs split 16 ways.
  for (const KvFormat f : {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4}) {
    AttnProblem verify = problem(1, 8, 4, 32768, 0, f);
    for (const int32_t q : {2, 4, 8, 16}) {
      verify.max_q_len = q;
      verify.num_q_rows = q;
      const AttnPlan vp = plan_attention(verify, gpu_like(1000));
      EXPECT_EQ(test::is_prefill(vp), q >= 8) << to_string(f) << " q_len " << q;
      if (test::is_prefill(vp)) EXPECT_EQ(vp.num_splits, 16);
    }
  }
  // Over fewer than kPrefillShortRunsMinAttended positions (not measured),
  // short runs keep the runs kernel; a tile of 128 rows takes the prefill kernel.
  AttnProblem short_verify = problem(64, 8, 4, 2048);
  short_verify.max_q_len = 16;
  short_verify.num_q_rows = 64 * 16;
  EXPECT_FALSE(test::is_prefill(plan_attention(short_verify, gpu_like(1000))));
  short_verify.max_seq_len = 4096;
  EXPECT_TRUE(test::is_prefill(plan_attention(short_verify, gpu_like(1000))));
  short_verify.max_seq_len = 2048;
  short_verify.max_q_len = 32;
  short_verify.num_q_rows = 64 * 32;
  EXPECT_TRUE(test::is_prefill(plan_attention(short_verify, gpu_like(1000))));
  AttnProblem chunk = problem(1, 8, 4, 32768);
  chunk.max_q_len = 64;  // 2 tiles x 8 kv heads: 16 CTAs over 32768 positions, split 8 ways
  chunk.num_q_rows = 64;
  const AttnPlan split = plan_attention(chunk, gpu_like(1000));
  EXPECT_TRUE(test::is_prefill(split));
  EXPECT_EQ(split.num_splits, kH200Sms / 16);
  EXPECT_EQ(split.merge, SplitMerge::workspace);
  EXPECT_EQ(split.workspace_bytes, splitk_workspace_bytes(64, 32, 128, split.num_splits));
  AttnProblem short_ctx = chunk;
  short_ctx.max_seq_len = 1536;  // one split of >= 1024 positions: 16 CTAs, the runs kernel
  EXPECT_FALSE(test::is_prefill(plan_attention(short_ctx, gpu_like(1000))));
  chunk.max_q_len = 2048;
  EXPECT_EQ(plan_attention(chunk, gpu_like(1000)).num_splits, 1);
  EXPECT_TRUE(test::is_prefill(plan_attention(chunk, gpu_like(1000))));
  // Forced: on needs query runs; it takes forced split counts (through the
  // workspace), not the cluster merge; off keeps the runs kernel.
  test::PlanChoices o;
  o.prefill = detail::Toggle::on;
  chunk.max_q_len = 64;
  EXPECT_TRUE(test::is_prefill(test::plan_with(chunk, gpu_like(1000), o)));
  EXPECT_THROW(test::plan_with(problem(4, 8, 4, 4096), gpu_like(1000), o), Unsupported);  // decode
  o.num_splits = 4;
  const AttnPlan forced = test::plan_with(chunk, gpu_like(1000), o);
  EXPECT_TRUE(test::is_prefill(forced));
  EXPECT_EQ(forced.num_splits, 4);
  EXPECT_EQ(forced.merge, SplitMerge::workspace);
  o.merge = SplitMerge::single_pass;
  EXPECT_THROW(test::plan_with(chunk, gpu_like(1000), o), InvalidArgument);
  o.merge = SplitMerge::cluster;
  EXPECT_THROW(test::plan_with(chunk, gpu_like(1000), o), Unsupported);
  o = {};
  o.prefill = detail::Toggle::on;
  o.merge = SplitMerge::workspace;  // one split's records and the reduce
  EXPECT_EQ(test::plan_with(short_ctx, gpu_like(1000), o).merge, SplitMerge::workspace);
  o = {};
  o.num_splits = 1;  // no splits: the runs kernel's single pass
  o.merge = SplitMerge::single_pass;
  EXPECT_FALSE(test::is_prefill(test::plan_with(chunk, gpu_like(1000), o)));
  chunk.max_q_len = 2048;  // but a grid that fills the GPU takes the prefill kernel in one pass
  EXPECT_TRUE(test::is_prefill(test::plan_with(chunk, gpu_like(1000), o)));
  chunk.max_q_len = 64;
  o = {};
  o.prefill = detail::Toggle::off;
  p.max_q_len = 8192;
  EXPECT_FALSE(test::is_prefill(test::plan_with(p, gpu_like(1000), o)));
  o = {};
  o.num_splits = 3;  // a forced split count (but 1) keeps the runs kernel
  EXPECT_FALSE(test::is_prefill(test::plan_with(p, gpu_like(1000), o)));
  // Beyond the grid's y (sequences): the runs kernel, or Unsupported when forced.
  AttnProblem many = problem(70000, 8, 4, 4096);
  many.max_q_len = 512;
  EXPECT_FALSE(test::is_prefill(plan_attention(many, gpu_like(1000))));
  o = {};
  o.prefill = detail::Toggle::on;
  EXPECT_THROW(test::plan_with(many, gpu_like(1000), o), Unsupported);
  EXPECT_EQ(detail::toggle_from_string("on", "prefill"), detail::Toggle::on);
  EXPECT_THROW(detail::toggle_from_string("yes", "prefill"), InvalidArgument);
}

TEST(Planner, ForcedSplitsPastTheWorkspaceBoundAreRefusedNamingTheBytes) {
  // 130 sequences of up to 4,000 rows at 32 q heads, 64 forced splits: 277 GB.
  AttnProblem p = problem(130, 8, 4, 4000);
  p.max_q_len = 4000;
  p.query_runs = true;
  test::PlanChoices o;
  o.num_splits = 64;
  for (const AttnTarget& t : {gpu_like(1000), AttnTarget{kH200Sms, false, 0, {}}}) {
    try {
      test::plan_with(p, t, o);
      FAIL() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("num_splits"), std::string::npos) << what;
      EXPECT_NE(what.find(std::to_string(splitk_workspace_bytes(p.rows(), 32, 128, 64))), std::string::npos) << what;
      EXPECT_NE(what.find("max_workspace_bytes"), std::string::npos) << what;
    }
  }
  // A bound of the caller's: forced splits inside it run; the planner's own
  // choice shrinks to fit (a single pass at the least), never past it.
  o.max_workspace_bytes = splitk_workspace_bytes(p.rows(), 32, 128, 64);
  EXPECT_EQ(test::plan_with(p, gpu_like(1000), o).num_splits, 64);
  for (size_t bound : {size_t(1) << 20, size_t(3) * splitk_workspace_bytes(p.rows(), 32, 128, 1), size_t(0)}) {
    test::PlanChoices own;
    own.max_workspace_bytes = bound;
    own.prefill = detail::Toggle::off;  // the runs kernel splits long contexts
    const AttnPlan plan = test::plan_with(p, AttnTarget{kH200Sms, false, 0, {}}, own);
    EXPECT_LE(plan.workspace_bytes, bound ? bound : kDefaultMaxWorkspaceBytes) << bound;
    EXPECT_EQ(plan.workspace_bytes, plan.merge == SplitMerge::single_pass
                                        ? 0
                                        : splitk_workspace_bytes(p.rows(), 32, 128, plan.num_splits));
  }
  // states_only plans are sized like forced ones: refused past the bound.
  test::PlanChoices states;
  states.merge = SplitMerge::states_only;
  states.num_splits = 2;
  states.max_workspace_bytes = 1 << 20;
  EXPECT_THROW(test::plan_with(p, gpu_like(1000), states), InvalidArgument);
}

// Every plan the planner makes on a GPU-like target names a kernel the CUDA
// backend ships (detail::cuda_kernel_instantiated asks the backend's own
// dispatch, no GPU needed): random problems of every format, head_dim,
// grouping, length, window, run length and option, with the public options
// and the tuning knobs forced at random (a refused forced choice is skipped:
// the planner's refusal is its answer).
TEST(Planner, EveryPlanNamesAShippedKernel) {
  std::mt19937_64 rng(std::random_device{}());
  auto pick = [&](std::initializer_list<int64_t> v) { return *(v.begin() + int64_t(rng() % v.size())); };
  auto maybe = [&](int64_t dflt, std::initializer_list<int64_t> v) { return rng() % 3 ? dflt : pick(v); };
  int plans = 0, kernels[3] = {};
  for (int i = 0; i < 20000; ++i) {
    const KvFormat f = KvFormat(pick({0, 1, 2}));
    const int32_t kv_heads = int32_t(pick({1, 2, 3, 4, 8, 16}));
    AttnProblem p = problem(int32_t(pick({0, 1, 2, 4, 16, 64, 256, 1000})), kv_heads, int32_t(pick({1, 2, 4, 5, 8, 16})),
                            int32_t(pick({0, 1, 100, 2048, 8192, 32768, 131072})),
                            int32_t(maybe(0, {1, 64, 500, 4096})), f, int32_t(pick({64, 128, 256})),
                            int32_t(pick({16, 32, 64, 128})));
    p.max_q_len = int32_t(maybe(1, {2, 3, 8, 16, 128, 2048, 16384}));
    p.attn_options = rng() % 4 == 0;
    p.query_runs = rng() % 3 == 0;
    AttnTarget t = gpu_like(int64_t(pick({0, 4, 64, 100000})));
    t.tma = rng() % 4 != 0;
    test::PlanChoices c;
    c.num_splits = int32_t(maybe(0, {1, 2, 3, 8, 33, 256}));
    c.merge = SplitMerge(maybe(0, {1, 2, 3, 4}));
    c.pairing = detail::Toggle(maybe(0, {1, 2}));
    c.load_path = detail::LoadPath(maybe(0, {1, 2}));
    c.col_tiles = int32_t(maybe(0, {1, 2}));
    c.head_dim_parts = int32_t(maybe(0, {1, 2}));
    c.prefill = detail::Toggle(maybe(0, {1, 2}));
    const bool prefill_on = c.prefill == detail::Toggle::on;
    c.tile_band = int32_t(prefill_on ? maybe(-1, {0, 1, 3}) : -1);
    c.tile_pairs = int32_t(prefill_on ? maybe(-1, {0, 1}) : -1);
    c.stage_kv = prefill_on ? detail::Toggle(maybe(0, {1, 2})) : detail::Toggle::automatic;
    AttnPlan plan;
    try {
      plan = test::plan_with(p, t, c);
    } catch (const Unsupported&) {
      continue;
    } catch (const InvalidArgument&) {  // a forced split count past the workspace bound
      continue;
    }
    ++plans;
    ++kernels[int(plan.kernel)];
    const detail::KernelId id = plan.kernel_id();
    ASSERT_TRUE(detail::cuda_kernel_instantiated(id))
        << "format " << int(id.format) << " head_dim " << id.head_dim << " load path " << int(id.load_path)
        << " paired " << id.pair_kv_heads << " runs " << id.runs << " col_tiles " << id.col_tiles << " parts "
        << id.head_dim_parts << " prefill " << id.prefill << " tile_pairs " << id.tile_pairs << " (case " << i << ")";
  }
  EXPECT_GT(plans, 5000);
  for (int k : kernels) EXPECT_GT(k, 100);  // decode, runs and prefill plans all drawn
  // The check can say no: instantiations the dispatch does not ship.
  detail::KernelId runs_d256_two_tiles{KvFormat::bf16, 256, detail::LoadPath::registers, false, true, 2, 1};
  EXPECT_FALSE(detail::cuda_kernel_instantiated(runs_d256_two_tiles));
  detail::KernelId nvfp4_tma{KvFormat::nvfp4, 128, detail::LoadPath::tma};
  EXPECT_FALSE(detail::cuda_kernel_instantiated(nvfp4_tma));
  detail::KernelId nvfp4_pairs_d256{KvFormat::nvfp4, 256, detail::LoadPath::registers};
  nvfp4_pairs_d256.runs = nvfp4_pairs_d256.prefill = nvfp4_pairs_d256.tile_pairs = true;
  EXPECT_FALSE(detail::cuda_kernel_instantiated(nvfp4_pairs_d256));
}

TEST(Planner, QueryRowsDefaultToTheCapacityOfTheRuns) {
  // num_q_rows 0: num_seqs * max_q_len, so every batch of runs that fits the
  // problem fits the plan and its workspace.
  AttnProblem p = problem(2, 8, 4, 4096);
  p.max_q_len = 8;
  EXPECT_EQ(p.rows(), 16);
  test::PlanChoices o;
  o.num_splits = 4;
  o.merge = SplitMerge::workspace;
  EXPECT_EQ(plan_for(p, kH200Sms, o).workspace_bytes, splitk_workspace_bytes(16, 32, 128, 4));
  p.num_q_rows = 5;
  EXPECT_EQ(plan_for(p, kH200Sms, o).workspace_bytes, splitk_workspace_bytes(5, 32, 128, 4));
  p.max_q_len = 1;
  p.num_q_rows = 0;
  EXPECT_EQ(p.rows(), 2);  // decode: a row per sequence
}

TEST(Planner, MoreSmsNeverMeanFewerSplits) {
  const AttnProblem p = problem(2, 4, 8, 65536);
  int32_t prev = 1;
  for (int32_t sms = 1; sms <= 512; sms *= 2) {
    const int32_t n = plan_for(p, sms).num_splits;
    EXPECT_GE(n, prev) << sms << " SMs";
    prev = n;
  }
}

TEST(Planner, SplitPagesCoverTheAttendedRangeExactly) {
  for (int32_t first : {0, 3})
    for (int32_t n = 0; n <= 40; ++n) {
      const PageRange r{first, first + n};
      for (int32_t ns = 1; ns <= n + 3; ++ns) {
        int32_t next = r.first, nonempty = 0;
        for (int32_t s = 0; s < ns; ++s) {
          const PageRange sp = split_pages(r, s, ns);
          ASSERT_LE(sp.first, sp.end) << "n " << n << " splits " << ns << " split " << s;
          if (sp.first == sp.end) continue;  // empty splits only after the covered part
          ASSERT_EQ(sp.first, next) << "n " << n << " splits " << ns << " split " << s;
          next = sp.end;
          ++nonempty;
        }
        ASSERT_EQ(next, r.end) << "n " << n << " splits " << ns;
        ASSERT_LE(nonempty, ns);
        if (ns <= n) {
          ASSERT_GE(nonempty, 1);
        }
        // Every non-empty split but the last has the same length ceil(n / ns).
        for (int32_t s = 0; s + 1 < ns; ++s) {
          const PageRange a = split_pages(r, s, ns), b = split_pages(r, s + 1, ns);
          if (b.first < b.end) {
            ASSERT_EQ(a.end - a.first, (n + ns - 1) / ns);
          }
        }
      }
    }
}

TEST(Planner, AttendedPagesAndWindowStart) {
  EXPECT_EQ(window_start(100, 0), 0);
  EXPECT_EQ(window_start(100, 30), 70);
  EXPECT_EQ(window_start(100, 100), 0);
  EXPECT_EQ(window_start(100, 1000), 0);
  for (int32_t B : {16, 32, 64, 128})
    for (int32_t L = 0; L <= 5 * B; ++L)
      for (int32_t W : {0, 1, B - 1, B, B + 1, 3 * B}) {
        const PageRange r = attended_pages(L, W, B);
        const int32_t ws = window_start(L, W);
        ASSERT_EQ(r.end, (L + B - 1) / B);
        ASSERT_EQ(r.first, ws / B);
        ASSERT_LE(r.first, r.end);
        if (L > 0) {
          ASSERT_LE(r.first * B, ws);  // the first attended position lies in the first page
        }
        ASSERT_EQ(L - ws, W > 0 ? std::min(L, W) : L);  // attended positions
      }
}

}  // namespace
}  // namespace metrale::test
