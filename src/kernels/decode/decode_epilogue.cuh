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

// Column col's teams' states against their reference maxima (ws), their
// merge (mg: the maximum) and the exact max MT.
template <class Cfg>
__device__ __forceinline__ void decode_team_states(const float* m_buf, const float* l_buf, const float* mt_buf, int col,
                                                   softmax::State<softmax::Log2> (&ws)[Cfg::kTeams],
                                                   softmax::Merge<softmax::Log2>& mg, float& MT) {
  constexpr int kT = Cfg::kTeams, kCols = Cfg::kCols;
#pragma unroll
  for (int w = 0; w < kT; ++w) {
    ws[w] = {m_buf[w * kCols + col], l_buf[w * kCols + col]};
    mg.see_max(ws[w]);  // a NaN logit's l spreads through the sums below
    MT = fmaxf(MT, mt_buf[w * kCols + col]);
  }
}

// wt[w] scales team w's O^T to the merged state, normalised; returns L, the
// sum of the weights.
template <class Cfg>
__device__ __forceinline__ float decode_team_weights(const softmax::State<softmax::Log2> (&ws)[Cfg::kTeams],
                                                     const softmax::Merge<softmax::Log2>& mg, float (&wt)[Cfg::kTeams]) {
  constexpr int kT = Cfg::kTeams;
#pragma unroll
  for (int w = 0; w < kT; ++w) wt[w] = ws[w].scale(mg.M);
  static_assert(kT == 4 || kT == 2, "the sum of L below");
  float L = ws[0].l * wt[0] + ws[1].l * wt[1];
  if constexpr (kT == 4) L += ws[2].l * wt[2] + ws[3].l * wt[3];
#pragma unroll
  // L = 0: nothing attended, output 0. A NaN L (some team's l) makes every
  // weight NaN, also where no team attended a finite logit (M = -inf).
  for (int w = 0; w < kT; ++w) wt[w] = L == 0.0f ? 0.0f : wt[w] / mg.denominator(L);
  return L;
}

// Column col's outputs (its head's half of the tile's D from d0) as the
// teams' O^T weighted by wt: into its output row, or into rec (the split's
// record) with its state; the runs' single pass also writes lse.
template <class Cfg, int D, int NT, bool kRuns>
__device__ __forceinline__ void decode_store_column(const KernelParams<kRuns>& p, const float* obuf, int col, int d0,
                                                    const float (&wt)[Cfg::kTeams],
                                                    const softmax::Merge<softmax::Log2>& mg, float L, float MT,
                                                    float* rec, int64_t out_row, int lane) {
  constexpr int kT = Cfg::kTeams, kCols = Cfg::kCols, kHD = Cfg::kHeadDim;
  const float qnan = __int_as_float(0x7fc00000);
#pragma unroll
  for (int i = 0; i < kHD / 32; ++i) {
    const int d = lane + 32 * i;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kT; ++w) v += obuf[w * kCols * D + decode_o_index<Cfg, D, NT>(col, d0 + d)] * wt[w];
    v = mg.nan ? qnan : v * p.v_factor;
    if (rec == nullptr) {
      p.out[out_row * kHD + d] = codec::float_to_bf16(v);
    } else {
      rec[d] = v;
    }
  }
  if (rec != nullptr && lane == 0) softmax::store_state(rec, kHD, softmax::to_record(mg.merged(L), MT));
  if constexpr (kRuns) {
    if (rec == nullptr && p.lse != nullptr && lane == 0) {  // the single pass's lse (split-K: the merge's)
      const softmax::State<> st = softmax::to_record(mg.merged(L), MT);
      softmax::Merge<> ln;
      ln.M = st.m;
      ln.nan = st.is_nan();
      p.lse[out_row] = ln.lse(st.l);
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
