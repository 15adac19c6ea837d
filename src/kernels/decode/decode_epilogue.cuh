// The decode kernel's epilogue (decode_kernel.cuh): the warps' states and
// O^T tiles merged through shared memory, then each column's output row,
// its split's record (workspace or, for the cluster merge, shared memory),
// and the runs' lse.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/decode/decode_cluster_merge.cuh"
#include "kernels/decode/decode_config.cuh"
#include "kernels/decode/decode_params.hpp"
#include "kernels/decode/decode_runs.cuh"
#include "metrale/codec.hpp"
#include "metrale/softmax_state.hpp"

namespace metrale::kernels {

// Where the merge keeps a team's O^T: [team][col][D], d XOR-swizzled per
// (col, 32-element block) (decode_merge_warps).
template <class Cfg, int D, int NT>
__device__ __forceinline__ int decode_o_index(int col, int d) {
  constexpr int kEV = Cfg::kVElemsPerVec;
  const int tcol = NT == 1 ? col : col % 8;
  return col * D + (d ^ ((tcol >> 1) + 4 * ((d >> 5) & (kEV / 4 - 1))));
}

// The thread's sums and exact maxima over its column's 8 threads, and its
// O^T tiles, reference maxima, sums and exact maxima into shared memory
// (obuf, m_buf, l_buf, mt_buf: the kernel's map). The caller's barrier
// makes them visible.
template <class Cfg, int D, int NT, int HP>
__device__ __forceinline__ void decode_merge_warps(const float (&o)[NT][Cfg::kDTiles][4], const float (&m_run)[NT][2],
                                                   float (&m_true)[NT][2], float (&l_part)[NT][2], float* obuf,
                                                   float* m_buf, float* l_buf, float* mt_buf, int team, int part,
                                                   int g, int c) {
  constexpr int kCols = Cfg::kCols;
  // ---- merge the warps' states ----
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int x = 4; x < 32; x *= 2) {
        l_part[n][j] += __shfl_xor_sync(0xffffffffu, l_part[n][j], x);
        m_true[n][j] = fmaxf(m_true[n][j], __shfl_xor_sync(0xffffffffu, m_true[n][j], x));
      }
    }
  // The warps' O^T tiles go through shared memory as [warp][col][D], d
  // XOR-swizzled per (col, 32-element block): t = c + 4 * (g's bits above
  // those that select a bank) flips only bits inside a thread's vector, so
  // both the fragment stores (lanes g, c) and the row reads below (32
  // consecutive d) are free of bank conflicts (the plain layout put up to 8
  // lanes of a store on one bank).
  // Column tiles swizzle alike (each n-tile's stores are instructions of their own).
  // Teams of two: [team][col][D], each warp its part of d; the state once.
  constexpr int kEV = Cfg::kVElemsPerVec;
  auto o_index = [](int col, int d) { return decode_o_index<Cfg, D, NT>(col, d); };
  float* my_o = obuf + team * kCols * D;
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int m = 0; m < Cfg::kDTiles; ++m) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int e = 2 * m + r / 2, col = 8 * n + 2 * c + r % 2;
        my_o[o_index(col, part * Cfg::kPartD + ((e / kEV) * 8 + g) * kEV + e % kEV)] = o[n][m][r];
      }
    }
  if (g == 0 && part == 0) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        m_buf[team * kCols + 8 * n + 2 * c + j] = m_run[n][j];
        l_buf[team * kCols + 8 * n + 2 * c + j] = l_part[n][j];
        mt_buf[team * kCols + 8 * n + 2 * c + j] = m_true[n][j];
      }
  }
}

// The cluster merge of split-K (p.cluster_merge): the records in my_rec,
// merged with the other CTAs' of the cluster into the output.
template <class Cfg, bool kRuns>
__device__ __forceinline__ void decode_cluster_merge(const KernelParams<kRuns>& p, const RunColumns& rc,
                                                     float* my_rec, int cols, int64_t seq, int head0) {
  constexpr int kHD = Cfg::kHeadDim;
  {
    if constexpr (kRuns) {
      const int32_t num_q_heads = p.num_q_heads;
      cluster_merge_records<kHD, true>(p, my_rec, cols, [rc, num_q_heads](int col) {
        return ColumnRow{int64_t(rc.row(col)) * num_q_heads + rc.head(col), rc.head(col)};
      });
    } else {
      const int64_t row0 = seq * p.num_q_heads + head0;  // the tile's first output row
      cluster_merge_records<kHD, false>(p, my_rec, cols, [row0, head0](int col) {
        return ColumnRow{row0 + col, head0 + col};
      });
    }
  }
}

}  // namespace metrale::kernels
