// Query runs over the paged cache at tensor-core rate (docs/spec.md 8; issue
// 18): the Hopper kernel the planner takes for long runs (prompts, chunks
// of a chunked prefill). Its parts:
//   prefill_config.cuh      tiles, roles, register budgets, shared memory
//   prefill_tile_loads.cuh  the producer's K/V tile loads (and dequantisation)
//   wgmma.cuh, wgmma_ops.cuh  warpgroup MMAs and their descriptors
//
// Work decomposition: one CTA per (kv head, sequence, tile of kRows packed
// rows), the packed row of query row j and q head h of the group being
// j * group + h, so the q heads that share a kv head are served by one pass
// over its pages (as decode packs the group on its N). Tiles are counted
// from the run's end (tile 0 holds its last rows), so the CTAs with the
// most positions to attend start first; the first tile of a run may be
// partial. Where the sequences' K and V exceed L2 (p.tile_band > 0) the
// grid is one-dimensional, in bands of tiles, kv unit after kv unit within a
// band (prefill_item): the CTAs running at once read few kv heads' pages,
// not every head's. A CTA attends the positions its rows attend together, from its
// first row's window start to its last row's position, in tiles of
// kTileTokens.
//
// CTA pairs (kPairs): two adjacent row tiles of a run launched as a
// cluster share their K/V tiles, each CTA's producer filling every other
// one into both (docs/prefill.md).
//
// Warp specialisation: warpgroup 0 is the producer (setmaxnreg down), which
// fills a ring of kStages K/V stages (full/empty mbarriers); warpgroups 1
// and 2 are consumers of 64 rows each (setmaxnreg up). Per tile a consumer
//   S = Q K^T    wgmma m64 n(kTileTokens) k16, Q and K from shared memory
//   online softmax of S in registers (log2 units; masks only on the tiles
//                that cross its rows' causal or window edges)
//   O += P V     wgmma m64 n(head_dim) k16, P from registers (S's
//                accumulator layout is the A fragment's), V from shared
//                memory (MN-major)
// The two consumers share the stages and take turns issuing their MMAs
// (named barriers, as FlashAttention 3's ping-pong), so one's softmax runs
// under the other's MMAs; bf16 at head_dim <= 128 also issues tile t's PV
// with tile t + 1's QK (Cfg::kOverlap), its softmax under its own PV.
//
// The epilogue follows softmax_state.hpp (sinks in the final normalisation,
// lse = m + ln(l), NaN rules); a page id outside the cache in the run's
// attended pages makes the whole run NaN, as in the decode kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/decode/decode_params.hpp"
#include "kernels/decode/decode_runs.cuh"
#include "kernels/prefill/prefill_config.cuh"
#include "kernels/prefill/prefill_tile_loads.cuh"
#include "kernels/prefill/wgmma.cuh"
#include "metrale/ops.hpp"
#include "metrale/softmax_state.hpp"

