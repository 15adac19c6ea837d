// paged_decode_attn_reduce on the CPU: merges split-K partial states
// (SYSTEM.md 4) into the bf16 output; format-independent.
//   M = max m_i, w_i = l_i * exp(m_i - M), out = sum(w_i o_i) / sum(w_i).
// All splits empty (m = -inf everywhere) -> 0. A NaN m or l (a split that saw
// a NaN logit or a bad page) -> NaN; a NaN inside o reaches the output
// through the weighted sum.
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/thread_pool.hpp"
#include "host/validate.hpp"
#include "metrale/cpu.hpp"

namespace metrale::cpu {

void paged_decode_attn_reduce(const ReduceArgs& a) {
  metrale::detail::validate_reduce(a);
  if (a.num_seqs == 0) return;
  const int32_t D = a.head_dim, S = a.num_splits;
  const int64_t rec = D + 2;
  const int64_t items = int64_t(a.num_seqs) * a.num_q_heads;
  detail::parallel_for(items, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(D);
    for (int64_t item = begin; item < end; ++item) {
      const float* r = a.workspace + item * S * rec;
      bf16* out = a.out + item * D;
      float M = -std::numeric_limits<float>::infinity();
      bool nan = false;
      for (int32_t s = 0; s < S; ++s) {
        const float m = r[s * rec + D], l = r[s * rec + D + 1];
        nan |= std::isnan(m) || std::isnan(l);
        M = m > M ? m : M;
      }
      if (nan) {
        for (int32_t d = 0; d < D; ++d) out[d] = codec::float_to_bf16(std::numeric_limits<float>::quiet_NaN());
        continue;
      }
      if (M == -std::numeric_limits<float>::infinity()) {  // every split empty
        for (int32_t d = 0; d < D; ++d) out[d] = bf16{0};
        continue;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      float wsum = 0.0f;
      for (int32_t s = 0; s < S; ++s) {
        const float* o = r + s * rec;
        const float m = o[D], l = o[D + 1];
        if (m == -std::numeric_limits<float>::infinity()) continue;  // empty split: weight 0
        const float w = l * std::exp(m - M);
        wsum += w;
        for (int32_t d = 0; d < D; ++d) acc[d] += w * o[d];
      }
      const float inv = 1.0f / wsum;
      for (int32_t d = 0; d < D; ++d) out[d] = codec::float_to_bf16(acc[d] * inv);
    }
  });
}

}  // namespace metrale::cpu
