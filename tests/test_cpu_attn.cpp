// Query runs over the paged cache on the CPU backend (docs/spec.md 8): ragged
// runs, causal masks aligned to the end of the cache, windows per query,
// sinks, soft-capping, lse, split-K; against the independent float64
// reference (testing/reference.hpp) and against decode itself.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "testing/forced_plans.hpp"
#include "metrale/cpu.hpp"
#include "metrale/error.hpp"
#include "metrale/plan.hpp"
#include "support/runs_problem.hpp"

namespace metrale::test {
namespace {

constexpr KvFormat kFormats[] = {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4};

TEST(CpuAttn, RaggedRunsMatchTheFloat64Reference) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 24; ++iter) {
    DecodeCase c;
    c.format = kFormats[iter % 3];
    c.head_dim = int32_t(pick(rng, 64, 128, 256));
    c.num_kv_heads = int32_t(pick(rng, 1, 2));
    c.group = int32_t(pick(rng, 1, 4, 8));
    c.block_size = int32_t(pick(rng, 16, 32));
    c.sliding_window = int32_t(pick(rng, 0, 0, 7, 40));
    c.q_head_major = rng() % 3 == 0;
    c.seq_lens = {int32_t(1 + rng() % 90), int32_t(rng() % 3), int32_t(17 + rng() % 200), 1};
    RunsProblem rp(c, random_runs(c.seq_lens, int32_t(pick(rng, 1, 4, 16, 300)), rng), rng());
    if (rng() % 2) rp.sinks = random_sinks(c.num_q_heads(), rng);
    rp.softcap = float(pick(rng, 0, 0, 5, 30)) / 10.0f * 10.0f;
    SCOPED_TRACE(c.describe() + " rows " + std::to_string(rp.rows()) + " softcap " + std::to_string(rp.softcap) +
                 (rp.sinks.empty() ? "" : " sinks"));
    const RunsReference ref = runs_reference(rp);  // rp is final: one reference for every path below
    std::vector<bf16> out = poisoned_bf16(rp.out_elems());
    std::vector<float> lse(size_t(rp.rows()) * c.num_q_heads(), 12345.0f);
    test::cpu_single_pass(rp.args(out.data(), lse.data()));
    expect_runs_match(rp, ref, out, "single pass", &lse);
    // The sampled-rows reference (each row as the decode of its prefix, for
    // the GPU's runs too long for the whole reference) agrees on the same output.
    std::vector<int32_t> sample;
    for (int32_t r = 0; r < rp.rows(); ++r)
      if (r == 0 || r == rp.rows() - 1 || rng() % 3 == 0) sample.push_back(r);
    if (!sample.empty()) expect_rows_match(rp, sample, out, "single pass", &lse);
    for (int32_t ns : {2, 5}) {
      std::vector<float> ws(splitk_workspace_bytes(rp.rows(), c.num_q_heads(), c.head_dim, ns) / 4 + 4);
      const SplitKWorkspace w{ws.data(), ws.size() * 4, ns};
      out = poisoned_bf16(rp.out_elems());
      std::fill(lse.begin(), lse.end(), 12345.0f);
      const AttnArgs a = rp.args(out.data(), lse.data());
      test::cpu_split_states(a, w);
      cpu::reduce_states(reduce_args_for(a, w));
      expect_runs_match(rp, ref, out, "split-K " + std::to_string(ns), &lse);
    }
    // The planner's plan, for the batch's longest run.
    AttnProblem prob = attention_problem(rp.args(nullptr));
    prob.max_q_len = 1;
    for (int32_t s = 0; s < rp.p.num_seqs(); ++s) prob.max_q_len = std::max(prob.max_q_len, rp.q_start[s + 1] - rp.q_start[s]);
    const AttnPlan plan = plan_attention(prob, cpu::attention_target());
    std::vector<float> ws(plan.workspace_bytes / 4 + 4);
    out = poisoned_bf16(rp.out_elems());
    cpu::run_attention(plan, rp.args(out.data()), SplitKWorkspace{ws.data(), plan.workspace_bytes, plan.num_splits});
    expect_runs_match(rp, ref, out, "run_attention, " + std::to_string(plan.num_splits) + " splits");
    if (HasFailure()) break;
  }
}

