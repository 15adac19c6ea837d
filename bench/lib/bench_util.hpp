// Small helpers shared by the benchmark programs and their support library
// (the CUDA check is testing/cuda_check.hpp, shared with the tests and apps).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "metrale/codec.hpp"
#include "testing/cuda_check.hpp"

namespace metrale::bench {

// "a,b,,c" -> {"a", "b", "c"}: the comma lists of the command lines.
inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

// Worst ||out - ref||_2 / ||ref||_2 over the (sequence, head) blocks of
// `head_dim` values of two bf16 outputs of `n` elements (absolute norm where
// ref is 0); a NaN anywhere gives infinity, so it never passes a bound.
inline double max_rel_l2(const bf16* out, const bf16* ref, size_t n, int32_t head_dim) {
  double worst = 0.0;
  for (size_t blk = 0; blk * size_t(head_dim) < n; ++blk) {
    double num = 0.0, den = 0.0;
    for (int32_t i = 0; i < head_dim; ++i) {
      const double x = codec::bf16_to_float(out[blk * head_dim + i]), y = codec::bf16_to_float(ref[blk * head_dim + i]);
      num += (x - y) * (x - y);
      den += y * y;
    }
    const double e = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  return worst;
}

}  // namespace metrale::bench
