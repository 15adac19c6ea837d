// The prefill kernel's K/V stages and the CTA-pair exchange over them.
//
// Each of K and V has a ring of kStages stages (common/mbarrier_ring.cuh):
// full barriers completed by the producer, empty ones by the consumers'
// warps. K and V have barriers of their own: a consumer gives K back once
// its QK completed, a step before V, so the producer refills K a step
// sooner.
//
// CTA pairs (kPairs; docs/prefill.md): two adjacent row tiles of a run,
// launched as a cluster, walk the same K / V tiles, and each CTA's producer
// fills every other tile into both CTAs' stages: bf16 by TMA multicast,
// fp8 / NVFP4 dequantised here and copied to the other CTA
// (cp.async.bulk). So each producer loads and converts half the tiles, and
// L2 serves each tile once per pair. A stage's empty barrier counts the
// releases of both CTAs' consumer warps.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/mbarrier_ring.cuh"
#include "kernels/common/tma.cuh"

namespace metrale::kernels {

template <class Cfg, class Loader, bool kPairs>
struct PrefillPair {
  using Ring = MbarrierRing<Cfg::kStages>;
  static_assert(Ring::kBytes * 2 == Cfg::kStages * 4 * 8, "K's and V's rings in the configuration's barrier bytes");

  uint32_t smem_base;
  bool paired;
  uint32_t peer = 0;  // a pair's other CTA
  int role;

  // op 0 = K, 1 = V.
  __device__ __forceinline__ Ring ring(int op) const {
    return Ring{smem_base + uint32_t(Cfg::kBarOffset + 8 * 2 * op * Cfg::kStages)};
  }
  __device__ __forceinline__ uint32_t stage_addr(int op, int s) const {
    return smem_base + uint32_t(op == 0 ? Cfg::kKOffset(s) : Cfg::kVOffset(s));
  }

  // Thread 0 initialises the barriers; every thread then waits until they
  // are (a pair: both CTAs', before either signals the other's).
  __device__ __forceinline__ void init(bool solo) {
    if (threadIdx.x == 0) {
      for (int op = 0; op < 2; ++op)
        for (int s = 0; s < Cfg::kStages; ++s) {
          // The producer's threads (a pair's dequantising producer: its warps, fill()).
          ring(op).init_full(s, paired && !Loader::kTma ? 4 : Loader::kThreads);
          // The consumers' warps (a pair: both CTAs').
          ring(op).init_empty(s, (paired ? 2 : 1) * (solo ? 4 : 4 * Cfg::kConsumers));
        }
      fence_mbarrier_init();
    }
    if (paired)
      cluster_sync();
    else
      __syncthreads();
    peer = kPairs ? cluster_ctarank() ^ 1u : 0u;
  }

  // This CTA's producer fills tile t (a pair: every other one).
  __device__ __forceinline__ bool owns(int t) const { return !paired || (t & 1) == role; }

  // A dequantising producer's stage s of operand op is filled: its threads
  // arrive, or in a pair one arrival per warp. The owner's warps each copy
  // the 32 rows they stored (their two 16-position groups, rows 32 w ..
  // 32 w + 31 of every 64-element chunk: PrefillVectorShare) to the other
  // CTA as soon as their own lanes are done, without waiting for the
  // warpgroup (faster than a named barrier and one copy of the tile); the
  // other CTA's first warp announces the bytes those copies bring.
  __device__ __forceinline__ void fill(int op, int s, bool own, int pt) const {
    if (!paired) {
      mbar_arrive(ring(op).full(s));
      return;
    }
    if constexpr (kPairs && !Loader::kTma) {
      static_assert(Cfg::kTileTokens == 128, "a warp's rows: 32 consecutive rows of each chunk");
      const int pw = pt / 32;
      __syncwarp();  // the warp's stores (each thread fenced them for the async proxy)
      if (pt % 32 != 0) return;
      if (own) {
        const uint32_t stage = stage_addr(op, s);
#pragma unroll
        for (int c = 0; c < Cfg::kHeadDim / 64; ++c) {
          const uint32_t rows = stage + uint32_t(c * Cfg::kTileTokens * 128 + pw * 32 * 128);
          bulk_copy_to_cluster(cluster_addr(rows, peer), rows, 32 * 128, cluster_addr(ring(op).full(s), peer));
        }
        mbar_arrive(ring(op).full(s));
      } else if (pw == 0) {
        mbar_arrive_expect_tx(ring(op).full(s), Cfg::kTileBytes);
      } else {
        mbar_arrive(ring(op).full(s));
      }
    }
  }

  // A pair's producer leaves once both CTAs' consumers gave back its last
  // stages: the other CTA's releases arrive on this CTA's barriers, so it
  // must not exit before them (CUTLASS's producer tail).
  __device__ __forceinline__ void drain(int num_tiles) const {
    if constexpr (kPairs) {
      for (int t = num_tiles; paired && t < num_tiles + Cfg::kStages; ++t) {
        ring(0).wait_empty(t);
        ring(1).wait_empty(t);
      }
    }
  }

  // A consumer warp gives back operand op of tile t (a pair: to both CTAs'
  // producers, as the other one fills it too).
  __device__ __forceinline__ void release(int op, int t, int lane) const {
    __syncwarp();
    if (lane == 0) {
      mbar_arrive(ring(op).empty(Ring::stage(t)));
      if (paired) mbar_arrive_cluster(cluster_addr(ring(op).empty(Ring::stage(t)), peer));
    }
  }
};

}  // namespace metrale::kernels
