// Query runs (docs/spec.md 8) over a random problem's cache, shared by the CPU
// and GPU tests: ragged runs of random q rows, sinks, soft-cap, and the
// comparison with the float64 reference (testing/attention_f64).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "support/problem.hpp"

namespace metrale::test {

constexpr float kNoSink = -std::numeric_limits<float>::infinity();

// A problem's cache with query runs of `runs[i]` rows per sequence (their
// q rows random, strided), sinks and soft-cap as given. The cache holds
// every position of every sequence (a window's earlier rows reach back
// past the last row's window); the window applies to the runs.
inline DecodeCase whole_history(DecodeCase c) {
  c.sliding_window = 0;
  return c;
}

struct RunsProblem {
  HostProblem p;
  int32_t sliding_window = 0;
  std::vector<int32_t> q_start;
  std::vector<bf16> q;
  int64_t q_stride = 0, q_head_stride = 0;  // q_layout(c, rows)
  std::vector<float> sinks;
  float softcap = 0.0f;

  RunsProblem(const DecodeCase& c, const std::vector<int32_t>& runs, uint64_t seed)
      : p(make_problem(whole_history(c), seed)), sliding_window(c.sliding_window) {
    std::mt19937_64 rng(seed ^ 0x5eed);
    q_start.assign(1, 0);
    for (size_t i = 0; i < runs.size(); ++i) q_start.push_back(q_start.back() + runs[i]);
    DecodeCase qc = c;
    qc.q_stride_pad = c.q_head_major ? c.q_stride_pad : 8;
    const QLayout ql = q_layout(qc, q_start.back());
    q_stride = ql.row_stride;
    q_head_stride = ql.head_stride;
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    q.resize(ql.elems);
    for (bf16& x : q) x = codec::float_to_bf16(u(rng));
  }
  int32_t rows() const { return q_start.back(); }
  AttnArgs args(bf16* out, float* lse = nullptr) const {
    AttnArgs a;
    a.q = q.data();
    a.q_stride = q_stride;
    a.q_head_stride = q_head_stride;
    a.q_start = q_start.data();
    a.num_seqs = p.num_seqs();
    a.num_q_rows = rows();
    a.num_q_heads = p.num_q_heads();
    a.cache = p.cache_view();
    a.block_tables = p.block_tables.data();
    a.max_blocks_per_seq = p.max_blocks_per_seq;
    a.seq_lens = p.seq_lens.data();
    a.sliding_window = sliding_window;
    a.sm_scale = p.sm_scale;
    a.sinks = sinks.empty() ? nullptr : sinks.data();
    a.softcap = softcap;
    a.out = out;
    a.lse = lse;
    return a;
  }
  size_t out_elems() const { return size_t(rows()) * p.num_q_heads() * p.layout.head_dim; }
};

// Random sink logits per q head: -2..2, every third head none (kNoSink).
inline std::vector<float> random_sinks(int32_t num_q_heads, std::mt19937_64& rng) {
  std::vector<float> sinks;
  for (int32_t h = 0; h < num_q_heads; ++h) sinks.push_back(h % 3 ? float(rng() % 5) - 2.0f : kNoSink);
  return sinks;
}

// Runs of 0..max_run rows (at most the sequence's length).
inline std::vector<int32_t> random_runs(const std::vector<int32_t>& lens, int32_t max_run, std::mt19937_64& rng) {
  std::vector<int32_t> runs;
  for (int32_t L : lens) runs.push_back(int32_t(rng() % (std::min(L, max_run) + 1)));
  return runs;
}

// The float64 reference of rp's runs (testing/attention_f64): outputs
// and lse. A test that runs several kernels or plans on one problem computes
// it once, after its last change to rp.
struct RunsReference {
  std::vector<double> out, lse;
};
RunsReference runs_reference(const RunsProblem& rp);

// out (and lse) against the reference: per (row, head) as compare_decode;
// lse within 1e-3 relative, -inf / NaN exactly where the reference has them.
void expect_runs_match(const RunsProblem& rp, const RunsReference& ref, const std::vector<bf16>& out,
                       const std::string& what, const std::vector<float>* lse = nullptr);
// The same, computing the reference.
void expect_runs_match(const RunsProblem& rp, const std::vector<bf16>& out, const std::string& what,
                       const std::vector<float>* lse = nullptr);

// The same comparison for a few rows only (global row indices `rows`),
// for runs too long for the whole reference: row j of a run of n rows over
// L positions is the one-row run over the first L - n + j + 1 positions of
// its sequence (same pages, window, sinks and soft-cap). rp's block tables
// must hold only pages inside the cache (the whole-run NaN rule of a bad
// page is not what a prefix's reference sees).
void expect_rows_match(const RunsProblem& rp, const std::vector<int32_t>& rows, const std::vector<bf16>& out,
                       const std::string& what, const std::vector<float>* lse = nullptr);

}  // namespace metrale::test
