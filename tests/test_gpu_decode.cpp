// GPU decode (single pass, split-K + reduce, planner) against the float64
// reference over a randomized shape matrix. Skipped without an sm_90 GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "testing/forced_plans.hpp"
#include "metrale/cuda.hpp"
#include "metrale/error.hpp"
#include "support/device_problem.hpp"
#include "testing/reference.hpp"

namespace metrale::test {
namespace {

struct RunResult {
  std::vector<bf16> out;
  bool guards_ok;
};

// Runs the decode on the device with `num_splits` (0 = single pass) and
// returns the output; workspace and output live inside guard regions.
// `planned`: through run_attention with a plan of num_splits (2..8 splits merge
// inside a cluster of the split CTAs where the grid's clusters are resident),
// else the split pass and the reduce as separate calls. `load`: a forced
// load path (plans for every case, the workspace merge where not planned).
RunResult run_gpu(const HostProblem& hp, DeviceProblem& dp, int32_t num_splits, bool planned = false,
                  detail::LoadPath load = detail::LoadPath::automatic) {
  dp.poison_out();
  AttnArgs args = dp.args();
  const int32_t ns = std::max(num_splits, 1);
  const size_t bytes = splitk_workspace_bytes(hp.num_seqs(), hp.num_q_heads(), hp.layout.head_dim, ns);
  DeviceBuffer<float> ws(std::max<size_t>(bytes / sizeof(float), 1));
  const SplitKWorkspace w{ws.get(), bytes, ns};
  if (planned || load != detail::LoadPath::automatic) {
    test::PlanChoices o;
    o.num_splits = ns;
    o.load_path = load;
    if (!planned && num_splits > 0) o.merge = SplitMerge::workspace;
    cuda::run_attention(test::plan_with(attention_problem(args), cuda::attention_target(), o), args, w);
  } else if (num_splits == 0) {
    test::cuda_single_pass(args);
  } else {
    test::cuda_split_states(args, w);
    ReduceArgs r{ws.get(), bytes, hp.num_seqs(), hp.num_q_heads(), hp.layout.head_dim, num_splits, args.out};
    cuda::reduce_states(r);
  }
  METRALE_CUDA_OK(cudaDeviceSynchronize());
  return {dp.download_out(), ws.guards_intact() && dp.out_guards_intact()};
}

// The kernel bf16 and fp8 take where the driver cannot encode the TMA maps.
constexpr detail::LoadPath kRegisters = detail::LoadPath::registers;

void expect_matches(const HostProblem& hp, const std::vector<double>& ref, const RunResult& r, const std::string& what) {
  EXPECT_TRUE(r.guards_ok) << what << ": a guard region around the output or workspace was written";
  const Comparison cmp = compare_decode(r.out.data(), ref, hp.num_seqs(), hp.num_q_heads(), hp.layout.head_dim);
  EXPECT_TRUE(cmp.ok) << what << ": " << cmp.report;
}

int32_t max_pages(const HostProblem& hp) {
  int32_t m = 1;
  for (int32_t len : hp.seq_lens) m = std::max(m, (len + hp.layout.block_size - 1) / hp.layout.block_size);
  return m;
}

DecodeCase random_case(std::mt19937_64& rng) {
  DecodeCase c;
  c.format = KvFormat(rng() % 3);
  c.head_dim = int32_t(pick(rng, 64, 128, 256));
  c.block_size = int32_t(pick(rng, 16, 32, 16, 32, 64, 128));
  c.num_kv_heads = int32_t(pick(rng, 1, 2, 3, 8));
  c.group = int32_t(pick(rng, 1, 2, 4, 5, 8, 16, 6, 32));
  const int32_t max_len = int32_t(pick(rng, 1, 17, 100, 700, 3000));
  const int32_t n = int32_t(pick(rng, 1, 3, 9));
  c.seq_lens = interesting_lengths(c.block_size, max_len, n, rng());
  c.sliding_window = int32_t(pick(rng, 0, 0, 1, 37, 256, 5000));
  c.q_stride_pad = 8 * int64_t(rng() % 3);
  c.q_head_major = rng() % 3 == 0;  // q as transformers hands it at batch 1
  c.page_pad_bytes = 16 * int64_t(rng() % 3);
  c.outlier_channels = rng() % 4 != 0;
  if (c.format == KvFormat::nvfp4) {
    const float scales[] = {1.0f, 1.0f, -1.0f /* calibrate from the data */, 1.11f};
    c.k_global_scale = c.v_global_scale = scales[rng() % 4];
  }
  return c;
}

TEST(GpuDecode, RandomizedMatrixSinglePassAndSplitK) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // METRALE_GPU_TEST_ITERS shortens the matrix for slow runs (sanitizers).
  const char* iters_env = std::getenv("METRALE_GPU_TEST_ITERS");
  const int iters = iters_env ? std::atoi(iters_env) : 60;
  for (int iter = 0; iter < iters; ++iter) {
    const DecodeCase c = random_case(rng);
    SCOPED_TRACE(c.describe());
    const HostProblem hp = make_problem(c, rng());
    const std::vector<double> ref = reference_attention(hp);
    DeviceProblem dp(hp);
    expect_matches(hp, ref, run_gpu(hp, dp, 0), "single pass");
    const int32_t pages = max_pages(hp);
    if (c.format != KvFormat::nvfp4) {
      expect_matches(hp, ref, run_gpu(hp, dp, 0, false, kRegisters), "single pass, register path");
      expect_matches(hp, ref, run_gpu(hp, dp, std::min(pages, kMaxSplits), false, kRegisters),
                     "split-K, register path");
      expect_matches(hp, ref, run_gpu(hp, dp, int32_t(2 + rng() % 7), true, kRegisters),
                     "cluster-merged split-K, register path");
    }
    for (int32_t ns : {1, 2, 3, pages, pages + 2, int32_t(1 + rng() % 40)})
      expect_matches(hp, ref, run_gpu(hp, dp, std::min(ns, kMaxSplits)), "split-K num_splits=" + std::to_string(ns));
    for (int32_t ns : {2, 8, int32_t(2 + rng() % 7), int32_t(9 + rng() % 40)})
      expect_matches(hp, ref, run_gpu(hp, dp, ns, true), "run_attention num_splits=" + std::to_string(ns));
    EXPECT_TRUE(dp.inputs_intact()) << "a kernel wrote into its inputs or their guards";
    if (HasFailure()) break;
  }
}

TEST(GpuDecode, EveryNumSplitsUpToMoreThanPages) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (KvFormat f : {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4}) {
    DecodeCase c;
    c.format = f;
    c.block_size = 16;
    c.seq_lens = {0, 1, 16, 17, 200, 333};
    const HostProblem hp = make_problem(c, seed + int(f));
    const std::vector<double> ref = reference_attention(hp);
    DeviceProblem dp(hp);
    for (int32_t ns = 1; ns <= max_pages(hp) + 3; ++ns) {
      expect_matches(hp, ref, run_gpu(hp, dp, ns), std::string(to_string(f)) + " num_splits=" + std::to_string(ns));
      expect_matches(hp, ref, run_gpu(hp, dp, ns, true),
                     std::string(to_string(f)) + " run_attention num_splits=" + std::to_string(ns));
    }
  }
}

