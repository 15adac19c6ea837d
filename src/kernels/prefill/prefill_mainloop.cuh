// The prefill consumer's mainloop: per K/V tile of the CTA's span
//   S = Q K^T    wgmma m64 n(kTileTokens) k16, Q and K from shared memory
//   online softmax of S in registers (prefill_softmax.cuh)
//   O += P V     wgmma m64 n(head_dim) k16, P from registers (S's
//                accumulator layout is the A fragment's), V from shared
//                memory (MN-major)
// The two consumers share the stages and take turns issuing their MMAs
// (named barriers, as FlashAttention 3's ping-pong), so one's softmax runs
// under the other's MMAs; with Cfg::kOverlap a consumer also issues tile
// t's PV with tile t + 1's QK, its softmax under its own PV.
//
// Both consumers walk all of the CTA's tiles (a tile none of a warpgroup's
// rows attends gives it P = 0), so that they can take turns: before issuing
// a tile's MMAs a consumer waits on its named barrier (1 + cw), after
// issuing them it lets the other one go, so that one consumer's softmax
// runs under the other's MMAs (in a solo CTA consumer 1 walks them alone).
// A bad run walks its tiles too (the producer does not know it is bad), and
// its outputs are NaN.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/named_barrier.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/prefill/prefill_pair.cuh"
#include "kernels/prefill/prefill_softmax.cuh"

namespace metrale::kernels {

template <class Cfg, class Pair>
struct PrefillMainloop {
  using Op = typename Cfg::Op;
  static constexpr int D = Cfg::kHeadDim, kM = Cfg::kRows, kN = Cfg::kTileTokens;
  static constexpr int kSAccs = kN / 2, kOAccs = D / 2;
  using Softmax = PrefillSoftmax<kN, Op>;

  const Pair& pair;
  const Softmax& sm;
  float (&o)[kOAccs];          // the rows' output accumulators
  uint32_t smem_base, q_tile;  // the CTA's shared memory, the warpgroup's Q rows
  int cw, lane;                // consumer 0 or 1, the thread's lane
  bool solo;

  __device__ void my_turn() const {
    if (!solo) named_barrier_sync<256>(1 + cw);
  }
  __device__ void your_turn() const {
    if (!solo) named_barrier_arrive<256>(2 - cw);
  }
  __device__ static int stage_of(int t) { return t % Cfg::kStages; }
  // op 0 = K, 1 = V of tile t.
  __device__ void wait_full(int op, int t) const { pair.ring(op).wait_full(t); }
  __device__ void release(int op, int t) const { pair.release(op, t, lane); }

  // S = Q K^T of tile t (issued, committed; the caller waits).
  __device__ void issue_qk(float (&sacc)[kSAccs], int t) const {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      Wgmma<kN, Op>::ss(sacc, wg::k_major(q_tile, kM, kk), wg::k_major(smem_base + Cfg::kKOffset(stage_of(t)), kN, kk),
                        kk > 0);
    wg::commit();
  }
  // O += P V of tile t.
  __device__ void issue_pv(const uint32_t (&pa)[kN / 16][4], int t) const {
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk)
      Wgmma<D, Op>::rs(o, pa[kk], wg::mn_major(smem_base + Cfg::kVOffset(stage_of(t)), kN, kk), 1);
    wg::commit();
  }
  // O takes the factors of its rows' new maxima; a warp whose rows' maxima
  // all stayed (f == 1, the common case once a long run's maximum has
  // settled) skips the multiplies, which changes no bit of O.
  __device__ void rescale_o(const float (&f)[2]) const {
    if (!__any_sync(0xffffffffu, f[0] != 1.0f || f[1] != 1.0f)) return;
#pragma unroll
    for (int e = 0; e < kOAccs; ++e) o[e] *= f[(e / 2) % 2];
  }

