// The decode kernel's mainloop (decode_kernel.cuh): attention over one
// group of U 16-token steps a load pipeline delivers (StepBuffers):
//   S^T = K Q^T      scores(), per step: the K fragments dequantised once for
//                    the NT n-tiles, two MMA chains where registers allow,
//                    teams of two warps summing their halves of head_dim
//   logits           logits(): scaled or soft-capped, masked to the columns'
//                    ranges
//   online softmax   softmax(), once per group: the reference max raised
//                    only past kRescaleThreshold, O^T rescaled then
//   O^T += V^T P^T   mask_v() where a step is not wholly attended, then
//                    pv(), per step: P^T's B fragments (movmatrix), V
//                    dequantised once for the NT n-tiles
// The state (Q^T fragments, O^T, maxima, sums) is the kernel's registers;
// DecodeStep refers to it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/mma.cuh"
#include "kernels/decode/decode_config.cuh"
#include "kernels/decode/decode_params.hpp"
#include "kernels/decode/decode_runs.cuh"

namespace metrale::kernels {

// The state before the first step: O^T zero, no maximum, no sum.
template <int NT, int kDTiles>
__device__ __forceinline__ void decode_empty_state(float (&o)[NT][kDTiles][4], float (&m_run)[NT][2],
                                                   float (&m_true)[NT][2], float (&l_part)[NT][2]) {
  const float kNegInf = -__int_as_float(0x7f800000);
#pragma unroll
  for (int n = 0; n < NT; ++n) {
#pragma unroll
    for (int m = 0; m < kDTiles; ++m) o[n][m][0] = o[n][m][1] = o[n][m][2] = o[n][m][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      m_run[n][j] = kNegInf;   // reference max of columns 8n + 2c + j (log2 units)
      m_true[n][j] = kNegInf;  // this thread's exact max
      l_part[n][j] = 0.0f;     // this thread's share of sum exp2(x - m_run)
    }
  }
}

// Runs: the ranges the thread's columns 8n + 2c, 8n + 2c + 1 of n-tile n
// attend (those past the CTA's cols keep theirs).
template <int NT>
__device__ __forceinline__ void decode_column_ranges(const RunColumns& rc, int cols, int c, int32_t (&col_begin)[NT][2],
                                                     int32_t (&col_end)[NT][2]) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (8 * n + 2 * c + j < cols) {
        const QueryRange r = rc.range(8 * n + 2 * c + j);
        col_begin[n][j] = r.begin;
        col_end[n][j] = r.end;
      }
    }
}

template <class Fmt, class Cfg, int D, bool kPair, bool kRuns, int NT, int HP>
struct DecodeStep {
  using Op = typename Fmt::Op;
  static constexpr int U = Cfg::kUnroll;

  const KernelParams<kRuns>& p;
  const uint32_t (&qf)[NT][Cfg::kKSteps][2];  // Q^T as B fragments of the QK k-steps
  float (&o)[NT][Cfg::kDTiles][4];             // O^T tiles
  float (&m_run)[NT][2];                       // reference max of columns 8n + 2c + j (log2 units)
  float (&m_true)[NT][2];                      // this thread's exact max
  float (&l_part)[NT][2];                      // this thread's share of sum exp2(x - m_run)
  const int32_t (&col_begin)[NT][2];           // runs: the thread's columns' ranges
  const int32_t (&col_end)[NT][2];
  float4* const& s_exchange;                   // teams of two: the partial S exchange
  int& s_parity;
  const int& cols;
  const int32_t& split_pos0;                   // position of step 0
  const int32_t& first_pos;                    // decode: [first_pos, seq_len) attended
  const int32_t& seq_len;
  const int32_t& span_begin;                   // positions any column attends
  const int32_t& span_end;
  const int32_t& inner_begin;                  // runs: positions every column attends
  const int32_t& inner_end;
  const bool& odd_tokens_swapped;
  int g, c, lane, part;

  // Two MMA chains per n-tile where registers allow (head_dim 256 has none
  // to spare; with parts of head_dim, its two n-tiles are two chains of the
  // half's 8 k-steps).
  static constexpr bool kTwoChains = HP == 1 && D <= 128;