// Every decision a plan can force (pairing, load path, merge, splits) gives
// the reference's output: the paths a benchmark A/Bs are all correct.
TEST(GpuDecode, EveryForcedPlanOption) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const AttnTarget target = cuda::attention_target();
  for (KvFormat f : {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4}) {
    DecodeCase c;
    c.format = f;
    c.head_dim = 64;
    c.num_kv_heads = 4;
    c.group = 2;  // pairs allowed: 2 * group <= 8
    c.seq_lens = {0, 1, 37, 300, 1000};
    const HostProblem hp = make_problem(c, seed + int(f));
    const std::vector<double> ref = reference_attention(hp);
    DeviceProblem dp(hp);
    const AttnArgs args = dp.args();
    for (detail::Toggle pairing : {detail::Toggle::off, detail::Toggle::on})
      for (detail::LoadPath load : {detail::LoadPath::registers, detail::LoadPath::tma})
        for (SplitMerge merge : {SplitMerge::single_pass, SplitMerge::workspace, SplitMerge::cluster})
          for (int32_t ns : {1, 3, 8}) {
            if (load == detail::LoadPath::tma && f == KvFormat::nvfp4) continue;
            if ((merge == SplitMerge::single_pass) != (ns == 1) || (merge == SplitMerge::cluster && ns == 1))
              continue;
            test::PlanChoices o;
            o.num_splits = ns;
            o.merge = merge;
            o.pairing = pairing;
            o.load_path = load;
            const AttnPlan plan = test::plan_with(attention_problem(args), target, o);
            const std::string what = std::string(to_string(f)) + (plan.launch.pair_kv_heads ? " paired " : " ") +
                                     detail::to_string(plan.launch.load_path) + " " + to_string(plan.merge) + " splits " +
                                     std::to_string(ns);
            EXPECT_EQ(plan.launch.pair_kv_heads, pairing == detail::Toggle::on) << what;
            EXPECT_EQ(plan.merge, merge) << what;
            dp.poison_out();
            DeviceBuffer<float> ws(std::max<size_t>(plan.workspace_bytes / sizeof(float), 1));
            cuda::run_attention(plan, args, SplitKWorkspace{ws.get(), plan.workspace_bytes, plan.num_splits});
            METRALE_CUDA_OK(cudaDeviceSynchronize());
            expect_matches(hp, ref, {dp.download_out(), ws.guards_intact() && dp.out_guards_intact()}, what);
          }
  }
}