namespace metrale::kernels {

// The CTA's item: CTA `cta` of the one-dimensional grid of units x
// sequences x tiles (a unit: split * num_kv_heads + kv head; a run's tiles
// counted from its end). The hardware starts CTAs in index order, so the
// order sets what runs together and what runs last: bands of `band` tiles,
// longest first; within a band one unit's CTAs after another's, tile major,
// then sequence (the planner's prefill_tile_band: the CTAs in flight read
// few kv heads' pages, which L2 then holds, and the last ones started are
// short).
struct PrefillItem {
  int unit, seq, tile;
};
__device__ __forceinline__ PrefillItem prefill_item(unsigned cta, unsigned ctas, unsigned units, unsigned tiles,
                                                   unsigned band) {
  const unsigned seqs = ctas / (units * tiles);
  const unsigned full = units * seqs * band;  // CTAs of a whole band
  const unsigned b = cta / full, r = cta % full;
  const unsigned in_band = min(band, tiles - b * band);  // the last band may be short
  const unsigned per_unit = seqs * in_band, r2 = r % per_unit;
  return PrefillItem{int(r / per_unit), int(r2 % seqs), int(b * band + r2 / seqs)};
}

// kPairs: launched as CTA pairs (clusters of two adjacent row tiles, below).
template <class Fmt, int D, bool kPairs>
__global__ void __launch_bounds__(PrefillConfig<Fmt, D>::kThreads, 1)
    paged_prefill_kernel(const __grid_constant__ RunParams p) {
  using Cfg = PrefillConfig<Fmt, D>;
  using Op = typename Cfg::Op;
  using Loader = PrefillTileLoader<Fmt, D>;
  constexpr int kM = Cfg::kRows, kN = Cfg::kTileTokens;
  const float kNegInf = -__int_as_float(0x7f800000);

  extern __shared__ uint8_t smem_raw[];
  uint8_t* const smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
  const uint32_t smem_base = smem_addr(smem);
  // Per operand (0 = K, 1 = V) and stage: full (the producer's threads
  // arrive, TMA completes its bytes) and empty (the consumers' warps arrive).
  auto bar_full = [&](int op, int s) {
    return smem_base + uint32_t(Cfg::kBarOffset + 8 * (2 * op * Cfg::kStages + s));
  };
  auto bar_empty = [&](int op, int s) {
    return smem_base + uint32_t(Cfg::kBarOffset + 8 * ((2 * op + 1) * Cfg::kStages + s));
  };

  // unit = split * num_kv_heads + kv head (split-K: p.num_splits > 1); a
  // three-dimensional grid (tile_band 0) is (unit, sequence, tile). CTA
  // pairs: clusters of two CTAs along z, or along x on the one-dimensional
  // grid, whose bands then order pairs of tiles.
  constexpr int pair_ctas = kPairs ? 2 : 1;
  PrefillItem item = PrefillItem{int(blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
  if (p.tile_band > 0) {
    item = prefill_item(blockIdx.x / pair_ctas, gridDim.x / pair_ctas, unsigned(p.num_kv_heads * p.num_splits),
                        unsigned(p.head_tiles / pair_ctas), unsigned(max(p.tile_band / pair_ctas, 1)));
    item.tile = item.tile * pair_ctas + int(blockIdx.x % pair_ctas);
  }
  const int kv_head = item.unit % p.num_kv_heads;
  const int split = item.unit / p.num_kv_heads;
  const int64_t seq = item.seq;
  const int tile = item.tile;  // from the run's end

  asm volatile("griddepcontrol.wait;\n" ::: "memory");

  const int32_t seq_len = min(max(p.seq_lens[seq], 0), p.max_blocks_per_seq * p.block_size);
  const int32_t row0 = p.q_start ? p.q_start[seq] : int32_t(seq);
  const int32_t run_len = p.q_start ? min(max(p.q_start[seq + 1] - row0, 0), seq_len) : 1;
  const int32_t group = p.group;
  const int32_t packed = run_len * group;       // the run's packed rows
  const int32_t row_hi = packed - tile * kM;    // the tile's packed rows [row_lo, row_hi)
  // CTA pairs: tiles 2k (role 0) and 2k + 1 (role 1) of a run, a cluster,
  // walk the same K / V tiles (the union of their spans), and each CTA's
  // producer fills every other tile into both CTAs' stages: bf16 by TMA
  // multicast, fp8 / NVFP4 dequantised here and copied to the other CTA
  // (cp.async.bulk). So each producer loads and converts half the tiles,
  // and L2 serves each tile once per pair. A stage's empty barrier counts
  // the releases of both CTAs' consumer warps. The pair is formed where
  // tile 2k + 1 has more than 64 rows (not a solo CTA); otherwise both run
  // alone, as without pairs.
  const int32_t pair_hi = packed - (tile & ~1) * kM;  // the pair's rows [pair_hi - 2 kM, pair_hi)
  static_assert(!kPairs || geometry::prefill_can_pair_tiles(!Loader::kTma, D), "CTA pairs of this format and head_dim");
  const bool paired = kPairs && pair_hi - 2 * kM + 64 > 0;
  const int role = tile & 1;
  if (row_hi <= 0) return;
  const int32_t row_lo = row_hi - kM;           // negative in a run's partial first tile
  const int32_t first_row = max(row_lo, 0);
  // A tile of at most 64 rows (verification, a run's partial first tile)
  // has none in consumer 0's half: consumer 1 takes every tile alone,
  // without turns, and alone gives the stages back; consumer 0 leaves, or
  // for fp8 / NVFP4 becomes a second producer (pair, below).
  const bool solo = row_lo + 64 <= 0;
  const bool pair = solo && !Loader::kTma;  // then two dequantising producers (below)
  auto range_of = [&](int32_t packed_row) {
    return query_range(seq_len, run_len, packed_row / group, p.sliding_window);
  };
  const int32_t span_begin = range_of(paired ? max(pair_hi - 2 * kM, 0) : first_row).begin;
  const int32_t span_end = range_of((paired ? pair_hi : row_hi) - 1).end;
  // The span's tiles from a page-group boundary; a split takes its share of
  // them by the runs kernel's rule (split_pages over tiles; none: an empty
  // record).
  const int32_t span_first = span_begin & ~15;
  const int32_t span_tiles = span_end > span_first ? (span_end - span_first + kN - 1) / kN : 0;
  const PageRange my_tiles = split_pages(PageRange{0, span_tiles}, split, p.num_splits);
  const int32_t p_begin = span_first + my_tiles.first * kN;
  const int num_tiles = my_tiles.end - my_tiles.first;

  if (threadIdx.x == 0) {
    for (int op = 0; op < 2; ++op)
      for (int s = 0; s < Cfg::kStages; ++s) {
        // The producer's threads (a pair's dequantising producer: its warps, below).
        mbar_init(bar_full(op, s), paired && !Loader::kTma ? 4 : Loader::kThreads);
        // The consumers' warps (a pair: both CTAs').
        mbar_init(bar_empty(op, s), (paired ? 2 : 1) * (solo ? 4 : 4 * Cfg::kConsumers));
      }
    fence_mbarrier_init();
  }
  // The barriers are initialised (a pair: both CTAs', before either signals the other's).
  if (paired)
    cluster_sync();
  else
    __syncthreads();
  const uint32_t peer = kPairs ? cluster_ctarank() ^ 1u : 0u;  // a pair's other CTA
  auto owns = [&](int t) { return !paired || (t & 1) == role; };  // this CTA's producer fills tile t
  const int32_t* table = p.block_tables + seq * p.max_blocks_per_seq;
  const PrefillRows rows{table, seq_len, p.block_size, p.num_kv_heads, kv_head, p.num_blocks, p.page_stride,
                         p.scale_offset};
  // ---- the producer's order and the dequantising producer's loop ----
  // In the order the consumers take them: K of tile t, then V of tile
  // t - kVLag, each into stage t % kStages once the consumers gave that
  // stage's operand back. With the overlap a consumer's step t runs QK of
  // t with PV of t - 1 (kVLag 1); without it, QK and PV of t (kVLag 0).
  // (With the overlap, K of t then V of t made K of t + 1 wait for V's
  // later release: ncu showed the consumers waiting for K. Without it,
  // V of t - 1 after K of t cost head_dim 256 FP8 2-3% and NVFP4 2-7%:
  // session 13, call 1.)
  constexpr int kVLag = Cfg::kOverlap ? 1 : 0;
  auto wait_empty = [&](int op, int t) {
    if (t >= Cfg::kStages) mbar_wait(bar_empty(op, t % Cfg::kStages), ((t / Cfg::kStages) - 1) & 1);
  };
  // A pair's producer leaves once both CTAs' consumers gave back its last
  // stages: the other CTA's releases arrive on this CTA's barriers, so it
  // must not exit before them (CUTLASS's producer tail).
  auto drain = [&] {
    if constexpr (kPairs) {
      for (int t = num_tiles; paired && t < num_tiles + Cfg::kStages; ++t) {
        wait_empty(0, t);
        wait_empty(1, t);
      }
    }
  };
  auto p0_of = [&](int t) { return p_begin + t * kN; };
  // The dequantising formats' loads of steps first, first + step, ... (one
  // warpgroup, pt its thread; a solo CTA has two such producers, below).
  // same_tile (std::bool_constant): each step fetches K and V of one tile,
  // both from the row located a step ahead. A solo CTA's two NVFP4
  // producers do so: they take every other step, so V of t - 1 would be a
  // tile the other one located, and locating it again put a block-table
  // load before V's fetch in every step (ncu, session 21: the waits for the
  // table loads were 15% of the samples at 64 x 8 over 4096, half of them
  // V's). NVFP4 verification of 8 tokens ran 1.05-1.06x at 16 x 8192 and
  // 64 x 4096, 1.01x at 1 x 32768; fp8 0.98-0.99x (its faster producers
  // then wait longer for V's stage, which the consumers give back a step
  // after K's), so fp8 keeps the order. Alone, a producer keeps the
  // consumers' order (V of t - kVLag after K of t). Without a lag (head_dim
  // 256) the two orders are one.
  constexpr bool kPairSameTile = Fmt::kBits == 4 && kVLag > 0;
  // A dequantising producer's stage of operand op is filled: its threads
  // arrive, or in a pair one arrival per warp. The owner's warps each copy
  // the 32 rows they stored (their two 16-position groups, rows 32 w ..
  // 32 w + 31 of every 64-element chunk: PrefillVectorShare) to the other
  // CTA as soon as their own lanes are done, without waiting for the
  // warpgroup (fp8 prompts 1.01-1.04x, NVFP4 1.00-1.02x faster than a named
  // barrier and one copy of the tile: session 25, call 1); the other CTA's
  // first warp announces the bytes those copies bring.
  auto fill = [&](int op, int s, bool own, int pt) {
    if (!paired) {
      mbar_arrive(bar_full(op, s));
      return;
    }
    if constexpr (kPairs && !Loader::kTma) {
      static_assert(Cfg::kTileTokens == 128, "a warp's rows: 32 consecutive rows of each chunk");
      const int pw = pt / 32;
      __syncwarp();  // the warp's stores (each thread fenced them for the async proxy)
      if (pt % 32 != 0) return;
      if (own) {
        const uint32_t stage = smem_base + uint32_t(op == 0 ? Cfg::kKOffset(s) : Cfg::kVOffset(s));
#pragma unroll
        for (int c = 0; c < D / 64; ++c) {
          const uint32_t rows = stage + uint32_t(c * Cfg::kTileTokens * 128 + pw * 32 * 128);
          bulk_copy_to_cluster(cluster_addr(rows, peer), rows, 32 * 128, cluster_addr(bar_full(op, s), peer));
        }
        mbar_arrive(bar_full(op, s));
      } else if (pw == 0) {
        mbar_arrive_expect_tx(bar_full(op, s), Cfg::kTileBytes);
      } else {
        mbar_arrive(bar_full(op, s));
      }
    }
  };
  auto produce_dequant = [&](auto same_tile, int first, int step, int pt) {
    if constexpr (!Loader::kTma) {
      constexpr int kLag = decltype(same_tile)::value ? 0 : kVLag;
      // Each step's K row is located a step ahead (its block-table load runs
      // under the step before), so K's fetch waits for its data alone, not
      // for a table load first.
      PrefillRowAt at_k = Loader::at(rows, p0_of(first), pt);
      for (int t = first; t < num_tiles + kLag; t += step) {
        typename Loader::Raw rk, rv;
        const int tv = t - kLag;
        // A pair's producer converts the tiles it owns and copies them to
        // the other CTA too; of the others it only announces the bytes.
        const bool own_k = t < num_tiles && owns(t), own_v = tv >= 0 && owns(tv);
        // All of the step's loads in flight while the stages drain (with a
        // lag, V's row located again rather than kept: the producer's
        // registers).
        if (own_k) Loader::fetch(p.k_cache, p, at_k, pt, rk);
        if (!Cfg::kFetchSplit && own_v)
          Loader::fetch(p.v_cache, p, kLag == 0 ? at_k : Loader::at(rows, p0_of(tv), pt), pt, rv);
        [[maybe_unused]] const PrefillRowAt at_this = at_k;  // V's row where V is fetched after K's store
        at_k = Loader::at(rows, p0_of(t + step), pt);
        if (t < num_tiles) {
          const int s = t % Cfg::kStages;
          wait_empty(0, t);
          if (own_k) {
            Loader::store(rk, smem + Cfg::kKOffset(s), pt);
            wg::fence_proxy_async();
          }
          fill(0, s, own_k, pt);
        }
        if (tv >= 0) {
          const int s = tv % Cfg::kStages;
          if constexpr (Cfg::kFetchSplit) {
            if (own_v) Loader::fetch(p.v_cache, p, at_this, pt, rv);  // tv == t
          }
          wait_empty(1, tv);
          if (own_v) {
            Loader::store(rv, smem + Cfg::kVOffset(s), pt);
            wg::fence_proxy_async();
          }
          fill(1, s, own_v, pt);
        }
      }
      drain();
    }
  };
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
      const uint16_t multicast = paired ? uint16_t(3) : uint16_t(0);  // a pair's boxes land in both CTAs
      // The page ids of tile t + 1 are looked up before the waits of step t.
      typename Loader::Group grp = Loader::lookup(rows, p0_of(0), pt), grp_prev{};
      for (int t = 0; t < num_tiles + kVLag; ++t) {
        const typename Loader::Group grp_next = Loader::lookup(rows, p0_of(t + 1), pt);
        if (t < num_tiles) {
          wait_empty(0, t);
          Loader::load(&p.k_map, p.k_cache, rows, p0_of(t), grp, smem_base + Cfg::kKOffset(t % Cfg::kStages),
                       bar_full(0, t % Cfg::kStages), pt, owns(t), multicast);
        }
        if (t >= kVLag) {
          const int tv = t - kVLag;
          wait_empty(1, tv);
          Loader::load(&p.v_map, p.v_cache, rows, p0_of(tv), kVLag ? grp_prev : grp,
                       smem_base + Cfg::kVOffset(tv % Cfg::kStages), bar_full(1, tv % Cfg::kStages), pt, owns(tv),
                       multicast);
        }
        grp_prev = grp;
        grp = grp_next;
      }
      drain();
    } else {
      // (Elsewhere one copy of the loop: a second one spilled at head_dim 256.)
      if constexpr (kPairSameTile) {
        if (pair)
          produce_dequant(std::true_type{}, 0, 2, pt);
        else
          produce_dequant(std::false_type{}, 0, 1, pt);
      } else {
        produce_dequant(std::false_type{}, 0, pair ? 2 : 1, pt);
      }
    }
    return;
  }

  // ---- consumers ----
  wg::regs_alloc<Cfg::kConsumerRegs>();
  const int cw = wgi - 1;                    // consumer 0 or 1
  if (solo && cw == 0) {
    // A solo CTA of a dequantising format: consumer 0 produces the odd
    // steps, the producer the even ones, two tiles in flight where one
    // producer's loads, waited for one tile at a time, set the pace.
    if constexpr (!Loader::kTma) produce_dequant(std::bool_constant<kPairSameTile>{}, 1, 2, int(threadIdx.x % 128));
    return;
  }
  const int ct = threadIdx.x % 128;          // the thread in its warpgroup
  // The warpgroup's 64 rows of Q (zeros outside the run) in the MMA's type,
  // all loads in flight at once, while the producer fills the first stages.
  {
    constexpr int kUnits = D / 8, kPerThread = 64 * kUnits / 128;
    uint4 v[kPerThread];
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
      if constexpr (!std::is_same_v<Op, Bf16Op>) {  // in the K tiles' unit order (Fmt::prefill_unit_elem)
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
  // A page id outside the cache anywhere in the run's attended pages makes
  // the run NaN (each warpgroup checks them all; the barrier also makes its
  // Q rows visible to all of its threads).
  bool bad_page = false;
  {
    const int32_t first_page = query_range(seq_len, run_len, 0, p.sliding_window).begin / p.block_size;
    const int32_t end_page = (seq_len + p.block_size - 1) / p.block_size;
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
  // The warpgroup's rows [wg_lo, wg_lo + 64) and the thread's two, r and r + 8.
  const int32_t wg_lo = row_lo + cw * 64;
  const int32_t wg_first = max(wg_lo, 0), wg_last = wg_lo + 63;
  const QueryRange wg_first_range = range_of(wg_first), wg_last_range = range_of(max(wg_last, 0));
  int32_t my_row[2];
  QueryRange my_range[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    my_row[i] = wg_lo + warp * 16 + lane / 4 + 8 * i;
    my_range[i] = range_of(max(my_row[i], first_row));
  }

  constexpr int kSAccs = kN / 2, kOAccs = D / 2;
  float o[kOAccs];
#pragma unroll
  for (int i = 0; i < kOAccs; ++i) o[i] = 0.0f;
  float m_run[2] = {kNegInf, kNegInf}, l_run[2] = {0.0f, 0.0f};
  const uint32_t q_tile = smem_base + uint32_t(cw * 64 * 128);

  // Both consumers walk all of the CTA's tiles (a tile none of a
  // warpgroup's rows attends gives it P = 0), so that they can take turns:
  // before issuing a tile's MMAs a consumer waits on its named barrier
  // (1 + cw), after issuing them it lets the other one go (FlashAttention
  // 3's ping-pong), so that one consumer's softmax runs under the other's
  // MMAs (in a solo CTA consumer 1 walks them alone). A bad run walks its
  // tiles too (the producer does not know it is bad), and its outputs are NaN.
  const int tiles = num_tiles;
  auto my_turn = [&] {
    if (!solo) asm volatile("bar.sync %0, 256;\n" ::"r"(1 + cw) : "memory");
  };
  auto your_turn = [&] {
    if (!solo) asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - cw) : "memory");
  };
  if (cw == 1 && tiles > 0) your_turn();  // consumer 0 issues first
  auto stage_of = [](int t) { return t % Cfg::kStages; };
  // op 0 = K, 1 = V of tile t.
  auto wait_full = [&](int op, int t) { mbar_wait(bar_full(op, stage_of(t)), (t / Cfg::kStages) & 1); };
  auto release = [&](int op, int t) {
    __syncwarp();
    if (lane == 0) {
      mbar_arrive(bar_empty(op, stage_of(t)));
      if (paired) mbar_arrive_cluster(cluster_addr(bar_empty(op, stage_of(t)), peer));  // the other CTA's producer fills it too
    }
  };
  // S = Q K^T of tile t (issued, committed; the caller waits).
  auto issue_qk = [&](float (&sacc)[kSAccs], int t) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      Wgmma<kN, Op>::ss(sacc, wg::k_major(q_tile, kM, kk), wg::k_major(smem_base + Cfg::kKOffset(stage_of(t)), kN, kk),
                        kk > 0);
    wg::commit();
  };
  // O += P V of tile t.
  auto issue_pv = [&](const uint32_t (&pa)[kN / 16][4], int t) {
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk)
      Wgmma<D, Op>::rs(o, pa[kk], wg::mn_major(smem_base + Cfg::kVOffset(stage_of(t)), kN, kk), 1);
    wg::commit();
  };
  // The online softmax of tile t's S, in place (log2 units; masked where
  // the tile crosses an edge of the warpgroup's rows' ranges): S becomes
  // P in f32, m and l are updated, f = the factor O must take before P
  // joins it. sacc[4j + 2i + c]: row i, column 8j + 2 quad + c.
  auto softmax_tile = [&](float (&sacc)[kSAccs], int t, float (&f)[2]) {
    const int32_t p0 = p_begin + t * kN;
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
  };
  // P (f32, in S's accumulator layout) as PV's A fragments: k-step j/2 holds
  // (row, k 2q..) (row+8, k 2q..) (row, k 2q+8..) (row+8, k 2q+8..).
  auto to_fragments = [&](const float (&sacc)[kSAccs], uint32_t (&pa)[kN / 16][4]) {
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
      pa[j / 2][2 * (j % 2)] = pack2<Op>(sacc[4 * j], sacc[4 * j + 1]);
      pa[j / 2][2 * (j % 2) + 1] = pack2<Op>(sacc[4 * j + 2], sacc[4 * j + 3]);
    }
  };
  // O takes the factors of its rows' new maxima; a warp whose rows' maxima
  // all stayed (f == 1, the common case once a long run's maximum has
  // settled) skips the multiplies, which changes no bit of O.
  auto rescale_o = [&](const float (&f)[2]) {
    if (!__any_sync(0xffffffffu, f[0] != 1.0f || f[1] != 1.0f)) return;
#pragma unroll
    for (int e = 0; e < kOAccs; ++e) o[e] *= f[(e / 2) % 2];
  };

  float sacc[kSAccs], f[2];
  uint32_t pa[kN / 16][4];
  if constexpr (!Cfg::kOverlap) {
    // QK, softmax, PV in turn (head_dim 256).
    for (int t = 0; t < tiles; ++t) {
      wait_full(0, t);
      my_turn();
      wg::fence();
      issue_qk(sacc, t);
      your_turn();
      wg::wait<0>();
      wg::fence_operands(sacc);
      release(0, t);
      softmax_tile(sacc, t, f);
      to_fragments(sacc, pa);
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
  } else if (tiles > 0) {
    // Tile t's PV is issued with tile t + 1's QK, so that the softmax of
    // t + 1 runs while the tensor cores do PV of t (FlashAttention 3's
    // intra-warpgroup overlap). P of t waits in S's registers (f32) and
    // becomes PV's fragments only after the PV before it has completed, so
    // one fragment tile serves every PV. The wait for that PV comes after
    // the next tiles' full-barrier waits, branches: ptxas hoists a
    // wgmma.wait_group to the top of its basic block, and in the softmax's
    // block it serialised the softmax behind the PV. K goes back as soon as
    // its QK completed, V once its PV did.
    wait_full(0, 0);
    my_turn();
    wg::fence();
    issue_qk(sacc, 0);
    your_turn();
    wg::wait<0>();
    wg::fence_operands(sacc);
    release(0, 0);
    softmax_tile(sacc, 0, f);  // O is 0: nothing to rescale
    // Before tile t's MMAs: the PV of t - 2 completes, its V goes back (before
    // the wait for the V of t - 1, so that the producer is not held up by
    // it), and P of t - 1 becomes fragments for O rescaled to its maximum.
    auto prepare_pv = [&](int t) {
      wg::wait<0>();
      wg::fence_operands(o);
      wg::fence_operands(pa);  // read by that PV until here
      if (t >= 2) release(1, t - 2);
      wait_full(1, t - 1);
      to_fragments(sacc, pa);
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
      softmax_tile(sacc, t, f);
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

  // ---- epilogue: the rows' outputs (and lse), or their split's records ----
  // A row's outputs are its sums times one factor (softmax_state.hpp's
  // finalize as a multiply: NaN, 0 for a row that attends nothing, else
  // v_factor / denominator). They go as bf16 into the warpgroup's own Q rows
  // (free once its last QK completed; the swizzle keeps the fragment stores
  // conflict-free), then out in 16-byte units, a row's units by consecutive
  // threads (a token's q heads are consecutive rows of the output).
  // Split-K (p.workspace): the split's record of each row instead (its
  // normalised outputs and state, docs/spec.md 4; the sink joins only the
  // reduce's final normalisation, which also writes lse).
  const float qnan = __int_as_float(0x7fc00000);
  float* const records = p.workspace;
  // The thread's accumulator columns 2 quad, 2 quad + 1 of each unit hold
  // these elements of it (the V tiles' unit order, Fmt::prefill_unit_elem).
  constexpr bool kInOrder = prefill_units_in_order<Fmt>();
  const int e0 = Fmt::prefill_unit_elem(2 * quad), e1 = Fmt::prefill_unit_elem(2 * quad + 1);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = l_run[i];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int32_t r = my_row[i] - row_lo;  // the tile's row
    const bool live = my_row[i] >= first_row && my_row[i] < row_hi;
    const int32_t h = kv_head * group + (live ? my_row[i] % group : 0);
    const int64_t out_row = int64_t(row0 + (live ? my_row[i] / group : 0)) * p.num_q_heads + h;
    softmax::Merge<softmax::Log2> mg;
    mg.see_max({m_run[i], l});  // a NaN logit's l spreads through the factor
    mg.nan = bad;
    constexpr float kLog2e = 1.4426950408889634f;
    if (p.sinks && live && records == nullptr) mg.sink = p.sinks[h] * kLog2e;
    const bool empty = !mg.nan && mg.M == kNegInf;
    const float factor = mg.nan ? qnan : (empty ? 0.0f : p.v_factor / mg.denominator(l));
    // One branch per row, outside the stores: a branch per store (the two
    // paths in one loop) cost the single-pass grid 2-7% at 1024 tokens.
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
      float* const rec = records + softmax::record_index(out_row, p.num_splits, split) * softmax::record_floats(D);
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
  if (records != nullptr) return;
  asm volatile("bar.sync %0, 128;\n" ::"r"(3 + cw) : "memory");  // the warpgroup's rows are in shared memory
  constexpr int kUnits = D / 8;
  for (int idx = threadIdx.x % 128; idx < 64 * kUnits; idx += 128) {
    const int32_t r = cw * 64 + idx / kUnits, u = idx % kUnits;
    const int32_t pr = row_lo + r;
    if (pr < first_row || pr >= row_hi) continue;
    const int64_t out_row = int64_t(row0 + pr / group) * p.num_q_heads + kv_head * group + pr % group;
    *reinterpret_cast<uint4*>(p.out + out_row * D + u * 8) =
        *reinterpret_cast<const uint4*>(smem + wg::swizzle_offset(kM, r, u));
  }
}

}  // namespace metrale::kernels