  // s[n] = S^T rows (tokens g, g+8) x columns 8n + (2c, 2c+1) of step u,
  // summed in two independent MMA chains (even / odd k-steps, s and s_odd,
  // zero on entry) where registers allow: a chain of dependent MMAs pays
  // the full MMA latency per link. Paired heads: the chains are the two
  // heads' k-steps, and each column takes its own head's (rows g, g+8 of
  // odd g hold the second head in the first chain where kSwapOddTokens:
  // both chains see the same q, as every column carries its q in both
  // halves). Each K fragment is dequantised once for the NT n-tiles.
  __device__ __forceinline__ void scores(StepBuffers<Cfg>& b, int u, float (&s)[NT][4], float (&s_odd)[NT][4]) const {
    // K group scales as f16x2 pairs: ksc[t][j] = groups (2j, 2j+1) of the
    // thread's scale bytes of token g + 8t; k-step kk takes group kk/4.
    uint32_t ksc[2][2] = {};
    if constexpr (Fmt::kScaled) {
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int j = 0; 2 * j < Cfg::kKScaleBytes; ++j) ksc[t][j] = Fmt::scale_pair(b.ks[u][t] >> (16 * j));
    }
#pragma unroll
    for (int kk = 0; kk < Cfg::kKSteps; ++kk) {
      uint32_t a[4];
      uint32_t ks0 = 0, ks1 = 0;
      if constexpr (Fmt::kScaled) {
        constexpr int kGroupSteps = Fmt::kGroupSize / 4;  // k-steps per scale group
        ks0 = f16x2_broadcast(ksc[0][kk / (2 * kGroupSteps)], (kk / kGroupSteps) % 2);
        ks1 = f16x2_broadcast(ksc[1][kk / (2 * kGroupSteps)], (kk / kGroupSteps) % 2);
      }
      Fmt::k_pair(b.kw[u][0], kk, ks0, a[0], a[2]);
      Fmt::k_pair(b.kw[u][1], kk, ks1, a[1], a[3]);
      // Two chains per n-tile: with one per n-tile, two n-tiles ran a
      // chain of 8 dependent MMAs per step (the wait for it the largest
      // stall).
      const bool odd_chain = kPair ? kk >= Cfg::kKSteps / 2 : kk % 2 && kTwoChains;
#pragma unroll
      for (int n = 0; n < NT; ++n) mma_16816<Op>(odd_chain ? s_odd[n] : s[n], a, qf[n][kk][0], qf[n][kk][1]);
    }
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        if constexpr (kPair)
          s[n][r] = (2 * c + r % 2 >= cols / 2) != odd_tokens_swapped ? s_odd[n][r] : s[n][r];  // the column's head
        else if constexpr (kTwoChains)
          s[n][r] += s_odd[n][r];
      }
    if constexpr (HP == 2) {
      // S over the whole head_dim: this warp's half plus its teammate's,
      // the same sum in both (addition commutes), so both keep the same
      // softmax state and weights.
      float4* const xs = s_exchange + s_parity * HP * NT * 32;
#pragma unroll
      for (int n = 0; n < NT; ++n) xs[(part * NT + n) * 32 + lane] = make_float4(s[n][0], s[n][1], s[n][2], s[n][3]);
      __syncthreads();
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const float4 t = xs[((1 - part) * NT + n) * 32 + lane];
        s[n][0] += t.x, s[n][1] += t.y, s[n][2] += t.z, s[n][3] += t.w;
      }
      s_parity ^= 1;
    }
  }

  // The online softmax of the group's logits x (U steps): the reference
  // max is raised, and O^T rescaled, once per group (not per step), where
  // some logit passes it by the threshold; the exact max follows every
  // logit. One such test per group halves the tests and votes, and leaves
  // the steps' QK and PV free of branches between them, so the compiler
  // interleaves the steps' conversions and MMAs.
  __device__ __forceinline__ void softmax(const float (&x)[U][NT][4]) const {
    const float kNegInf = -__int_as_float(0x7f800000);
    float mx[NT][2];
    bool raise = false;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        mx[n][j] = fmaxf(x[0][n][j], x[0][n][j + 2]);
#pragma unroll
        for (int u = 1; u < U; ++u) mx[n][j] = fmaxf(mx[n][j], fmaxf(x[u][n][j], x[u][n][j + 2]));
        m_true[n][j] = fmaxf(m_true[n][j], mx[n][j]);
        // The reference max is shared by the 8 threads of a column (same c).
        raise = raise || mx[n][j] > m_run[n][j] + Cfg::kRescaleThreshold;
      }
    }
    if (__any_sync(0xffffffffu, raise)) {
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        float f[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          mx[n][j] = fmaxf(mx[n][j], __shfl_xor_sync(0xffffffffu, mx[n][j], 4));
          mx[n][j] = fmaxf(mx[n][j], __shfl_xor_sync(0xffffffffu, mx[n][j], 8));
          mx[n][j] = fmaxf(mx[n][j], __shfl_xor_sync(0xffffffffu, mx[n][j], 16));
          const float m_new = fmaxf(m_run[n][j], mx[n][j]);
          f[j] = m_new == kNegInf ? 1.0f : fast_exp2(m_run[n][j] - m_new);
          m_run[n][j] = m_new;
          l_part[n][j] *= f[j];
        }
#pragma unroll
        for (int m = 0; m < Cfg::kDTiles; ++m) {
          o[n][m][0] *= f[0], o[n][m][1] *= f[1];
          o[n][m][2] *= f[0], o[n][m][3] *= f[1];
        }
      }
    }
  }

  // Unattended slots of step u hold whatever the cache held (possibly NaN
  // codes): a zero weight times NaN is NaN, so their V operands are zeroed.
  __device__ __forceinline__ void mask_v(StepBuffers<Cfg>& b, int u, int32_t pos0, bool live) const {
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      const int32_t pos = pos0 + 2 * c + Cfg::vtok(t);
      const bool ok = live && pos >= span_begin && pos < span_end;
#pragma unroll
      for (int w = 0; w < Cfg::kVWords; ++w) b.vw[u][t][w] = ok ? b.vw[u][t][w] : 0u;
      if constexpr (Fmt::kScaled) b.vs[u][t] = ok ? b.vs[u][t] : 0u;
    }
  }

  // P^T of step u's logits x into l and O^T += V^T P^T.
  __device__ __forceinline__ void pv(StepBuffers<Cfg>& b, int u, const float (&x)[NT][4]) const {
    const float kNegInf = -__int_as_float(0x7f800000);
    uint32_t pb0[NT], pb1[NT];  // P^T's B fragments
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const float ref0 = m_run[n][0] == kNegInf ? 0.0f : m_run[n][0];
      const float ref1 = m_run[n][1] == kNegInf ? 0.0f : m_run[n][1];
      const float p0 = fast_exp2(x[n][0] - ref0), p1 = fast_exp2(x[n][1] - ref1);
      const float p2 = fast_exp2(x[n][2] - ref0), p3 = fast_exp2(x[n][3] - ref1);
      l_part[n][0] += p0 + p2;
      l_part[n][1] += p1 + p3;
      pb0[n] = movmatrix_trans(pack2<Op>(p0, p1));
      pb1[n] = movmatrix_trans(pack2<Op>(p2, p3));
    }
    // Two tiles at a time: elements 2m .. 2m+3 of the V eighth rows (one
    // NVFP4 scale group: groups are 8 or 16 aligned elements), each
    // dequantised once for the NT n-tiles.