// A run of one row per sequence is decode, bit for bit; and every row of a
// run is the decode of the prefix ending at its position.
TEST(CpuAttn, RowsAreTheDecodesOfTheirPrefixes) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (KvFormat f : kFormats) {
    DecodeCase c;
    c.format = f;
    c.head_dim = 64;
    c.sliding_window = f == KvFormat::fp8_e4m3 ? 23 : 0;
    c.seq_lens = {1, 40, 77, 130};
    RunsProblem ones(c, {1, 1, 1, 1}, rng());
    // q rows of a decode = the runs' rows.
    std::vector<bf16> got = poisoned_bf16(ones.out_elems()), want = poisoned_bf16(ones.out_elems());
    test::cpu_single_pass(ones.args(got.data()));
    AttnArgs d = ones.p.args(want.data());
    d.sliding_window = ones.sliding_window;
    d.q = ones.q.data();
    d.q_stride = ones.q_stride;
    d.q_head_stride = ones.q_head_stride;
    test::cpu_single_pass(d);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i].bits, want[i].bits) << to_string(f) << " q_len 1 " << i;

    RunsProblem rp(c, {1, 13, 40, 130}, rng());
    got = poisoned_bf16(rp.out_elems());
    test::cpu_single_pass(rp.args(got.data()));
    const int32_t Hq = c.num_q_heads(), D = c.head_dim;
    for (int32_t s = 0; s < rp.p.num_seqs(); ++s) {
      const int32_t n = rp.q_start[s + 1] - rp.q_start[s];
      for (int32_t j = 0; j < n; ++j) {
        const int32_t row = rp.q_start[s] + j;
        std::vector<int32_t> len{rp.p.seq_lens[s] - n + j + 1};
        std::vector<bf16> one(size_t(Hq) * D);
        AttnArgs pd = rp.p.args(one.data());
        pd.num_seqs = 1;
        pd.q = rp.q.data() + size_t(row) * rp.q_stride;
        pd.q_stride = rp.q_stride;
        pd.q_head_stride = rp.q_head_stride;
        pd.block_tables = rp.p.block_tables.data() + size_t(s) * rp.p.max_blocks_per_seq;
        pd.seq_lens = len.data();
        pd.sliding_window = rp.sliding_window;
        test::cpu_single_pass(pd);
        for (int32_t e = 0; e < Hq * D; ++e)
          ASSERT_EQ(got[size_t(row) * Hq * D + e].bits, one[e].bits) << to_string(f) << " seq " << s << " row " << j;
      }
    }
  }
}

// Sinks of -inf are no sinks, bit for bit; a soft-cap far above every logit
// is the identity up to rounding.
TEST(CpuAttn, NeutralSinksAndSoftCap) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (KvFormat f : kFormats) {
    DecodeCase c;
    c.format = f;
    c.seq_lens = {50, 300};
    RunsProblem rp(c, {3, 8}, rng());
    std::vector<bf16> plain = poisoned_bf16(rp.out_elems()), got = poisoned_bf16(rp.out_elems());
    test::cpu_single_pass(rp.args(plain.data()));
    rp.sinks.assign(c.num_q_heads(), kNoSink);
    test::cpu_single_pass(rp.args(got.data()));
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i].bits, plain[i].bits) << to_string(f) << " sinks -inf";
    rp.sinks.clear();
    rp.softcap = 1e6f;
    test::cpu_single_pass(rp.args(got.data()));
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(codec::bf16_to_float(got[i]), codec::bf16_to_float(plain[i]),
                  1e-2f * std::abs(codec::bf16_to_float(plain[i])) + 1e-3f)
          << to_string(f) << " softcap 1e6";
    // A large sink takes the mass: the output shrinks toward 0.
    rp.softcap = 0.0f;
    rp.sinks.assign(c.num_q_heads(), 80.0f);  // far above every logit (outlier channels reach ~20)
    test::cpu_single_pass(rp.args(got.data()));
    for (size_t i = 0; i < got.size(); ++i) ASSERT_LT(std::abs(codec::bf16_to_float(got[i])), 1e-6f);
  }
}

TEST(CpuAttn, RejectsBadRuns) {
  DecodeCase c;
  c.seq_lens = {10, 20};
  RunsProblem rp(c, {2, 3}, 7);
  std::vector<bf16> out(rp.out_elems());
  auto expect_invalid = [&](RunsProblem& r, const std::string& arg) {
    try {
      test::cpu_single_pass(r.args(out.data()));
      ADD_FAILURE() << "no exception; expected one naming " << arg;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(arg), std::string::npos) << e.what();
    }
  };
  RunsProblem bad = rp;
  bad.q_start = {0, 3, 2};  // decreasing
  expect_invalid(bad, "q_start");
  bad = rp;
  bad.q_start = {0, 11, 14};  // a run longer than its sequence (10)
  expect_invalid(bad, "q_start");
  bad = rp;
  bad.sinks.assign(c.num_q_heads(), 0.0f);
  bad.sinks[3] = std::nanf("");
  expect_invalid(bad, "sinks");
  bad = rp;
  bad.softcap = -1.0f;
  expect_invalid(bad, "softcap");
  bad = rp;
  bad.softcap = std::numeric_limits<float>::infinity();
  expect_invalid(bad, "softcap");
  // q_start[num_seqs] must be the number of q rows.
  AttnArgs a = rp.args(out.data());
  a.num_q_rows = 4;
  EXPECT_THROW(test::cpu_single_pass(a), InvalidArgument);
}

}  // namespace
}  // namespace metrale::test