TEST(GpuDecode, PlannerRunsEveryBatchShape) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (auto [n, len] : std::vector<std::pair<int, int>>{{1, 8000}, {2, 3000}, {40, 300}, {300, 40}}) {
    for (KvFormat f : {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4}) {
      DecodeCase c;
      c.format = f;
      c.num_kv_heads = 8;
      c.group = 4;
      c.seq_lens.assign(n, len);
      c.seq_lens[0] = len / 3;
      const HostProblem hp = make_problem(c, seed + n + int(f));
      DeviceProblem dp(hp);
      const AttnPlan plan = test::plan_with(attention_problem(dp.args(), len), cuda::attention_target());
      SCOPED_TRACE(c.describe() + " planned splits " + std::to_string(plan.num_splits) + ", merge " +
                   to_string(plan.merge) + ", load " + detail::to_string(plan.launch.load_path));
      dp.poison_out();
      DeviceBuffer<float> ws(std::max<size_t>(plan.workspace_bytes / sizeof(float), 1));
      cuda::run_attention(plan, dp.args(), SplitKWorkspace{ws.get(), plan.workspace_bytes, plan.num_splits});
      METRALE_CUDA_OK(cudaDeviceSynchronize());
      expect_matches(hp, reference_attention(hp), {dp.download_out(), ws.guards_intact()}, "planned run");
    }
  }
}

// Tens of thousands of sequences: one CTA per (sequence, kv head) must not
// hit a grid limit silently.
TEST(GpuDecode, TensOfThousandsOfSequences) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  DecodeCase c;
  c.format = KvFormat::fp8_e4m3;
  c.num_kv_heads = 1;
  c.group = 8;
  c.head_dim = 64;
  c.seq_lens = interesting_lengths(16, 40, 70000, seed);
  const HostProblem hp = make_problem(c, seed);
  DeviceProblem dp(hp);
  expect_matches(hp, reference_attention(hp), run_gpu(hp, dp, 0), "70000 sequences");
  expect_matches(hp, reference_attention(hp), run_gpu(hp, dp, 3), "70000 sequences, 3 splits");
}

