// Query runs over the paged cache at tensor-core rate (docs/spec.md 8): the
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

#include "kernels/common/kernel_flags.hpp"
#include "kernels/common/named_barrier.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/prefill/prefill_config.cuh"
#include "kernels/prefill/prefill_epilogue.cuh"
#include "kernels/prefill/prefill_mainloop.cuh"
#include "kernels/prefill/prefill_pair.cuh"
#include "kernels/prefill/prefill_params.hpp"
#include "kernels/prefill/prefill_producers.cuh"
#include "kernels/prefill/prefill_q_tile.cuh"
#include "kernels/prefill/prefill_scheduler.cuh"
#include "kernels/prefill/prefill_softmax.cuh"
#include "kernels/prefill/prefill_tile_loads.cuh"
#include "metrale/ops.hpp"

namespace metrale::kernels {

// kTilePairs paired: launched as CTA pairs (clusters of two adjacent row tiles, prefill_pair.cuh).
template <class Fmt, int D, TilePairs kTilePairs>
__global__ void __launch_bounds__(PrefillConfig<Fmt, D>::kThreads, 1)
    paged_prefill_kernel(const __grid_constant__ PrefillParams p) {
  constexpr bool kPairs = kTilePairs == TilePairs::paired;
  using Cfg = PrefillConfig<Fmt, D>;
  using Op = typename Cfg::Op;
  using Loader = PrefillTileLoader<Fmt, D>;
  using Pair = PrefillPair<Cfg, Loader, kPairs>;
  constexpr int kM = Cfg::kRows, kN = Cfg::kTileTokens;
  const float kNegInf = -__int_as_float(0x7f800000);

  extern __shared__ uint8_t smem_raw[];
  uint8_t* const smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const uint32_t smem_base = smem_addr(smem);

  // ---- the CTA's rows and tiles, its stages ----
  const PrefillItem item = prefill_cta_item<kPairs>(p);
  PrefillTile<kM, kN, kPairs> w;
  w.rows(p, item);
  static_assert(!kPairs || geometry::prefill_can_pair_tiles(!Loader::kTma, D), "CTA pairs of this format and head_dim");
  if (w.row_hi <= 0) return;
  w.span(p);
  const int kv_head = w.kv_head;
  const int32_t seq_len = w.seq_len, run_len = w.run_len, group = w.group;
  const bool solo = w.solo;
  const bool two_producers = solo && !Loader::kTma;  // a solo CTA's consumer 0 produces too
  auto range_of = [&](int32_t packed_row) {
    return query_range(seq_len, run_len, packed_row / group, p.sliding_window);
  };
  const int32_t p_begin = w.p_begin;
  const int num_tiles = w.num_tiles;
  Pair pr{smem_base, w.paired, 0u, w.role};
  pr.init(solo);
  const int32_t* table = p.block_tables + w.seq * p.max_blocks_per_seq;
  const PrefillRows rows{table, seq_len, p.block_size, p.num_kv_heads, kv_head, p.num_blocks, p.page_stride,
                         p.scale_offset};
  auto p0_of = [&](int t) { return p_begin + t * kN; };
  constexpr bool kSameTile = kPrefillPairSameTile<Fmt, Cfg>;
  const PrefillDequantProducer<Cfg, Loader, Pair, decltype(p0_of)> dequant{p, rows, pr, smem, p0_of, num_tiles};

  // The warpgroup through a shuffle: ptxas then knows it is warp-uniform, and
  // the consumers' stage addresses and MMA descriptors stay in uniform registers.
  const int wgi = __shfl_sync(0xffffffffu, int(threadIdx.x / 128), 0);
  if (wgi == 0) {
    // ---- producer ----
    wg::regs_dealloc<Cfg::kProducerRegs>();
    // The producer starts at once, before the consumers' Q: it needs no
    // page check (a page id outside the cache loads zeros: TMA fills a box
    // outside the map with zeros, locate() skips it).
    const int pt = threadIdx.x;
    if constexpr (Loader::kTma) {
      // One warp issues the boxes; the others leave at once (their wait
      // loops would take issue slots from the consumers' warps).
      if (pt >= Loader::kThreads) return;
      PrefillTmaProducer<Cfg, Loader> producer;
      producer.run(p, rows, pr, p0_of, num_tiles, pt);
    } else if constexpr (kSameTile) {
      if (two_producers)
        dequant.run(std::true_type{}, 0, 2, pt);
      else
        dequant.run(std::false_type{}, 0, 1, pt);
    } else {
      // One copy of the loop where the orders agree: a second one spilled at head_dim 256.
      dequant.run(std::false_type{}, 0, two_producers ? 2 : 1, pt);
    }
    return;
  }

  // ---- consumers ----
  wg::regs_alloc<Cfg::kConsumerRegs>();
  const int cw = wgi - 1;  // consumer 0 or 1
  if (solo && cw == 0) {
    // A solo CTA of a dequantising format: consumer 0 produces the odd
    // steps, the producer the even ones, two tiles in flight where one
    // producer's loads, waited for one tile at a time, set the pace.
    if constexpr (!Loader::kTma) dequant.run(std::bool_constant<kSameTile>{}, 1, 2, int(threadIdx.x % 128));
    return;
  }
  const int ct = threadIdx.x % 128;  // the thread in its warpgroup
  {
    uint4 q_units[D / 16];
    prefill_load_q<Fmt, Cfg>(p, w.row_lo, w.row0, group, kv_head, cw, ct, smem, q_units);
  }
  // A page id outside the cache anywhere in the run's attended pages makes
  // the run NaN (each warpgroup checks them all; the barrier also makes its
  // Q rows visible to all of its threads).
  bool bad_page = false;
  {
    const PageRange pages = run_pages(seq_len, run_len, p.sliding_window, p.block_size);
    for (int32_t pg = pages.first + ct; pg < pages.end; pg += 128) {
      const int32_t id = __ldg(table + pg);
      bad_page = bad_page || id < 0 || id >= p.num_blocks;
    }
  }
  const bool bad = named_barrier_or<128>(bad_page, 3 + cw);

  // The warpgroup's rows [wg_lo, wg_lo + 64) and the thread's two, r and r + 8.
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int quad = lane % 4;
  const int32_t wg_lo = w.row_lo + cw * 64;
  const int32_t wg_first = max(wg_lo, 0), wg_last = wg_lo + 63;
  const QueryRange wg_first_range = range_of(wg_first), wg_last_range = range_of(max(wg_last, 0));
  int32_t my_row[2];
  QueryRange my_range[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    my_row[i] = wg_lo + warp * 16 + lane / 4 + 8 * i;
    my_range[i] = range_of(max(my_row[i], w.first_row));
  }

  // ---- mainloop: O and the softmax state over the CTA's tiles ----
  constexpr int kSAccs = kN / 2, kOAccs = D / 2;
  float o[kOAccs];
#pragma unroll
  for (int i = 0; i < kOAccs; ++i) o[i] = 0.0f;
  float m_run[2] = {kNegInf, kNegInf}, l_run[2] = {0.0f, 0.0f};
  const uint32_t q_tile = smem_base + uint32_t(cw * 64 * 128);
  const PrefillSoftmax<kN, Op> sm{m_run, l_run, wg_first_range, wg_last_range, my_range, quad, p_begin};
  const PrefillMainloop<Cfg, Pair> ml{pr, sm, o, smem_base, q_tile, cw, lane, solo};
  if (cw == 1 && num_tiles > 0) ml.your_turn();  // consumer 0 issues first
  float sacc[kSAccs], f[2];
  uint32_t pa[kN / 16][4];
  ml.run(p, num_tiles, sacc, f, pa);

  // ---- epilogue ----
  const PrefillRowsOut out{w.row_lo, w.first_row, w.row_hi, w.row0, group, kv_head, w.split};
  float* const records = p.workspace;
  prefill_store_rows<Fmt, Cfg>(p, out, o, m_run, l_run, my_row, bad, quad, records, smem);
  if (records != nullptr) return;
  prefill_copy_out<Cfg>(p, out, cw, smem);
}

}  // namespace metrale::kernels
