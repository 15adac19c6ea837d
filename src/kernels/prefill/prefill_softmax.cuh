// The prefill consumer's online softmax over one tile of S = Q K^T, in
// registers: soft-cap or scale, the causal / window mask where the tile
// crosses an edge of the warpgroup's rows' ranges, the running maxima and
// sums (log2 units), and P as the A fragments of O += P V.
//
// A thread holds two rows of the warpgroup's 64, r and r + 8, and of each
// 8-column block of S columns 2 quad, 2 quad + 1: sacc[4j + 2i + c] is row
// i, column 8j + 2 quad + c.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/mma.cuh"
#include "kernels/decode/decode_runs.cuh"
#include "kernels/prefill/prefill_params.hpp"
#include "metrale/ops.hpp"

namespace metrale::kernels {

// The state lives in the kernel's registers; the softmax refers to it.
template <int kN, class Op>
struct PrefillSoftmax {
  static constexpr int kSAccs = kN / 2;

  float (&m_run)[2];                 // the rows' running maxima (log2 units)
  float (&l_run)[2];                 // and the thread's share of their sums
  const QueryRange& wg_first_range;  // positions the warpgroup's first row attends
  const QueryRange& wg_last_range;   // and its last row
  const QueryRange (&my_range)[2];   // and the thread's two rows
  int quad;
  int32_t p_begin;                   // the first position of the CTA's first tile

  // S of tile t becomes P in f32 in place, m and l are updated, f = the
  // factor O must take before P joins it.
  __device__ void tile(const PrefillParams& p, float (&sacc)[kSAccs], int t, float (&f)[2]) const {
    const int32_t p0 = p_begin + t * kN;
    const float kNegInf = -__int_as_float(0x7f800000);
    // Logits in log2 units are sacc * sc: without soft-cap (and a positive
    // scale, as always in practice) the scale folds into the exponent's FFMA.
    float sc = p.qk_log2_scale;
    if (p.softcap_log2 > 0.0f) {
#pragma unroll
      for (int e = 0; e < kSAccs; ++e) sacc[e] = p.softcap_log2 * fast_tanh(sacc[e] * p.softcap_scale);
      sc = 1.0f;
    } else if (!(sc > 0.0f)) {
#pragma unroll
      for (int e = 0; e < kSAccs; ++e) sacc[e] *= sc;
      sc = 1.0f;
    }
    if (p0 + kN > wg_first_range.end || p0 < wg_last_range.begin) {
#pragma unroll
      for (int e = 0; e < kSAccs; ++e) {
        const int i = (e / 2) % 2;
        const int32_t pos = p0 + 8 * (e / 4) + 2 * quad + e % 2;
        if (pos < my_range[i].begin || pos >= my_range[i].end) sacc[e] = kNegInf;
      }
    }
    float ref[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = kNegInf;
#pragma unroll
      for (int j = 0; j < kN / 8; ++j) mx = fmaxf(mx, fmaxf(sacc[4 * j + 2 * i], sacc[4 * j + 2 * i + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[i], mx * sc);
      f[i] = m_new == kNegInf ? 1.0f : fast_exp2(m_run[i] - m_new);
      ref[i] = m_new == kNegInf ? 0.0f : m_new;
      m_run[i] = m_new;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int e = 0; e < kSAccs; ++e) {
      const int i = (e / 2) % 2;
      sacc[e] = fast_exp2(fmaf(sacc[e], sc, -ref[i]));
      sum[i] += sacc[e];
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) l_run[i] = l_run[i] * f[i] + sum[i];
  }

  // P (f32, in S's accumulator layout) as PV's A fragments: k-step j/2 holds
  // (row, k 2q..) (row+8, k 2q..) (row, k 2q+8..) (row+8, k 2q+8..).
  __device__ static void to_fragments(const float (&sacc)[kSAccs], uint32_t (&pa)[kN / 16][4]) {
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
      pa[j / 2][2 * (j % 2)] = pack2<Op>(sacc[4 * j], sacc[4 * j + 1]);
      pa[j / 2][2 * (j % 2) + 1] = pack2<Op>(sacc[4 * j + 2], sacc[4 * j + 3]);
    }
  }
};

}  // namespace metrale::kernels
