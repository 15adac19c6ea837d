// CPU reference attention over one row per sequence (single pass, split-K + reduce, run_attention)
// against the independent float64 reference of tests/support, over a
// randomized matrix of formats, shapes, windows, lengths and layouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "testing/forced_plans.hpp"
#include "metrale/cpu.hpp"
#include "metrale/plan.hpp"
#include "support/problem.hpp"
#include "testing/reference.hpp"

namespace metrale::test {
namespace {

constexpr KvFormat kFormats[] = {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4};

template <class T>
T pick(std::mt19937_64& rng, std::initializer_list<T> xs) {
  return *(xs.begin() + rng() % xs.size());
}

std::vector<bf16> run_single(const HostProblem& p) {
  std::vector<bf16> out = poisoned_bf16(p.out_elems());
  test::cpu_single_pass(p.args(out.data()));
  EXPECT_EQ(count_poison(out.data(), out.size()), 0) << "output elements left unwritten";
  return out;
}

// Split-K into a NaN-poisoned workspace, then reduce. The workspace is returned in *ws.
std::vector<bf16> run_split(const HostProblem& p, int32_t num_splits, std::vector<float>* ws_out = nullptr) {
  const size_t bytes = splitk_workspace_bytes(p.num_seqs(), p.num_q_heads(), p.layout.head_dim, num_splits);
  std::vector<float> ws(bytes / sizeof(float), std::numeric_limits<float>::quiet_NaN());
  std::vector<bf16> out = poisoned_bf16(p.out_elems());
  const AttnArgs a = p.args(out.data());
  test::cpu_split_states(a, SplitKWorkspace{ws.data(), bytes, num_splits});
  ReduceArgs r;
  r.workspace = ws.data();
  r.workspace_bytes = bytes;
  r.num_seqs = p.num_seqs();
  r.num_q_heads = p.num_q_heads();
  r.head_dim = p.layout.head_dim;
  r.num_splits = num_splits;
  r.out = out.data();
  cpu::reduce_states(r);
  EXPECT_EQ(count_poison(out.data(), out.size()), 0) << "output elements left unwritten";
  if (ws_out) *ws_out = std::move(ws);
  return out;
}

void expect_matches_reference(const HostProblem& p, const std::vector<bf16>& out, const char* what) {
  const Comparison cmp =
      compare_decode(out.data(), reference_attention(p), p.num_seqs(), p.num_q_heads(), p.layout.head_dim);
  EXPECT_TRUE(cmp.ok) << what << ": " << cmp.report;
}

// bf16 values within `ulps` units in the last place (at the larger magnitude),
// or within `abs_tol` (for values near zero whose sign may flip).
bool bf16_close(bf16 a, bf16 b, int ulps, double abs_tol) {
  const double x = codec::bf16_to_float(a), y = codec::bf16_to_float(b);
  if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
  const double mag = std::max(std::fabs(x), std::fabs(y));
  const double ulp = mag > 0 ? std::ldexp(1.0, std::ilogb(mag) - 7) : 0.0;
  return std::fabs(x - y) <= ulps * ulp || std::fabs(x - y) <= abs_tol;
}

void expect_outputs_close(const HostProblem& p, const std::vector<bf16>& a, const std::vector<bf16>& b,
                          const std::string& what) {
  const int32_t D = p.layout.head_dim;
  int64_t bad = 0;
  for (size_t blk = 0; blk < a.size() / D; ++blk) {
    double mx = 0;
    for (int32_t d = 0; d < D; ++d) mx = std::max(mx, std::fabs(double(codec::bf16_to_float(a[blk * D + d]))));
    for (int32_t d = 0; d < D; ++d)
      if (!bf16_close(a[blk * D + d], b[blk * D + d], 2, 1e-5 * mx) && bad++ < 5)
        ADD_FAILURE() << what << ": block " << blk << " d " << d << ": " << codec::bf16_to_float(a[blk * D + d])
                      << " vs " << codec::bf16_to_float(b[blk * D + d]);
  }
  EXPECT_EQ(bad, 0) << what;
}

DecodeCase random_case(std::mt19937_64& rng, KvFormat f, int32_t D, int32_t B) {
  DecodeCase c;
  c.format = f;
  c.head_dim = D;
  c.block_size = B;
  c.group = pick<int32_t>(rng, {1, 2, 4, 8, 16});
  c.num_kv_heads = pick<int32_t>(rng, {1, 2, 3});
  const int32_t max_len = 5 * B + 7;
  c.seq_lens = interesting_lengths(B, max_len, 5, rng());
  c.sliding_window = pick<int32_t>(rng, {0, 0, int32_t(1 + rng() % 24), int32_t(B + rng() % (2 * B)), 100000});
  c.q_stride_pad = pick<int64_t>(rng, {0, 8, 24});
  c.q_head_major = rng() % 3 == 0;  // q as transformers hands it at batch 1
  c.kv_row_pad = pick<int64_t>(rng, {0, 16});
  c.page_pad_bytes = pick<int64_t>(rng, {0, 16, 48});
  c.outlier_channels = rng() % 4 != 0;
  if (f == KvFormat::nvfp4) {
    c.k_global_scale = pick<float>(rng, {1.0f, 0.0f /* calibrated */, 0.37f, 3.5f});
    c.v_global_scale = pick<float>(rng, {1.0f, 0.0f, 0.0625f, 2.0f});
  }
  return c;
}

// ---- single pass against the reference ----

void matrix_for_format(KvFormat f) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int32_t D : {64, 128, 256})
    for (int32_t B : {16, 32}) {
      const DecodeCase c = random_case(rng, f, D, B);
      SCOPED_TRACE(c.describe());
      const HostProblem p = make_problem(c, rng());
      expect_matches_reference(p, run_single(p), "single pass");
    }
}

