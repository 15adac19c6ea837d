// reduce_states on the CPU: merges split-K partial states into
// the bf16 output by softmax_state.hpp's rule, in split order; format-
// independent. A NaN inside o reaches the output through the weighted sum.
#include <algorithm>
#include <vector>

#include "cpu/reduce.hpp"
#include "cpu/thread_pool.hpp"
#include "host/validate.hpp"
#include "metrale/cpu.hpp"
#include "metrale/softmax_state.hpp"

namespace metrale::cpu {

void detail::reduce_splits(const ReduceArgs& a) {
  if (a.num_seqs == 0) return;
  const int32_t D = a.head_dim, S = a.num_splits;
  const int64_t rec = softmax::record_floats(D);
  const int64_t items = int64_t(a.num_seqs) * a.num_q_heads;
  detail::parallel_for(items, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(D);
    for (int64_t item = begin; item < end; ++item) {
      const float* r = a.workspace + softmax::record_index(item, S, 0) * rec;
      bf16* out = a.out + item * D;
      softmax::Merge<> mg;
      if (a.sinks) mg.sink = a.sinks[item % a.num_q_heads];
      for (int32_t s = 0; s < S; ++s) mg.see(softmax::load_state(r + s * rec, D));
      if (!mg.sums()) {  // NaN, or every split empty: no sums
        std::fill(out, out + D, codec::float_to_bf16(mg.finalize(0.0f, 0.0f)));
        if (a.lse) a.lse[item] = mg.lse(0.0f);
        continue;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      float wsum = 0.0f;
      for (int32_t s = 0; s < S; ++s) {
        const float* o = r + s * rec;
        const softmax::State<> st = softmax::load_state(o, D);
        if (st.is_empty()) continue;
        const float w = st.weight(mg.M);
        wsum += w;
        for (int32_t d = 0; d < D; ++d) acc[d] += w * o[d];
      }
      // One reciprocal per row (the CUDA reduce divides each element): the
      // CPU backend's results are pinned bit for bit by its tests.
      const float inv = 1.0f / mg.denominator(wsum);
      if (a.lse) a.lse[item] = mg.lse(wsum);
      for (int32_t d = 0; d < D; ++d) out[d] = codec::float_to_bf16(acc[d] * inv);
    }
  });
}

void reduce_states(const ReduceArgs& args) {
  metrale::detail::validate_reduce(args);
  detail::reduce_splits(args);
}

}  // namespace metrale::cpu
