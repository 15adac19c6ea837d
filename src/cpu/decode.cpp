// Paged attention on the CPU, decode and query runs (docs/spec.md 8) alike: a
// decode is a run of one row per sequence, through the same code. Single
// pass, split-K partial states (docs/spec.md 4), run_attention. Work
// items are (sequence, kv head[, split]); for each row of the sequence's run
// each dequantizes a (token, kv head) row once and serves all q heads of the
// GQA group from it, accumulating in f32.
//
// Bad page ids: a page id outside [0, num_blocks) inside a sequence's
// attended range is never dereferenced. The work items that cover it write
// NaN instead (the single pass: every q head's output; split-K: the split's
// record, o = m = l = NaN, which the reduce turns into a NaN output). Every
// kv head sees the same pages, so the whole sequence's output (all heads)
// becomes NaN and no other sequence is affected; for a run, the pages of
// every row's range count (the whole run is NaN). The CUDA backend does the
// same. Block-table entries outside the attended range are never read.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/attend.hpp"
#include "cpu/reduce.hpp"
#include "cpu/thread_pool.hpp"
#include "host/validate.hpp"
#include "metrale/cpu.hpp"
#include "metrale/error.hpp"
#include "metrale/softmax_state.hpp"

namespace metrale::cpu {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The sink logit of q head h (-inf: none).
float sink_of(const AttnArgs& a, int64_t h) {
  return a.sinks ? a.sinks[h] : -std::numeric_limits<float>::infinity();
}

void attn_single(const AttnArgs& a) {
  const detail::DecodeContext c(a);
  const int64_t items = int64_t(a.num_seqs) * c.num_kv_heads;
  detail::parallel_for(items, 1, [&](int64_t begin, int64_t end) {
    detail::GroupState st;
    for (int64_t item = begin; item < end; ++item) {
      const int32_t seq = int32_t(item / c.num_kv_heads), kvh = int32_t(item % c.num_kv_heads);
      const bool valid = detail::pages_valid(c, seq, c.run_pages(seq));
      const int32_t n = c.run_len(seq);
      for (int32_t j = 0; j < n; ++j) {
        const int64_t row = c.first_row(seq) + j;
        const auto r = c.query(seq, j);
        detail::load_group(c, int32_t(row), kvh, st);
        if (valid) detail::attend_pages(c, seq, kvh, r.pages, r.pos_begin, r.pos_end, st);
        for (int32_t g = 0; g < c.group; ++g) {
          const int64_t h = int64_t(kvh) * c.group + g;
          bf16* o = a.out + (row * a.num_q_heads + h) * c.head_dim;
          const float* acc = &st.acc[size_t(g) * c.head_dim];
          softmax::Merge<> mg;
          mg.M = st.m[g];
          mg.nan = !valid || st.nan[g];
          mg.sink = sink_of(a, h);
          if (a.lse) a.lse[row * a.num_q_heads + h] = mg.lse(st.l[g]);
          if (mg.nan) {
            for (int32_t d = 0; d < c.head_dim; ++d) o[d] = codec::float_to_bf16(kNaN);
          } else if (mg.M == -std::numeric_limits<float>::infinity()) {  // nothing attended (seq_len 0)
            for (int32_t d = 0; d < c.head_dim; ++d) o[d] = bf16{0};
          } else {
            const float s = c.v_out_scale / mg.denominator(st.l[g]);
            for (int32_t d = 0; d < c.head_dim; ++d) o[d] = codec::float_to_bf16(acc[d] * s);
          }
        }
      }
    }
  });
}

// Split s of a run covers split_pages(run_pages, s, num_splits): the same
// cut for every row of the run (each row masks its own range).
void attn_splitk(const AttnArgs& a, int32_t num_splits, float* ws) {
  const detail::DecodeContext c(a);
  const int64_t rec = softmax::record_floats(c.head_dim);
  const int64_t items = int64_t(a.num_seqs) * c.num_kv_heads * num_splits;
  detail::parallel_for(items, 1, [&](int64_t begin, int64_t end) {
    detail::GroupState st;
    for (int64_t item = begin; item < end; ++item) {
      const int32_t split = int32_t(item % num_splits);
      const int64_t sk = item / num_splits;
      const int32_t seq = int32_t(sk / c.num_kv_heads), kvh = int32_t(sk % c.num_kv_heads);
      const PageRange pages = split_pages(c.run_pages(seq), split, num_splits);
      const bool valid = detail::pages_valid(c, seq, pages);
      const int32_t n = c.run_len(seq);
      for (int32_t j = 0; j < n; ++j) {
        const int64_t row = c.first_row(seq) + j;
        const auto r = c.query(seq, j);
        detail::load_group(c, int32_t(row), kvh, st);
        if (valid) detail::attend_pages(c, seq, kvh, pages, r.pos_begin, r.pos_end, st);
        for (int32_t g = 0; g < c.group; ++g) {
          const int64_t h = int64_t(kvh) * c.group + g;
          float* o = ws + softmax::record_index(row * a.num_q_heads + h, num_splits, split) * rec;
          const float* acc = &st.acc[size_t(g) * c.head_dim];
          const softmax::State<> state{st.m[g], st.l[g]};
          if (!valid || st.nan[g]) {
            std::fill(o, o + c.head_dim, kNaN);
            softmax::store_state(o, c.head_dim, softmax::State<>::nan());
          } else if (state.is_empty()) {
            std::fill(o, o + c.head_dim, 0.0f);
            softmax::store_state(o, c.head_dim, softmax::State<>::empty());
          } else {
            const float s = c.v_out_scale / st.l[g];
            for (int32_t d = 0; d < c.head_dim; ++d) o[d] = acc[d] * s;
            softmax::store_state(o, c.head_dim, state);
          }
        }
      }
    }
  });
}

// The plan's work over validated arguments.
void run_plan(const AttnPlan& plan, const AttnArgs& a, const SplitKWorkspace& ws) {
  if (plan.merge == SplitMerge::cluster)
    metrale::detail::throw_unsupported("plan.merge", "cluster",
                                       "single_pass, workspace or states_only on the CPU backend (plan with "
                                       "cpu::attention_target())");
  if (a.num_seqs == 0) return;
  if (plan.merge == SplitMerge::single_pass) return attn_single(a);
  attn_splitk(a, plan.num_splits, ws.data);
  if (plan.merge == SplitMerge::workspace) detail::reduce_splits(reduce_args_for(a, ws));
}

}  // namespace

AttnTarget attention_target() {
  AttnTarget t;
  t.num_sms = num_threads();
  return t;
}

void run_attention(const AttnPlan& plan, const AttnArgs& args, const SplitKWorkspace& ws) {
  metrale::detail::validate_run(plan, args, ws);  // everything, `out` included, before any work
  metrale::detail::validate_query_runs(args);
  metrale::detail::validate_kv_view(args);
  run_plan(plan, args, ws);
}

}  // namespace metrale::cpu