TEST(CpuDecode, MatchesReferenceBf16) { matrix_for_format(KvFormat::bf16); }
TEST(CpuDecode, MatchesReferenceFp8) { matrix_for_format(KvFormat::fp8_e4m3); }
TEST(CpuDecode, MatchesReferenceNvfp4) { matrix_for_format(KvFormat::nvfp4); }

TEST(CpuDecode, EveryGroupSizeAndLargeBlocks) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int32_t group : {1, 2, 4, 8, 16})
    for (int32_t B : {64, 128}) {
      DecodeCase c = random_case(rng, kFormats[rng() % 3], pick<int32_t>(rng, {64, 128}), B);
      c.group = group;
      c.seq_lens = {0, 1, B - 1, B, B + 1, 2 * B + 5};
      SCOPED_TRACE(c.describe());
      const HostProblem p = make_problem(c, rng());
      expect_matches_reference(p, run_single(p), "single pass");
    }
}

TEST(CpuDecode, SlidingWindowEdges) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (KvFormat f : kFormats)
    for (int32_t W : {1, 15, 16, 17, 33, 64, 65}) {
      DecodeCase c;
      c.format = f;
      c.head_dim = 64;
      c.block_size = 16;
      c.group = 2;
      c.sliding_window = W;
      c.seq_lens = {0, 1, W - 1 > 0 ? W - 1 : 2, W, W + 1, 64, 65, 100, 47};
      SCOPED_TRACE(c.describe());
      const HostProblem p = make_problem(c, rng());
      expect_matches_reference(p, run_single(p), "single pass");
    }
}

TEST(CpuDecode, ZeroLengthSequencesOutputZero) {
  DecodeCase c;
  c.seq_lens = {0, 0, 3, 0};
  const HostProblem p = make_problem(c, random_seed());
  const std::vector<bf16> out = run_single(p);
  const size_t per_seq = size_t(p.num_q_heads()) * c.head_dim;
  for (int32_t s : {0, 1, 3})
    for (size_t i = 0; i < per_seq; ++i) ASSERT_EQ(out[s * per_seq + i].bits, 0) << "seq " << s;
}

TEST(CpuDecode, EmptyBatchIsANoOp) {
  DecodeCase c;
  c.seq_lens = {5};
  const HostProblem p = make_problem(c, 1);
  AttnArgs a = p.args(nullptr);
  a.num_seqs = 0;
  EXPECT_NO_THROW(test::cpu_single_pass(a));
}

