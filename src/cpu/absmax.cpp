// bf16_absmax on the CPU: max |x| over strided rows, NaNs ignored, folded
// into *absmax with max (the FP8 / NVFP4 calibration, docs/spec.md 1).
#include <algorithm>
#include <mutex>

#include "cpu/thread_pool.hpp"
#include "host/validate.hpp"
#include "metrale/cpu.hpp"

namespace metrale::cpu {

void bf16_absmax(const bf16* x, int64_t num_rows, int64_t row_len, int64_t row_stride, float* absmax) {
  metrale::detail::validate_absmax(x, num_rows, row_len, row_stride, absmax);
  if (num_rows == 0 || row_len == 0) return;
  // Work on the magnitude bits: |x| orders like its bit pattern, a NaN is any
  // pattern above 0x7f80 and is skipped, +-inf counts as inf.
  std::mutex mu;
  uint16_t best = 0;
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(row_len, 1));
  detail::parallel_for(num_rows, grain, [&](int64_t begin, int64_t end) {
    uint16_t m = 0;
    for (int64_t r = begin; r < end; ++r) {
      const bf16* row = x + r * row_stride;
      for (int64_t i = 0; i < row_len; ++i) {
        const uint16_t a = row[i].bits & 0x7fffu;
        m = (a <= 0x7f80u && a > m) ? a : m;
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    best = std::max(best, m);
  });
  const float r = codec::bf16_to_float(bf16{best});
  if (r > *absmax) *absmax = r;
}

}  // namespace metrale::cpu
