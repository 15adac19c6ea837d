// The prefill consumer's epilogue: its rows' outputs (and lse), or their
// split's records.
//
// A row's outputs are its sums times one factor (softmax_state.hpp's
// finalize as a multiply: NaN, 0 for a row that attends nothing, else
// v_factor / denominator). They go as bf16 into the warpgroup's own Q rows
// (free once its last QK completed; the swizzle keeps the fragment stores
// conflict-free), then out in 16-byte units, a row's units by consecutive
// threads (a token's q heads are consecutive rows of the output).
// Split-K (p.workspace): the split's record of each row instead (its
// normalised outputs and state, docs/spec.md 4; the sink joins only the
// reduce's final normalisation, which also writes lse).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/mma.cuh"
#include "kernels/common/named_barrier.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/formats/format_policy.cuh"
#include "kernels/prefill/prefill_params.hpp"
#include "metrale/softmax_state.hpp"

namespace metrale::kernels {

// The consumer warpgroup's rows, where they go.
struct PrefillRowsOut {
  int32_t row_lo, first_row, row_hi;  // the tile's packed rows, the live ones [first_row, row_hi)
  int32_t row0, group;                // the run's first query row, q heads per kv head
  int kv_head, split;
};

// The thread's two rows my_row[i] (accumulators o, state m_run, l_run):
// normalised into shared memory, or (records: p.workspace, split-K) their
// split's records.
template <class Fmt, class Cfg>
__device__ __forceinline__ void prefill_store_rows(const PrefillParams& p, const PrefillRowsOut& w,
                                                   const float (&o)[Cfg::kHeadDim / 2], const float (&m_run)[2],
                                                   const float (&l_run)[2], const int32_t (&my_row)[2], bool bad,
                                                   int quad, float* records, uint8_t* smem) {
  constexpr int D = Cfg::kHeadDim, kM = Cfg::kRows;
  const float kNegInf = -__int_as_float(0x7f800000);
  const float qnan = __int_as_float(0x7fc00000);
  // The thread's accumulator columns 2 quad, 2 quad + 1 of each unit hold
  // these elements of it (the V tiles' unit order, Fmt::prefill_unit_elem).
  constexpr bool kInOrder = prefill_units_in_order<Fmt>();
  const int e0 = Fmt::prefill_unit_elem(2 * quad), e1 = Fmt::prefill_unit_elem(2 * quad + 1);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = l_run[i];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int32_t r = my_row[i] - w.row_lo;  // the tile's row
    const bool live = my_row[i] >= w.first_row && my_row[i] < w.row_hi;
    const int32_t h = w.kv_head * w.group + (live ? my_row[i] % w.group : 0);
    const int64_t out_row = int64_t(w.row0 + (live ? my_row[i] / w.group : 0)) * p.num_q_heads + h;
    softmax::Merge<softmax::Log2> mg;
    mg.see_max({m_run[i], l});  // a NaN logit's l spreads through the factor
    mg.nan = bad;
    constexpr float kLog2e = 1.4426950408889634f;
    if (p.sinks && live && records == nullptr) mg.sink = p.sinks[h] * kLog2e;
    const bool empty = !mg.nan && mg.M == kNegInf;
    const float factor = mg.nan ? qnan : (empty ? 0.0f : p.v_factor / mg.denominator(l));
    // One branch per row, outside the stores: a branch per store (the two
    // paths in one loop) slowed the single-pass grid.
    if (records == nullptr) {
#pragma unroll
      for (int jj = 0; jj < D / 8; ++jj) {
        const float a = empty ? 0.0f : o[4 * jj + 2 * i] * factor;
        const float b = empty ? 0.0f : o[4 * jj + 2 * i + 1] * factor;
        uint8_t* const unit = smem + wg::swizzle_offset(kM, r, jj);
        const uint32_t ab = pack2<Bf16Op>(a, b);
        if constexpr (kInOrder) {
          *reinterpret_cast<uint32_t*>(unit + 4 * quad) = ab;
        } else {
          *reinterpret_cast<uint16_t*>(unit + 2 * e0) = uint16_t(ab);
          *reinterpret_cast<uint16_t*>(unit + 2 * e1) = uint16_t(ab >> 16);
        }
      }
    } else if (live) {
      float* const rec = records + softmax::record_index(out_row, p.num_splits, w.split) * softmax::record_floats(D);
#pragma unroll
      for (int jj = 0; jj < D / 8; ++jj) {
        const float a = empty ? 0.0f : o[4 * jj + 2 * i] * factor;
        const float b = empty ? 0.0f : o[4 * jj + 2 * i + 1] * factor;
        if constexpr (kInOrder) {
          *reinterpret_cast<float2*>(rec + 8 * jj + 2 * quad) = make_float2(a, b);
        } else {
          rec[8 * jj + e0] = a;
          rec[8 * jj + e1] = b;
        }
      }
      if (quad == 0) softmax::store_state(rec, D, softmax::to_record(mg.merged(l), m_run[i]));
    }
    if (live && p.lse != nullptr && quad == 0) {  // (split-K: null, the reduce's)
      const softmax::State<> st = softmax::to_record(mg.merged(l), m_run[i]);
      softmax::Merge<> ln;
      ln.M = st.m;
      ln.nan = st.is_nan();
      p.lse[out_row] = ln.lse(st.l);
    }
  }
}

// The warpgroup's rows from shared memory to the output, once all of its
// threads stored theirs (named barrier 3 + cw over its 128 threads).
template <class Cfg>
__device__ __forceinline__ void prefill_copy_out(const PrefillParams& p, const PrefillRowsOut& w, int cw,
                                                 const uint8_t* smem) {
  constexpr int D = Cfg::kHeadDim, kM = Cfg::kRows;
  named_barrier_sync<128>(3 + cw);
  constexpr int kUnits = D / 8;
  for (int idx = threadIdx.x % 128; idx < 64 * kUnits; idx += 128) {
    const int32_t r = cw * 64 + idx / kUnits, u = idx % kUnits;
    const int32_t pr = w.row_lo + r;
    if (pr < w.first_row || pr >= w.row_hi) continue;
    const int64_t out_row = int64_t(w.row0 + pr / w.group) * p.num_q_heads + w.kv_head * w.group + pr % w.group;
    *reinterpret_cast<uint4*>(p.out + out_row * D + u * 8) =
        *reinterpret_cast<const uint4*>(smem + wg::swizzle_offset(kM, r, u));
  }
}

}  // namespace metrale::kernels