// Several waves of CTAs of every size side by side: ragged lengths (empty
// and one-token sequences among long ones) in a batch of 90, GQA groups
// that need one or two q-head tiles, each format and head_dim. A NaN and a
// corrupt page id must stay in their own (sequence, kv head) outputs.
// Single pass, workspace split-K and run_attention with the reduce.
TEST(GpuDecode, ManyWavesOfRaggedItemsKeepNanAndCorruptPagesToThemselves) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // Under METRALE_GPU_TEST_ITERS (sanitizer runs) one head_dim per format,
  // drawn at random.
  const bool short_run = std::getenv("METRALE_GPU_TEST_ITERS") != nullptr;
  for (KvFormat f : {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4}) {
    const int32_t only_d = int32_t(pick(rng, 64, 128, 256));
    for (int32_t D : {64, 128, 256}) {
      if (short_run && D != only_d) continue;
      DecodeCase c;
      c.format = f;
      c.head_dim = D;
      c.num_kv_heads = 8;
      c.group = int32_t(pick(rng, 1, 4, 8, 12));
      c.block_size = int32_t(pick(rng, 16, 32, 64));
      c.seq_lens = interesting_lengths(c.block_size, 700, 90, rng());  // >= 720 CTAs
      c.sliding_window = int32_t(pick(rng, 0, 0, 300));
      SCOPED_TRACE(c.describe());
      HostProblem hp = make_problem(c, rng());
      // The last attended page of the first long sequence is corrupt; the
      // last token of the next non-empty one has NaN in V (kv head 3).
      int32_t bad_seq = 0, nan_seq;
      while (hp.seq_lens[bad_seq] < 2 * c.block_size) ++bad_seq;
      for (nan_seq = bad_seq + 1; hp.seq_lens[nan_seq] == 0;) ++nan_seq;
      hp.block_tables[bad_seq * hp.max_blocks_per_seq + (hp.seq_lens[bad_seq] - 1) / c.block_size] =
          int32_t(hp.layout.num_blocks) + 7;
      for (int d = 0; d < D; ++d) poison_cache(hp, 'v', nan_seq, hp.seq_lens[nan_seq] - 1, 3, d);
      const std::vector<double> ref = reference_attention(hp);
      DeviceProblem dp(hp);
      expect_matches(hp, ref, run_gpu(hp, dp, 0), "single pass");
      expect_matches(hp, ref, run_gpu(hp, dp, 3), "split-K, 3 splits");
      expect_matches(hp, ref, run_gpu(hp, dp, 12, true), "run_attention, 12 splits");
      EXPECT_TRUE(dp.inputs_intact()) << "a kernel wrote into its inputs or their guards";
      if (HasFailure()) return;
    }
  }
}

// A NaN in one K element reaches exactly the sequences that attend to it,
// and only through its own kv head: at head_dim 64 the two kv heads share a
// CTA (decode_pairs_kv_heads), and the other head must stay clean.
TEST(GpuDecode, NanInCacheReachesTheOutput) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (KvFormat f : {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4})
    for (int32_t D : {64, 128})
      for (char which : {'k', 'v'}) {
        DecodeCase c;
        c.format = f;
        c.head_dim = D;
        c.seq_lens = {50, 50, 64};
        c.sliding_window = 0;
        HostProblem hp = make_problem(c, seed);
        // Sequence 1, position 20, kv head 0 (of 2): every element.
        for (int d = 0; d < D; ++d) poison_cache(hp, which, 1, 20, 0, d);
        const std::vector<double> ref = reference_attention(hp);
        DeviceProblem dp(hp);
        for (auto [ns, planned] : std::vector<std::pair<int32_t, bool>>{{0, false}, {4, false}, {4, true}}) {
          const RunResult r = run_gpu(hp, dp, ns, planned);
          const std::string what = std::string(to_string(f)) + " D" + std::to_string(D) + " NaN " + which +
                                   ", splits " + std::to_string(ns) + (planned ? " run_attention" : "");
          expect_matches(hp, ref, r, what);
          const int32_t H = hp.num_q_heads();
          EXPECT_TRUE(std::isnan(codec::bf16_to_float(r.out[(1 * H + 0) * D]))) << what;       // attends: NaN
          EXPECT_FALSE(std::isnan(codec::bf16_to_float(r.out[(0 * H + 0) * D]))) << what;      // other sequence
          EXPECT_FALSE(std::isnan(codec::bf16_to_float(r.out[(1 * H + H - 1) * D]))) << what;  // other kv head
        }
      }
}