TEST(CpuDecode, ResultDoesNotDependOnThreadCount) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  DecodeCase c;
  c.format = KvFormat::fp8_e4m3;
  c.seq_lens = interesting_lengths(c.block_size, 300, 12, seed);
  const HostProblem p = make_problem(c, seed);
  const int32_t saved = cpu::num_threads();
  cpu::set_num_threads(1);
  EXPECT_EQ(cpu::num_threads(), 1);
  const std::vector<bf16> one = run_single(p);
  const std::vector<bf16> one_split = run_split(p, 3);
  cpu::set_num_threads(7);
  EXPECT_EQ(cpu::num_threads(), 7);
  const std::vector<bf16> seven = run_single(p);
  const std::vector<bf16> seven_split = run_split(p, 3);
  cpu::set_num_threads(saved);
  for (size_t i = 0; i < one.size(); ++i) {
    ASSERT_EQ(one[i].bits, seven[i].bits) << i;
    ASSERT_EQ(one_split[i].bits, seven_split[i].bits) << i;
  }
}

TEST(CpuDecode, ConcurrentCallersGetTheirOwnResults) {
  // The backend is re-entrant: calls from several user threads (each using
  // the shared pool) give the same bits as sequential calls.
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::vector<HostProblem> problems;
  std::vector<std::vector<bf16>> want, got(4);
  for (int i = 0; i < 4; ++i) {
    DecodeCase c;
    c.format = kFormats[i % 3];
    c.head_dim = 64;
    c.seq_lens = interesting_lengths(16, 200, 8, seed + i);
    problems.push_back(make_problem(c, seed + i));
    want.push_back(run_single(problems.back()));
  }
  std::vector<std::thread> threads;
  test::PlanChoices single;
  single.num_splits = 1;
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      const AttnPlan plan =
          test::plan_with(attention_problem(problems[i].args(nullptr)), cpu::attention_target(), single);
      for (int rep = 0; rep < 5; ++rep) {
        got[i] = poisoned_bf16(problems[i].out_elems());
        if (rep % 2) test::cpu_single_pass(problems[i].args(got[i].data()));
        else cpu::run_attention(plan, problems[i].args(got[i].data()), SplitKWorkspace{});
      }
    });
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 4; ++i)
    for (size_t j = 0; j < want[i].size(); ++j) ASSERT_EQ(want[i][j].bits, got[i][j].bits) << i << " " << j;
}

// ---- split-K ----

TEST(CpuDecode, SplitKEqualsSinglePassForEverySplitCount) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (KvFormat f : kFormats)
    for (int rep = 0; rep < 2; ++rep) {
      DecodeCase c = random_case(rng, f, pick<int32_t>(rng, {64, 128}), 16);
      c.group = pick<int32_t>(rng, {1, 4, 8});
      c.seq_lens = {0, 1, 16, 33, 97, int32_t(40 + rng() % 100)};
      if (rep == 1) c.sliding_window = 40;
      SCOPED_TRACE(c.describe());
      const HostProblem p = make_problem(c, rng());
      const std::vector<bf16> single = run_single(p);
      expect_matches_reference(p, single, "single pass");
      int32_t max_pages = 0;
      for (int32_t L : p.seq_lens) {
        const PageRange r = attended_pages(L, c.sliding_window, c.block_size);
        max_pages = std::max(max_pages, r.end - r.first);
      }
      const int32_t D = c.head_dim, Hq = p.num_q_heads();
      for (int32_t ns = 1; ns <= max_pages + 3; ++ns) {
        SCOPED_TRACE("num_splits " + std::to_string(ns));
        std::vector<float> ws;
        const std::vector<bf16> split = run_split(p, ns, &ws);
        expect_outputs_close(p, single, split, "split-K vs single pass");
        // Every record written; empty splits are (o = 0, m = -inf, l = 0).
        for (int32_t s = 0; s < p.num_seqs(); ++s) {
          const PageRange r = attended_pages(p.seq_lens[s], c.sliding_window, c.block_size);
          for (int32_t sp = 0; sp < ns; ++sp) {
            const PageRange pr = split_pages(r, sp, ns);
            const bool empty = pr.end <= pr.first;
            for (int32_t h = 0; h < Hq; ++h) {
              const float* rec = &ws[((size_t(s) * Hq + h) * ns + sp) * (D + 2)];
              if (empty) {
                ASSERT_EQ(rec[D], -std::numeric_limits<float>::infinity()) << "seq " << s << " split " << sp;
                ASSERT_EQ(rec[D + 1], 0.0f);
                for (int32_t d = 0; d < D; ++d) ASSERT_EQ(rec[d], 0.0f);
              } else {
                ASSERT_TRUE(std::isfinite(rec[D])) << "seq " << s << " split " << sp;
                ASSERT_GE(rec[D + 1], 1.0f);  // the max logit contributes exp(0) = 1
                for (int32_t d = 0; d < D; ++d) ASSERT_TRUE(std::isfinite(rec[d]));
              }
            }
          }
        }
      }
    }
}

