// The prefill consumer's setup: its warpgroup's 64 rows of Q into shared
// memory.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/mma.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/formats/format_policy.cuh"
#include "kernels/prefill/prefill_params.hpp"

namespace metrale::kernels {

// Consumer cw's 64 rows of Q (zeros outside the run) in the MMA's type, in
// the K tiles' unit order (Fmt::prefill_unit_elem), all loads in flight at
// once, while the producer fills the first stages. ct: the thread in its
// warpgroup; row_lo: the tile's first packed row.
template <class Fmt, class Cfg>
__device__ __forceinline__ void prefill_load_q(const PrefillParams& p, int32_t row_lo, int32_t row0, int32_t group,
                                               int kv_head, int cw, int ct, uint8_t* smem,
                                               uint4 (&v)[Cfg::kHeadDim / 16]) {
  using Op = typename Cfg::Op;
  constexpr int D = Cfg::kHeadDim, kM = Cfg::kRows;
  constexpr int kUnits = D / 8, kPerThread = 64 * kUnits / 128;
  static_assert(kPerThread == D / 16);
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int idx = ct + 128 * k, r = cw * 64 + idx / kUnits, u = idx % kUnits;
    const int32_t pr = row_lo + r;
    v[k] = make_uint4(0, 0, 0, 0);
    if (pr >= 0)
      v[k] = __ldg(reinterpret_cast<const uint4*>(p.q + int64_t(row0 + pr / group) * p.q_stride +
                                                  int64_t(kv_head * group + pr % group) * p.q_head_stride + u * 8));
  }
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int idx = ct + 128 * k, r = cw * 64 + idx / kUnits, u = idx % kUnits;
    if constexpr (!std::is_same_v<Op, Bf16Op>) {
      float x[8];
      unpack8(v[k], x);
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) w[j] = pack2<Op>(x[Fmt::prefill_unit_elem(2 * j)], x[Fmt::prefill_unit_elem(2 * j + 1)]);
      v[k] = make_uint4(w[0], w[1], w[2], w[3]);
    }
    *reinterpret_cast<uint4*>(smem + wg::swizzle_offset(kM, r, u)) = v[k];
  }
  wg::fence_proxy_async();
}

}  // namespace metrale::kernels
