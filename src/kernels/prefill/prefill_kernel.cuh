// Query runs over the paged cache at tensor-core rate (SYSTEM.md 8): the
// Hopper kernel the planner takes for long runs (prompts, chunks of a
// chunked prefill). Its roles, each a file:
//   prefill_config.cuh      tiles, roles, register budgets, shared memory
//   prefill_scheduler.cuh   which rows and K/V tiles a CTA serves
//   prefill_pair.cuh        the K/V stages, their barriers, the CTA-pair exchange
//   prefill_producers.cuh   the producers: TMA copy, or load and dequantise
//                           (prefill_tile_loads.cuh)
//   prefill_q_tile.cuh      a consumer's Q rows and the page-id check
//   prefill_mainloop.cuh    QK, softmax (prefill_softmax.cuh), PV per tile
//   prefill_epilogue.cuh    outputs, lse or split records
//
// Warp specialisation: warpgroup 0 is the producer (setmaxnreg down), which
// fills a ring of kStages K/V stages; warpgroups 1 and 2 are consumers of 64
// rows each (setmaxnreg up). A tile of at most 64 rows (solo) has none in
// consumer 0's half: consumer 1 takes every tile alone, without turns, and
// alone gives the stages back; consumer 0 leaves, or for fp8 / NVFP4
// becomes a second producer.
//
// The epilogue follows softmax_state.hpp (sinks in the final normalisation,
// lse = m + ln(l), NaN rules); a page id outside the cache in the run's
// attended pages makes the whole run NaN, as in the decode kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/wgmma.cuh"
#include "kernels/prefill/prefill_config.cuh"
#include "kernels/prefill/prefill_epilogue.cuh"
#include "kernels/prefill/prefill_mainloop.cuh"
#include "kernels/prefill/prefill_pair.cuh"
#include "kernels/prefill/prefill_params.hpp"
#include "kernels/prefill/prefill_producers.cuh"
#include "kernels/prefill/prefill_q_tile.cuh"
#include "kernels/prefill/prefill_scheduler.cuh"
#include "kernels/prefill/prefill_tile_loads.cuh"

namespace metrale::kernels {

// The producer warpgroup, or a solo CTA's consumer 0 as a second
// dequantising producer (first 1: the odd steps, while the producer takes
// the even ones; two tiles in flight where one producer's loads, waited for
// one tile at a time, set the pace).
template <class Fmt, class Cfg, class Loader, class Pair>
__device__ __forceinline__ void prefill_produce(const PrefillParams& p, const PrefillRows& rows, const Pair& pair,
                                                uint8_t* smem, int32_t p_begin, int num_tiles, bool two, int first,
                                                int pt) {
  constexpr bool kSameTile = kPrefillPairSameTile<Fmt, Cfg>;
  if constexpr (!Loader::kTma) {
    if (first == 1) {
      dequant_producer<Cfg, Loader>(p, rows, pair, smem, p_begin, num_tiles, std::bool_constant<kSameTile>{}, 1, 2, pt);
      return;
    }
    // One copy of the loop where the orders agree: a second one spilled at head_dim 256.
    if constexpr (kSameTile) {
      if (two)
        dequant_producer<Cfg, Loader>(p, rows, pair, smem, p_begin, num_tiles, std::true_type{}, 0, 2, pt);
      else
        dequant_producer<Cfg, Loader>(p, rows, pair, smem, p_begin, num_tiles, std::false_type{}, 0, 1, pt);
    } else {
      dequant_producer<Cfg, Loader>(p, rows, pair, smem, p_begin, num_tiles, std::false_type{}, 0, two ? 2 : 1, pt);
    }
  }
}

// kPairs: launched as CTA pairs (clusters of two adjacent row tiles, prefill_pair.cuh).
template <class Fmt, int D, bool kPairs>
__global__ void __launch_bounds__(PrefillConfig<Fmt, D>::kThreads, 1)
    paged_prefill_kernel(const __grid_constant__ PrefillParams p) {
  using Cfg = PrefillConfig<Fmt, D>;
  using Loader = PrefillTileLoader<Fmt, D>;
  using Pair = PrefillPair<Cfg, Loader, kPairs>;
  constexpr int kM = Cfg::kRows, kN = Cfg::kTileTokens;
  const float kNegInf = -__int_as_float(0x7f800000);

  extern __shared__ uint8_t smem_raw[];
  uint8_t* const smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const uint32_t smem_base = smem_addr(smem);

  PrefillTile<kM, kN, kPairs> w;
  w.rows(p, prefill_cta_item<kPairs>(p));
  static_assert(!kPairs || geometry::prefill_can_pair_tiles(!Loader::kTma, D), "CTA pairs of this format and head_dim");
  if (w.row_hi <= 0) return;
  w.span(p);
  const bool two_producers = w.solo && !Loader::kTma;  // a solo CTA's consumer 0 produces too

  Pair pair{smem_base, w.paired, 0u, w.role};
  pair.init(w.solo);
  const int32_t* table = p.block_tables + w.seq * p.max_blocks_per_seq;
  const PrefillRows rows{table, w.seq_len, p.block_size, p.num_kv_heads, w.kv_head, p.num_blocks, p.page_stride,
                         p.scale_offset};

  // The warpgroup through a shuffle: ptxas then knows it is warp-uniform, and
  // the consumers' stage addresses and MMA descriptors stay in uniform registers.
  const int wgi = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0);
  if (wgi == 0) {
    wg::regs_dealloc<Cfg::kProducerRegs>();
    // The producer starts at once, before the consumers' Q: it needs no
    // page check (a page id outside the cache loads zeros: TMA fills a box
    // outside the map with zeros, locate() skips it).
    const int pt = threadIdx.x;
    if constexpr (Loader::kTma) {
      // One warp issues the boxes; the others leave at once (their wait
      // loops would take issue slots from the consumers' warps).
      if (pt >= Loader::kThreads) return;
      tma_producer<Cfg, Loader>(p, rows, pair, w.p_begin, w.num_tiles, pt);
    } else {
      prefill_produce<Fmt, Cfg, Loader>(p, rows, pair, smem, w.p_begin, w.num_tiles, two_producers, 0, pt);
    }
    return;
  }

