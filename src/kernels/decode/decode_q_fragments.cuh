// The decode kernel's Q^T fragments (decode_kernel.cuh): the B operands of
// its QK k-steps, loaded once and held in registers for the whole kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/mma.cuh"
#include "kernels/decode/decode_params.hpp"
#include "kernels/decode/decode_runs.cuh"
#include "metrale/codec.hpp"

namespace metrale::kernels {

// Q^T as B fragments of the QK k-steps, in registers: q head g of the
// tile (zero past the group), head_dim positions of the K permutation:
// slot r of k-step kk takes element Fmt::k_elem(kk, r) of the thread's K
// stream, which is element e % EK of vector e / EK, i.e. head_dim
// position Cfg::k_vector(e / EK, c) * EK + e % EK. Paired heads: every
// column holds its q in both halves (each half's k-steps feed one
// head's logits; the other head's products are never used, so the
// columns need no zeros and a NaN in one head's K stays there).
// Column tiles (NT > 1): n-tile n's fragment holds column 8n + g. Parts
// of head_dim (HP 2): the warp's k-steps are those of its half.
// seq, head0: the CTA's sequence and first q head (decode); rc: its
// columns (runs); cols: the columns it serves.
template <class Fmt, class Cfg, bool kPair, bool kRuns, int NT>
__device__ __forceinline__ void decode_load_q(const KernelParams<kRuns>& p, const RunColumns& rc, int64_t seq,
                                              int head0, int cols, int part, int g, int c,
                                              uint32_t (&qf)[NT][Cfg::kKSteps][2]) {
  using Op = typename Fmt::Op;
  constexpr int kHD = Cfg::kHeadDim;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const int qc = 8 * n + g;  // the column this thread loads
    const bf16* q_row = p.q + seq * p.q_stride + int64_t(head0 + g) * p.q_head_stride;
    if constexpr (kRuns)
      q_row = qc < cols ? p.q + int64_t(rc.row(qc)) * p.q_stride + int64_t(rc.head(qc)) * p.q_head_stride : p.q;
#pragma unroll
    for (int kk = 0; kk < Cfg::kKSteps; ++kk) {
      float x[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        constexpr int kEK = Cfg::kKElemsPerVec;
        const int e = Fmt::k_elem(kk, r);
        const int d = part * Cfg::kPartD + Cfg::k_vector(e / kEK, c) * kEK + e % kEK;
        x[r] = qc < cols ? codec::bf16_to_float(q_row[kPair ? d % kHD : d]) : 0.0f;
      }
      qf[n][kk][0] = pack2<Op>(x[0], x[1]);  // exact for bf16; f16 as docs/numerics.md says
      qf[n][kk][1] = pack2<Op>(x[2], x[3]);
    }
  }
}

}  // namespace metrale::kernels