TEST(CpuDecode, ReduceMergesStatesByTheSplitKRule) {
  // Hand-made states: the reduce is the docs/spec.md 4 formula, all-empty -> 0.
  const int32_t D = 64, S = 3;
  std::vector<float> ws(size_t(2) * S * (D + 2));
  auto rec = [&](int32_t head, int32_t s) { return &ws[(size_t(head) * S + s) * (D + 2)]; };
  const float m[S] = {1.0f, 3.0f, -std::numeric_limits<float>::infinity()};
  const float l[S] = {2.0f, 0.5f, 0.0f};
  for (int32_t s = 0; s < S; ++s) {
    for (int32_t d = 0; d < D; ++d) rec(0, s)[d] = s == 2 ? 0.0f : float(d + 1) * (s == 0 ? 1.0f : -0.5f);
    rec(0, s)[D] = m[s];
    rec(0, s)[D + 1] = l[s];
    for (int32_t d = 0; d < D; ++d) rec(1, s)[d] = 0.0f;  // head 1: every split empty
    rec(1, s)[D] = -std::numeric_limits<float>::infinity();
    rec(1, s)[D + 1] = 0.0f;
  }
  std::vector<bf16> out = poisoned_bf16(2 * D);
  ReduceArgs r;
  r.workspace = ws.data();
  r.workspace_bytes = ws.size() * sizeof(float);
  r.num_seqs = 1;
  r.num_q_heads = 2;
  r.head_dim = D;
  r.num_splits = S;
  r.out = out.data();
  cpu::reduce_states(r);
  const double w0 = 2.0 * std::exp(1.0 - 3.0), w1 = 0.5;
  for (int32_t d = 0; d < D; ++d) {
    const double expect = (w0 * (d + 1) + w1 * (d + 1) * -0.5) / (w0 + w1);
    EXPECT_NEAR(codec::bf16_to_float(out[d]), expect, std::fabs(expect) * 8e-3 + 1e-6) << d;
    EXPECT_EQ(out[D + d].bits, 0) << d;
  }
}

// ---- run_attention with the planner's plan ----

TEST(CpuDecode, RunDecodeWithPlannerPlan) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  bool saw_split = false, saw_single = false;
  for (KvFormat f : kFormats)
    for (std::vector<int32_t> lens : {std::vector<int32_t>{2000}, std::vector<int32_t>{700, 0, 1300},
                                      interesting_lengths(16, 200, 40, rng())}) {
      DecodeCase c;
      c.format = f;
      c.head_dim = 64;
      c.group = 4;
      c.num_kv_heads = 2;
      c.seq_lens = lens;
      SCOPED_TRACE(c.describe());
      const HostProblem p = make_problem(c, rng());
      for (int32_t sms : {1, cpu::num_threads(), 132}) {
        AttnProblem dp;
        dp.num_seqs = p.num_seqs();
        dp.num_q_heads = p.num_q_heads();
        dp.layout = p.layout;
        dp.max_seq_len = *std::max_element(lens.begin(), lens.end());
        AttnTarget target = cpu::attention_target();
        target.num_sms = sms;
        const AttnPlan plan = test::plan_with(dp, target);
        (plan.num_splits > 1 ? saw_split : saw_single) = true;
        SCOPED_TRACE("num_sms " + std::to_string(sms) + " num_splits " + std::to_string(plan.num_splits));
        EXPECT_EQ(plan.merge, plan.num_splits > 1 ? SplitMerge::workspace : SplitMerge::single_pass);
        std::vector<float> ws(plan.workspace_bytes / sizeof(float) + 4);
        std::vector<bf16> out = poisoned_bf16(p.out_elems());
        cpu::run_attention(plan, p.args(out.data()), SplitKWorkspace{ws.data(), plan.workspace_bytes, plan.num_splits});
        EXPECT_EQ(count_poison(out.data(), out.size()), 0);
        expect_matches_reference(p, out, "run_attention");
      }
    }
  EXPECT_TRUE(saw_split);
  EXPECT_TRUE(saw_single);
}