  // ---- consumers ----
  wg::regs_alloc<Cfg::kConsumerRegs>();
  const int cw = wgi - 1;  // consumer 0 or 1
  if (w.solo && cw == 0) {
    prefill_produce<Fmt, Cfg, Loader>(p, rows, pair, smem, w.p_begin, w.num_tiles, true, 1, int(threadIdx.x % 128));
    return;
  }
  const int ct = threadIdx.x % 128;  // the thread in its warpgroup
  prefill_load_q<Fmt, Cfg>(p, w.row_lo, w.row0, w.group, w.kv_head, cw, ct, smem);
  // A page id outside the cache anywhere in the run's attended pages makes
  // the run NaN (each warpgroup checks them all; the barrier also makes its
  // Q rows visible to all of its threads).
  bool bad_page = false;
  {
    const int32_t first_page = query_range(w.seq_len, w.run_len, 0, p.sliding_window).begin / p.block_size;
    const int32_t end_page = (w.seq_len + p.block_size - 1) / p.block_size;
    for (int32_t pg = first_page + ct; pg < end_page; pg += 128) {
      const int32_t id = __ldg(table + pg);
      bad_page = bad_page || id < 0 || id >= p.num_blocks;
    }
  }
  uint32_t bad_any;
  asm volatile(
      "{\n .reg .pred mine, any;\n setp.ne.u32 mine, %1, 0;\n bar.red.or.pred any, %2, 128, mine;\n"
      " selp.u32 %0, 1, 0, any;\n}\n"
      : "=r"(bad_any)
      : "r"(uint32_t(bad_page)), "r"(3 + cw)
      : "memory");
  const bool bad = bad_any != 0;
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int quad = lane % 4;

  PrefillMainloop<Cfg, Pair> ml{pair, smem_base, smem_base + uint32_t(cw * 64 * 128), cw, lane, w.solo};
  // The warpgroup's rows [wg_lo, wg_lo + 64) and the thread's two, r and r + 8.
  const int32_t wg_lo = w.row_lo + cw * 64;
  const int32_t wg_first = max(wg_lo, 0), wg_last = wg_lo + 63;
  ml.sm.wg_first_range = w.range_of(p, wg_first);
  ml.sm.wg_last_range = w.range_of(p, max(wg_last, 0));
  ml.sm.quad = quad;
  int32_t my_row[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    my_row[i] = wg_lo + warp * 16 + lane / 4 + 8 * i;
    ml.sm.my_range[i] = w.range_of(p, max(my_row[i], w.first_row));
  }
#pragma unroll
  for (int i = 0; i < ml.kOAccs; ++i) ml.o[i] = 0.0f;
#pragma unroll
  for (int i = 0; i < 2; ++i) ml.sm.m_run[i] = kNegInf, ml.sm.l_run[i] = 0.0f;
  ml.run(p, w.p_begin, w.num_tiles);

  const PrefillRowsOut out{w.row_lo, w.first_row, w.row_hi, w.row0, w.group, w.kv_head, w.split};
  float* const records = p.workspace;
  prefill_store_rows<Fmt, Cfg>(p, out, ml.o, ml.sm.m_run, ml.sm.l_run, my_row, bad, quad, records, smem);
  if (records != nullptr) return;
  prefill_copy_out<Cfg>(p, out, cw, smem);
}

}  // namespace metrale::kernels