// head_dim 64 with an even number of kv heads, groups of at most 4 and
// enough sequences runs two kv heads per CTA (decode_pairs_kv_heads): every
// group that pairs, one that does not (8) and an odd head count, ragged
// lengths, a window, split-K through the workspace and through the cluster
// merge, the TMA and the register path. A NaN in K of one head and in V of
// the other must stay in its own head (the reference has them finite).
TEST(GpuDecode, HeadDim64PairsOfKvHeads) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int32_t sms = cuda::device_info().num_sms;
  for (KvFormat f : {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4})
    for (auto [heads, group] : std::vector<std::pair<int32_t, int32_t>>{{2, 1}, {6, 2}, {4, 4}, {2, 8}, {3, 4}}) {
      DecodeCase c;
      c.format = f;
      c.head_dim = 64;
      c.num_kv_heads = heads;
      c.group = group;
      c.block_size = int32_t(pick(rng, 16, 32, 64));
      const int32_t seqs = 2 * sms / std::max(heads / 2, 1);  // a resident wave of head pairs: the batch pairs
      c.seq_lens = interesting_lengths(c.block_size, 300, seqs, rng());
      c.sliding_window = int32_t(pick(rng, 0, 0, 100));
      c.q_stride_pad = 8 * int64_t(rng() % 3);
      c.q_head_major = rng() % 3 == 0;  // q as transformers hands it at batch 1
      c.page_pad_bytes = 16 * int64_t(rng() % 3);
      SCOPED_TRACE(c.describe());
      HostProblem hp = make_problem(c, rng());
      int32_t s = 0;
      while (hp.seq_lens[s] < 2) ++s;
      for (int d = 0; d < 64; ++d) poison_cache(hp, 'k', s, hp.seq_lens[s] - 1, 0, d);
      // V at the position before (attended under any window: position 0
      // may lie on a page before the window, which is never allocated).
      for (int d = 0; d < 64; ++d) poison_cache(hp, 'v', s, hp.seq_lens[s] - 2, heads - 1, d);
      const std::vector<double> ref = reference_attention(hp);
      DeviceProblem dp(hp);
      expect_matches(hp, ref, run_gpu(hp, dp, 0), "single pass");
      expect_matches(hp, ref, run_gpu(hp, dp, 5), "split-K, 5 splits");
      expect_matches(hp, ref, run_gpu(hp, dp, 2, true), "run_attention, 2 splits (cluster merge)");
      if (f != KvFormat::nvfp4) {
        expect_matches(hp, ref, run_gpu(hp, dp, 0, false, kRegisters), "single pass, register path");
        expect_matches(hp, ref, run_gpu(hp, dp, 2, true, kRegisters), "run_attention, 2 splits, register path");
      }
      EXPECT_TRUE(dp.inputs_intact()) << "a kernel wrote into its inputs or their guards";
      if (HasFailure()) return;
    }
}

// A page id outside the cache inside the attended range is never
// dereferenced; that sequence's output is NaN, the others are unaffected.
TEST(GpuDecode, CorruptBlockTableGivesNanNotAFault) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  DecodeCase c;
  c.seq_lens = {40, 40};
  HostProblem hp = make_problem(c, seed);
  hp.block_tables[1 * hp.max_blocks_per_seq + 1] = int32_t(hp.layout.num_blocks) + 1000000;
  const std::vector<double> ref = reference_attention(hp);
  DeviceProblem dp(hp);
  for (int32_t ns : {0, 2}) expect_matches(hp, ref, run_gpu(hp, dp, ns), "corrupt table, splits " + std::to_string(ns));
  expect_matches(hp, ref, run_gpu(hp, dp, 2, true), "corrupt table, run_attention with 2 splits (cluster merge)");
}

TEST(GpuDecode, LaunchersRejectBadArgumentsBeforeLaunching) {
  // Validation precedes any CUDA call, so this runs without a GPU too (the
  // plans come from a target described here, not from the device).
  AttnTarget gpu;
  gpu.num_sms = 132;
  DecodeCase c;
  c.seq_lens = {5};
  const HostProblem hp = make_problem(c, 1);
  std::vector<bf16> out(hp.out_elems());
  AttnArgs a = hp.args(out.data());
  const AttnPlan single = forced_plan(a, gpu, 1, SplitMerge::single_pass);
  a.num_q_heads = 7;
  try {
    cuda::run_attention(single, a, {});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("num_q_heads"), std::string::npos) << e.what();
  }
  a = hp.args(out.data());
  const AttnPlan states = forced_plan(a, gpu, 2, SplitMerge::states_only);
  EXPECT_THROW(cuda::run_attention(states, a, SplitKWorkspace{nullptr, 0, 2}), InvalidArgument);
  EXPECT_THROW(forced_plan(a, gpu, kMaxSplits + 1, SplitMerge::states_only), InvalidArgument);
  ReduceArgs r{nullptr, 0, 1, hp.num_q_heads(), 96, 2, out.data()};
  EXPECT_THROW(cuda::reduce_states(r), Unsupported);
  // A valid layout the kernels cannot address: byte offsets inside a page are 32-bit.
  c.format = KvFormat::nvfp4;
  const HostProblem hp4 = make_problem(c, 1);
  a = hp4.args(out.data());
  a.cache.layout.data_section_bytes = int64_t(1) << 30;
  a.cache.layout.page_stride_bytes = (int64_t(1) << 30) + (int64_t(1) << 20);
  try {
    cuda::run_attention(forced_plan(a, gpu, 1, SplitMerge::single_pass), a, {});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("data_section_bytes"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace metrale::test