// ---- NaN propagation and bad page ids ----

TEST(CpuDecode, NaNInCacheReachesExactlyTheSequencesAttendingToIt) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (KvFormat f : kFormats) {
    DecodeCase c;
    c.format = f;
    c.head_dim = 64;
    c.num_kv_heads = 2;
    c.group = 3;
    c.sliding_window = 40;
    c.seq_lens = {70, 50, 90, 30, 1};
    SCOPED_TRACE(c.describe());
    HostProblem p = make_problem(c, rng());
    // seq 4: its only token has a NaN in K of kv head 0 (every logit of q heads 0..2 is NaN).
    poison_cache(p, 'k', 4, 0, 0, 7);
    // seq 0: NaN in K of kv head 1 at an attended position -> q heads 3..5 NaN.
    poison_cache(p, 'k', 0, 69 - int32_t(rng() % 40), 1, int32_t(rng() % 64));
    // seq 1: NaN in V of kv head 0, channel 5 -> channel 5 of q heads 0..2 NaN
    // (nvfp4: the whole 16-channel group shares the NaN scale).
    poison_cache(p, 'v', 1, 49 - int32_t(rng() % 40), 0, 5);
    // seq 2: NaN in K and V at positions masked by the window (same first page) -> no effect.
    poison_cache(p, 'k', 2, 48, 0, 1);
    poison_cache(p, 'v', 2, 49, 1, 2);
    const std::vector<double> ref = reference_attention(p);
    for (int32_t ns : {1, 2, 3, 5}) {
      SCOPED_TRACE("num_splits " + std::to_string(ns));
      const std::vector<bf16> out = ns == 1 ? run_single(p) : run_split(p, ns);
      const Comparison cmp = compare_decode(out.data(), ref, p.num_seqs(), p.num_q_heads(), c.head_dim);
      EXPECT_TRUE(cmp.ok) << cmp.report;
      auto is_nan = [&](int32_t s, int32_t h, int32_t d) {
        return std::isnan(codec::bf16_to_float(out[(size_t(s) * 6 + h) * 64 + d]));
      };
      for (int32_t s = 0; s < 5; ++s)
        for (int32_t h = 0; h < 6; ++h)
          for (int32_t d = 0; d < 64; ++d) {
            bool expect = false;
            if (s == 0) expect = h >= 3;
            if (s == 4) expect = h < 3;
            if (s == 1) expect = h < 3 && (f == KvFormat::nvfp4 ? d < 16 : d == 5);
            ASSERT_EQ(is_nan(s, h, d), expect) << "seq " << s << " head " << h << " d " << d;
          }
    }
  }
}