#pragma unroll
    for (int m = 0; m < Cfg::kDTiles; m += 2) {
      uint32_t vs01 = 0, vs89 = 0;
      if constexpr (Fmt::kScaled) {
        // Byte i of each token's scale bytes: the group of elements 2m..2m+3.
        const uint32_t i = Cfg::kVElemsPerVec >= Fmt::kGroupSize ? (2 * m) / Fmt::kGroupSize : 0;
        vs01 = Fmt::scale_pair(byte_perm(b.vs[u][0], b.vs[u][1], i | (i + 4) << 4));
        vs89 = Fmt::scale_pair(byte_perm(b.vs[u][2], b.vs[u][3], i | (i + 4) << 4));
      }
      uint32_t lo[4], hi[4];  // (tokens 2c, 2c+1) and (2c+8, 2c+9): tiles m, m+1
      Fmt::v_quad(b.vw[u][0], b.vw[u][1], 2 * m, vs01, lo);
      Fmt::v_quad(b.vw[u][2], b.vw[u][3], 2 * m, vs89, hi);
      const uint32_t a0[4] = {lo[0], lo[1], hi[0], hi[1]}, a1[4] = {lo[2], lo[3], hi[2], hi[3]};
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        mma_16816<Op>(o[n][m], a0, pb0[n], pb1[n]);
        mma_16816<Op>(o[n][m + 1], a1, pb0[n], pb1[n]);
      }
    }
  }

  // Logits of the group's steps in log2 units (x[u][n][r]: token g + 8 (r /
  // 2) of step u, column 8n + 2c + r % 2): scaled or soft-capped, positions
  // outside the columns' ranges (decode: [first_pos, seq_len)) at -inf.
  // `full`: every step is live and wholly attended (decode needs no mask).
  __device__ __forceinline__ void logits(const StepBuffers<Cfg>& b, const float (&s)[U][NT][4], bool full,
                                         float (&x)[U][NT][4]) const {
    const float kNegInf = -__int_as_float(0x7f800000);
    if constexpr (kRuns) {
      // Soft-capped or scaled (one warp-uniform branch), then masked to each
      // column's range unless every step lies inside every column's range
      // (most groups; the masks and the soft-cap select were 12% of NVFP4's
      // instructions).
      if (p.softcap_log2 > 0.0f) {
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int r = 0; r < 4; ++r) x[u][n][r] = p.softcap_log2 * fast_tanh(s[u][n][r] * p.softcap_scale);
      } else {
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int r = 0; r < 4; ++r) x[u][n][r] = s[u][n][r] * p.qk_log2_scale;
      }
      const int32_t pos0 = step_pos(b, 0);
      const bool inner = b.live == (1u << U) - 1 && pos0 >= inner_begin && pos0 + U * Cfg::kStepTokens <= inner_end;
      if (!inner) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const bool live = (b.live >> u) & 1u;
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              const int32_t t = step_pos(b, u) + g + 8 * (r / 2);
              const bool ok = live && t >= col_begin[n][r % 2] && t < col_end[n][r % 2];
              x[u][n][r] = ok ? x[u][n][r] : kNegInf;
            }
        }
      }
    } else if (Fmt::kScaled && full) {
      // Most groups. NVFP4 is instruction-bound: the masks were 2.7% of its
      // loop's instructions at head_dim 128 (the wider formats are
      // memory-bound, and the branch cost fp8 at head_dim 256 a spill).
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < 4; ++r) x[u][0][r] = s[u][0][r] * p.qk_log2_scale;
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const bool live = (b.live >> u) & 1u;
        const int32_t pos0 = step_pos(b, u);
        const bool ok_lo = live && pos0 + g >= first_pos && pos0 + g < seq_len;
        const bool ok_hi = live && pos0 + g + 8 >= first_pos && pos0 + g + 8 < seq_len;
        x[u][0][0] = ok_lo ? s[u][0][0] * p.qk_log2_scale : kNegInf;
        x[u][0][1] = ok_lo ? s[u][0][1] * p.qk_log2_scale : kNegInf;
        x[u][0][2] = ok_hi ? s[u][0][2] * p.qk_log2_scale : kNegInf;
        x[u][0][3] = ok_hi ? s[u][0][3] * p.qk_log2_scale : kNegInf;
      }
    }
  }

  // Position of step u of the group (pages hold whole steps; a group's
  // steps are consecutive).
  __device__ __forceinline__ int32_t step_pos(const StepBuffers<Cfg>& b, int u) const {
    return split_pos0 + (b.st0 + u) * Cfg::kStepTokens;
  }

  // Attention over the group of steps held in `b`: QK of every step, the
  // logits, one online-softmax update, V masked where a step is not wholly
  // attended (warp-uniform test; most groups skip it), PV of every step.
  __device__ void operator()(StepBuffers<Cfg>& b) const {
    float s[U][NT][4];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float s_odd[NT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int r = 0; r < 4; ++r) s[u][n][r] = s_odd[n][r] = 0.0f;
      scores(b, u, s[u], s_odd);
    }
    const int32_t pos0 = step_pos(b, 0);
    const bool full = b.live == (1u << U) - 1 && pos0 >= span_begin && pos0 + U * Cfg::kStepTokens <= span_end;
    float x[U][NT][4];
    logits(b, s, full, x);
    softmax(x);
    if (!full) {
#pragma unroll
      for (int u = 0; u < U; ++u) mask_v(b, u, step_pos(b, u), (b.live >> u) & 1u);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) pv(b, u, x[u]);
  }
};

}  // namespace metrale::kernels
