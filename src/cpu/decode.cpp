// Paged decode attention on the CPU: single pass, split-K partial states
// (SYSTEM.md 4) and run_decode. Work items are (sequence, kv head[, split]);
// each dequantizes a (token, kv head) row once and serves all q heads of the
// GQA group from it, accumulating in f32.
//
// Bad page ids: a page id outside [0, num_blocks) inside a sequence's
// attended range is never dereferenced. The work items that cover it write
// NaN instead (the single pass: every q head's output; split-K: the split's
// record, o = m = l = NaN, which the reduce turns into a NaN output). Every
// kv head sees the same pages, so the whole sequence's output (all heads)
// becomes NaN and no other sequence is affected. The CUDA backend does the
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

void decode_single(const DecodeArgs& a) {
  const detail::DecodeContext c(a);
  const int64_t items = int64_t(a.num_seqs) * c.num_kv_heads;
  detail::parallel_for(items, 1, [&](int64_t begin, int64_t end) {
    detail::GroupState st;
    for (int64_t item = begin; item < end; ++item) {
      const int32_t seq = int32_t(item / c.num_kv_heads), kvh = int32_t(item % c.num_kv_heads);
      const auto r = c.seq_range(seq);
      detail::load_group(c, seq, kvh, st);
      const bool valid = detail::pages_valid(c, seq, r.pages);
      if (valid) detail::attend_pages(c, seq, kvh, r.pages, r.pos_begin, r.pos_end, st);
      bf16* out = a.out + (int64_t(seq) * a.num_q_heads + int64_t(kvh) * c.group) * c.head_dim;
      for (int32_t g = 0; g < c.group; ++g) {
        bf16* o = out + int64_t(g) * c.head_dim;
        const float* acc = &st.acc[size_t(g) * c.head_dim];
        if (!valid || st.nan[g]) {
          for (int32_t d = 0; d < c.head_dim; ++d) o[d] = codec::float_to_bf16(kNaN);
        } else if (softmax::State<>{st.m[g], st.l[g]}.is_empty()) {  // nothing attended (seq_len 0)
          for (int32_t d = 0; d < c.head_dim; ++d) o[d] = bf16{0};
        } else {
          const float s = c.v_out_scale / st.l[g];
          for (int32_t d = 0; d < c.head_dim; ++d) o[d] = codec::float_to_bf16(acc[d] * s);
        }
      }
    }
  });
}

void decode_splitk(const DecodeArgs& a, int32_t num_splits, float* ws) {
  const detail::DecodeContext c(a);
  const int64_t rec = softmax::record_floats(c.head_dim);
  const int64_t items = int64_t(a.num_seqs) * c.num_kv_heads * num_splits;
  detail::parallel_for(items, 1, [&](int64_t begin, int64_t end) {
    detail::GroupState st;
    for (int64_t item = begin; item < end; ++item) {
      const int32_t split = int32_t(item % num_splits);
      const int64_t sk = item / num_splits;
      const int32_t seq = int32_t(sk / c.num_kv_heads), kvh = int32_t(sk % c.num_kv_heads);
      const auto r = c.seq_range(seq);
      const PageRange pages = split_pages(r.pages, split, num_splits);
      detail::load_group(c, seq, kvh, st);
      const bool valid = detail::pages_valid(c, seq, pages);
      if (valid) detail::attend_pages(c, seq, kvh, pages, r.pos_begin, r.pos_end, st);
      for (int32_t g = 0; g < c.group; ++g) {
        const int64_t h = int64_t(kvh) * c.group + g;
        float* o = ws + softmax::record_index(int64_t(seq) * a.num_q_heads + h, num_splits, split) * rec;
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
  });
}

}  // namespace

DecodeTarget decode_target() {
  DecodeTarget t;
  t.num_sms = num_threads();
  return t;
}

void paged_decode_attn(const DecodeArgs& args) {
  metrale::detail::validate_decode(args);
  if (args.num_seqs == 0) return;
  decode_single(args);
}

void paged_decode_attn_splitk(const DecodeArgs& args, const SplitKWorkspace& ws) {
  metrale::detail::validate_decode(args, /*writes_out=*/false);
  metrale::detail::validate_workspace(args, ws);
  if (args.num_seqs == 0) return;
  decode_splitk(args, ws.num_splits, ws.data);
}

void run_decode(const DecodePlan& plan, const DecodeArgs& args, const SplitKWorkspace& ws) {
  metrale::detail::validate_run(plan, args, ws);  // everything, `out` included, before any work
  if (plan.merge == DecodeMerge::cluster)
    metrale::detail::throw_unsupported("plan.merge", "cluster",
                                       "single_pass or workspace on the CPU backend (plan with cpu::decode_target())");
  if (args.num_seqs == 0) return;
  if (plan.merge == DecodeMerge::single_pass) return decode_single(args);
  decode_splitk(args, plan.num_splits, ws.data);
  detail::reduce_splits(reduce_args_for(args, ws));
}

}  // namespace metrale::cpu