TEST(CpuDecode, BadPageIdPoisonsOnlyItsSequence) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (KvFormat f : kFormats) {
    DecodeCase c;
    c.format = f;
    c.head_dim = 64;
    c.seq_lens = {64, 100, 37, 0};
    SCOPED_TRACE(c.describe());
    HostProblem p = make_problem(c, rng());
    const int32_t mb = p.max_blocks_per_seq;
    p.block_tables[size_t(1) * mb + 3] = int32_t(p.layout.num_blocks);  // seq 1, attended page 3
    p.block_tables[size_t(2) * mb + 0] = -2;                            // seq 2, attended page 0
    const std::vector<double> ref = reference_attention(p);
    for (int32_t ns : {1, 2, 7}) {
      SCOPED_TRACE("num_splits " + std::to_string(ns));
      const std::vector<bf16> out = ns == 1 ? run_single(p) : run_split(p, ns);
      const Comparison cmp = compare_decode(out.data(), ref, p.num_seqs(), p.num_q_heads(), c.head_dim);
      EXPECT_TRUE(cmp.ok) << cmp.report;
      const size_t per_seq = size_t(p.num_q_heads()) * c.head_dim;
      for (int32_t s = 0; s < 4; ++s)
        for (size_t i = 0; i < per_seq; ++i)
          ASSERT_EQ(std::isnan(codec::bf16_to_float(out[s * per_seq + i])), s == 1 || s == 2) << "seq " << s;
    }
  }
}

// ---- speed ----

TEST(CpuDecode, SpeedBf16Batch64x4096) {
  // 64 seqs x 4096 tokens x 8 kv heads x 32 q heads x D=128, bf16 (1 GiB of K+V).
  HostProblem p;
  p.c.format = KvFormat::bf16;
  p.c.head_dim = 128;
  p.c.block_size = 16;
  p.c.num_kv_heads = 8;
  p.c.group = 4;
  const int32_t S = 64, L = 4096, pages = L / 16;
  p.c.seq_lens.assign(S, L);
  p.seq_lens = p.c.seq_lens;
  p.layout = KvCacheLayout::bf16(int64_t(S) * pages, 16, 8, 128);
  p.max_blocks_per_seq = pages;
  uint64_t x = random_seed() | 1;
  auto next = [&x] {  // xorshift64: fast enough to fill a GiB
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  for (auto* cache : {&p.k_cache, &p.v_cache}) {
    cache->resize(size_t(p.layout.cache_bytes()));
    uint16_t* e = reinterpret_cast<uint16_t*>(cache->data());
    for (size_t i = 0; i < cache->size() / 2; i += 4) {
      const uint64_t r = next();
      for (int j = 0; j < 4; ++j) e[i + j] = uint16_t(((r >> (16 * j)) & 0x80ffu) | 0x3e00u);  // +-[1/8, 1/2)
    }
  }
  std::vector<int32_t> perm(size_t(S) * pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(next()));
  p.block_tables = perm;
  p.q_stride = 32 * 128;
  p.q.resize(size_t(S) * p.q_stride);
  for (bf16& v : p.q) v = codec::float_to_bf16(float(int64_t(next() % 2001) - 1000) / 500.0f);
  p.sm_scale = 1.0f / std::sqrt(128.0f);

  std::vector<bf16> out = poisoned_bf16(p.out_elems());
  const auto t0 = std::chrono::steady_clock::now();
  test::cpu_single_pass(p.args(out.data()));
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ speed    ] cpu bf16 decode 64 x 4096 x (8 kv / 32 q heads) x 128: %.3f s on %d threads (%.2f GB/s)\n",
              sec, cpu::num_threads(), 2.0 * double(p.layout.cache_bytes()) / sec * 1e-9);
  EXPECT_EQ(count_poison(out.data(), out.size()), 0);
#ifdef NDEBUG
  EXPECT_LT(sec, 20.0);
#endif
  // Spot-check two sequences against the reference (the others set to length 0).
  HostProblem check = std::move(p);
  for (int32_t s = 0; s < S; ++s)
    if (s != 0 && s != 41) check.seq_lens[s] = 0;
  const std::vector<double> ref = reference_attention(check);
  const size_t per_seq = size_t(32) * 128;
  for (int32_t s : {0, 41}) {
    const std::vector<double> r(ref.begin() + s * per_seq, ref.begin() + (s + 1) * per_seq);
    const Comparison cmp = compare_decode(out.data() + s * per_seq, r, 1, 32, 128);
    EXPECT_TRUE(cmp.ok) << "seq " << s << ": " << cmp.report;
  }
}

}  // namespace
}  // namespace metrale::test
