// The TMA load pipeline of the decode kernel (bf16 and fp8): warp w takes
// the same step groups as in the register path (U consecutive steps, groups
// round-robin over the warps) through its own ring of S stages of one
// group. Lane 0 issues a stage's copies (K and V tiles) and its mbarrier
// completes when they land; the warp reads the stage into registers, refills
// it with the group S ahead, then computes. No barrier between warps, S
// groups in flight per warp. The ring and its swizzle: DecodeConfig.
//
// Interface shared with RegisterLoads: construct, run(compute) calls
// compute(b) once per step group in order, then bad_page says whether a
// corrupt page id was seen.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/mbarrier_ring.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/common/vector_loads.cuh"
#include "kernels/decode/decode_config.cuh"
#include "kernels/decode/decode_steps.cuh"

namespace metrale::kernels {

template <class Cfg>
struct TmaLoads {
  static_assert(Cfg::kTmaPath, "an instantiation of the TMA path");
  static constexpr int U = Cfg::kUnroll;
  static constexpr int S = Cfg::kRingStages;
  static constexpr int BB = Cfg::kBoxBytes;

  const DecodeParams& p;
  SplitSteps<Cfg>& steps;
  int kv_head, lane, g, c;
  bool bad_page = false;
  uint8_t* tiles;          // this warp's ring
  MbarrierRing<S, RingRelease::by_warp> ring;  // its stages' mbarriers
  uint32_t live_bits = 0;  // bit s*U + u: step u of stage s is attended and on a valid page

  // `smem`: the CTA's dynamic shared memory (Cfg's map).
  __device__ __forceinline__ TmaLoads(const DecodeParams& p_, SplitSteps<Cfg>& steps_, uint8_t* smem, int kv_head_,
                                      int warp, int lane_, int g_, int c_)
      : p(p_), steps(steps_), kv_head(kv_head_), lane(lane_), g(g_), c(c_) {
    uint8_t* const rings =
        smem + ((Cfg::kRingAlign - (smem_addr(smem) & (Cfg::kRingAlign - 1))) & (Cfg::kRingAlign - 1));
    tiles = rings + warp * S * Cfg::kStageBytes;
    ring.base = smem_addr(smem + Cfg::kBarOffset) + warp * S * 8;
    if (lane == 0) {
      for (int s = 0; s < S; ++s) ring.init_full(s, 1);
      fence_mbarrier_init();
    }
    __syncwarp();
  }

  // Stage s <- steps st0 .. st0+U-1 of group k of this warp (steps past
  // the split copy nothing).
  // The caller's __syncwarp orders the warp's reads of the stage before
  // the copies that overwrite it, as a consumer's release of an "empty"
  // barrier does in a producer/consumer TMA pipeline. (A proxy fence here
  // compiles to MEMBAR.ALL.CTA, which also waits for the page-id loads in
  // flight.)
  __device__ __forceinline__ void issue(int s, int k) {
    const int st0 = steps.first_step(k);
    const uint32_t bar = ring.full(s), dst = smem_addr(tiles) + s * Cfg::kStageBytes;
    uint32_t live = 0;
    int32_t page[U];
    steps.group_pages(k, page);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool page_ok = page[u] >= 0 && page[u] < p.num_blocks;
      bad_page |= !page_ok;  // corrupt table: never dereference, poison the output
      live |= uint32_t(st0 + u < steps.total_steps && page_ok) << u;
    }
    live_bits = (live_bits & ~(((1u << U) - 1) << (s * U))) | (live << (s * U));
    if (lane == 0) {
      if (live) {
        mbar_arrive_expect_tx(bar, __popc(live) * 2 * Cfg::kTileBytes);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (!((live >> u) & 1u)) continue;
          const int tok0 = steps.token0(st0 + u);
          const uint32_t kdst = dst + u * 2 * Cfg::kTileBytes;
#pragma unroll
          for (int x = 0; x < Cfg::kBoxes; ++x) {
            tma_load_4d(kdst + x * 16 * BB, &p.k_map, bar, x * BB, kv_head, tok0, page[u]);
            tma_load_4d(kdst + Cfg::kTileBytes + x * 16 * BB, &p.v_map, bar, x * BB, kv_head, tok0, page[u]);
          }
        }
      } else {
        mbar_arrive(bar);
      }
    }
  }

  // Byte `b` of token `tok`'s row in a swizzled tile: box b / BB, chunk
  // index XORed with bits of the token's 128-byte line index, as TMA's
  // 128B/64B/32B swizzle stores it (DecodeConfig, TMA ring).
  __device__ __forceinline__ static int tile_off(int tok, int b) {
    const int x = ((tok * BB) >> 7 & Cfg::kSwizzleMask) << 4;
    return (b / BB) * 16 * BB + tok * BB + ((b % BB) ^ x);
  }

  // Stage -> registers, in the layout the register path loads (header),
  // K vectors in Cfg::k_vector order.
  __device__ __forceinline__ void fill(StepBuffers<Cfg>& b, int s, int st0, uint32_t live) const {
    b.st0 = st0;
    b.live = live;
    constexpr int VB = Cfg::kKVecBytes, VVB = Cfg::kVVecBytes;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const uint8_t* kt = tiles + s * Cfg::kStageBytes + u * 2 * Cfg::kTileBytes;
      const uint8_t* vt = kt + Cfg::kTileBytes;
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int i = 0; i < Cfg::kKVecs; ++i)
          load_smem_vec<VB>(kt + tile_off(g + 8 * t, Cfg::k_vector(Cfg::kSwapOddTokens ? i ^ (g & 1) : i, c) * VB),
                            &b.kw[u][t][i * VB / 4]);
#pragma unroll
      for (int t = 0; t < 4; ++t)
#pragma unroll
        for (int i = 0; i < Cfg::kVVecs; ++i)
          load_smem_vec<VVB>(vt + tile_off(2 * c + Cfg::vtok(t), (i * 8 + g) * VVB), &b.vw[u][t][i * VVB / 4]);
    }
  }

  template <class Compute>
  __device__ __forceinline__ void run(Compute&& compute) {
#pragma unroll
    for (int s = 0; s < S; ++s) issue(s, s);
    int k = 0, s = 0;
    uint32_t parity = 0;
    while (steps.has_group(k)) {
      ring.wait_full(s, parity);
      StepBuffers<Cfg> b;
      fill(b, s, steps.first_step(k), (live_bits >> (s * U)) & ((1u << U) - 1));
      __syncwarp();
      issue(s, k + S);
      compute(b);
      ++k;
      if (++s == S) s = 0, parity ^= 1u;
    }
    __syncthreads();  // every ring is dead (no copy in flight): obuf may alias them
  }
};

}  // namespace metrale::kernels