  // QK, softmax, PV in turn (head_dim 256).
  __device__ __forceinline__ void run_in_turn(const PrefillParams& p, int tiles,
                                              float (&sacc)[kSAccs], float (&f)[2], uint32_t (&pa)[kN / 16][4]) const {
    for (int t = 0; t < tiles; ++t) {
      wait_full(0, t);
      my_turn();
      wg::fence();
      issue_qk(sacc, t);
      your_turn();
      wg::wait<0>();
      wg::fence_operands(sacc);
      release(0, t);
      sm.tile(p, sacc, t, f);
      Softmax::to_fragments(sacc, pa);
      rescale_o(f);
      wg::fence_operands(o);
      wg::fence_operands(pa);
      wait_full(1, t);
      wg::fence();
      issue_pv(pa, t);
      wg::wait<0>();
      wg::fence_operands(o);
      wg::fence_operands(pa);
      release(1, t);
    }
  }

  // Tile t's PV is issued with tile t + 1's QK, so that the softmax of
  // t + 1 runs while the tensor cores do PV of t (FlashAttention 3's
  // intra-warpgroup overlap). P of t waits in S's registers (f32) and
  // becomes PV's fragments only after the PV before it has completed, so
  // one fragment tile serves every PV. The wait for that PV comes after
  // the next tiles' full-barrier waits, branches: ptxas hoists a
  // wgmma.wait_group to the top of its basic block, and in the softmax's
  // block it serialised the softmax behind the PV. K goes back as soon as
  // its QK completed, V once its PV did.
  __device__ __forceinline__ void run_overlapped(const PrefillParams& p, int tiles,
                                                 float (&sacc)[kSAccs], float (&f)[2], uint32_t (&pa)[kN / 16][4]) const {
    wait_full(0, 0);
    my_turn();
    wg::fence();
    issue_qk(sacc, 0);
    your_turn();
    wg::wait<0>();
    wg::fence_operands(sacc);
    release(0, 0);
    sm.tile(p, sacc, 0, f);  // O is 0: nothing to rescale
    // Before tile t's MMAs: the PV of t - 2 completes, its V goes back (before
    // the wait for the V of t - 1, so that the producer is not held up by
    // it), and P of t - 1 becomes fragments for O rescaled to its maximum.
    auto prepare_pv = [&](int t) {
      wg::wait<0>();
      wg::fence_operands(o);
      wg::fence_operands(pa);  // read by that PV until here
      if (t >= 2) release(1, t - 2);
      wait_full(1, t - 1);
      Softmax::to_fragments(sacc, pa);
      rescale_o(f);
      wg::fence_operands(o);
      wg::fence_operands(pa);
    };
    for (int t = 1; t < tiles; ++t) {
      wait_full(0, t);
      prepare_pv(t);
      my_turn();
      wg::fence();
      issue_qk(sacc, t);
      issue_pv(pa, t - 1);
      your_turn();
      wg::wait<1>();  // QK of t (PV of t - 1 may still run)
      wg::fence_operands(sacc);
      release(0, t);
      sm.tile(p, sacc, t, f);
    }
    prepare_pv(tiles);
    my_turn();
    wg::fence();
    issue_pv(pa, tiles - 1);
    your_turn();
    wg::wait<0>();
    wg::fence_operands(o);
    wg::fence_operands(pa);
    release(1, tiles - 1);
  }

  // Every tile of the CTA's span, O and the softmax state starting empty
  // (sacc, f, pa: the loop's S, factors and P fragments).
  __device__ __forceinline__ void run(const PrefillParams& p, int tiles, float (&sacc)[kSAccs],
                                      float (&f)[2], uint32_t (&pa)[kN / 16][4]) const {
    if constexpr (!Cfg::kOverlap)
      run_in_turn(p, tiles, sacc, f, pa);
    else if (tiles > 0)
      run_overlapped(p, tiles, sacc, f, pa);
  }
};

}  // namespace metrale::kernels
