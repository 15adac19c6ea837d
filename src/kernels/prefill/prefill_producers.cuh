// The prefill kernel's producers: the loops that fill the K/V stages of
// prefill_pair.cuh, in the order the consumers take them: K of tile t, then
// V of tile t - kVLag, each into stage t % kStages once the consumers gave
// that stage's operand back. With the overlap (Cfg::kOverlap) a consumer's
// step t runs QK of t with PV of t - 1 (kVLag 1); without it, QK and PV of
// t (kVLag 0). (With the overlap, K of t then V of t made K of t + 1 wait
// for V's later release, and the consumers waited for K; without it, V of
// t - 1 after K of t was slower for fp8 and NVFP4 at head_dim 256.)
//   PrefillTmaProducer      bf16: one warp issues TMA boxes (multicast to a pair)
//   PrefillDequantProducer  fp8, NVFP4: a warpgroup loads codes into registers,
//                           converts them and stores the f16 tiles
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/wgmma.cuh"
#include "kernels/prefill/prefill_pair.cuh"
#include "kernels/prefill/prefill_params.hpp"
#include "kernels/prefill/prefill_tile_loads.cuh"

namespace metrale::kernels {

template <class Cfg>
inline constexpr int kPrefillVLag = Cfg::kOverlap ? 1 : 0;

// The TMA producer (Loader::kTma): thread pt < Loader::kThreads of the
// producer warpgroup; p0_of(t): the first position of tile t. The page ids
// of tile t + 1 are looked up before the waits of step t (grp_next); V of
// tile t - kVLag takes the ids looked up a step before (grp_prev).
template <class Cfg, class Loader>
struct PrefillTmaProducer {
  typename Loader::Group grp, grp_prev;

  template <class Pair, class P0Of>
  __device__ __forceinline__ void run(const PrefillParams& p, const PrefillRows& rows, const Pair& pair,
                                      const P0Of& p0_of, int num_tiles, int pt) {
    constexpr int kVLag = kPrefillVLag<Cfg>;
    const uint16_t multicast = pair.paired ? uint16_t(3) : uint16_t(0);  // a pair's boxes land in both CTAs
    grp = Loader::lookup(rows, p0_of(0), pt);
    grp_prev = {};
    for (int t = 0; t < num_tiles + kVLag; ++t) {
      const typename Loader::Group grp_next = Loader::lookup(rows, p0_of(t + 1), pt);
      if (t < num_tiles) {
        pair.ring(0).wait_empty(t);
        Loader::load(&p.k_map, p.k_cache, rows, p0_of(t), grp, pair.stage_addr(0, t % Cfg::kStages),
                     pair.ring(0).full(t % Cfg::kStages), pt, pair.owns(t), multicast);
      }
      if (t >= kVLag) {
        const int tv = t - kVLag;
        pair.ring(1).wait_empty(tv);
        Loader::load(&p.v_map, p.v_cache, rows, p0_of(tv), kVLag ? grp_prev : grp,
                     pair.stage_addr(1, tv % Cfg::kStages), pair.ring(1).full(tv % Cfg::kStages), pt, pair.owns(tv),
                     multicast);
      }
      grp_prev = grp;
      grp = grp_next;
    }
    pair.drain(num_tiles);
  }
};

// Whether a solo CTA's two dequantising producers fetch K and V of one tile
// per step, both from the row located a step ahead: they take every other
// step, so V of t - 1 would be a tile the other one located, and locating
// it again put a block-table load before V's fetch in every step. NVFP4
// gains from it; fp8 keeps the consumers' order (its faster producers then
// wait longer for V's stage, which the consumers give back a step after
// K's). Alone, a producer keeps the consumers' order. Without a lag
// (head_dim 256) the two orders are one.
template <class Fmt, class Cfg>
inline constexpr bool kPrefillPairSameTile = Fmt::kBits == 4 && kPrefillVLag<Cfg> > 0;

// A dequantising producer (one warpgroup, pt its thread): the loads of
// steps first, first + step, ... (a solo CTA has two such producers);
// p0_of(t): the first position of tile t.
template <class Cfg, class Loader, class Pair, class P0Of>
struct PrefillDequantProducer {
  const PrefillParams& p;
  const PrefillRows& rows;
  const Pair& pair;
  uint8_t* smem;  // the CTA's (aligned) shared memory
  const P0Of& p0_of;
  int num_tiles;

  // same_tile (std::bool_constant): each step fetches K and V of one tile
  // (kPrefillPairSameTile).
  template <class SameTile>
  __device__ void run(SameTile, int first, int step, int pt) const {
    constexpr int kLag = SameTile::value ? 0 : kPrefillVLag<Cfg>;
    // Each step's K row is located a step ahead (its block-table load runs
    // under the step before), so K's fetch waits for its data alone, not
    // for a table load first.
    PrefillRowAt at_k = Loader::at(rows, p0_of(first), pt);
    for (int t = first; t < num_tiles + kLag; t += step) {
      typename Loader::Raw rk, rv;
      const int tv = t - kLag;
      // A pair's producer converts the tiles it owns and copies them to
      // the other CTA too; of the others it only announces the bytes.
      const bool own_k = t < num_tiles && pair.owns(t), own_v = tv >= 0 && pair.owns(tv);
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
        pair.ring(0).wait_empty(t);
        if (own_k) {
          Loader::store(rk, smem + Cfg::kKOffset(s), pt);
          wg::fence_proxy_async();
        }
        pair.fill(0, s, own_k, pt);
      }
      if (tv >= 0) {
        const int s = tv % Cfg::kStages;
        if constexpr (Cfg::kFetchSplit) {
          if (own_v) Loader::fetch(p.v_cache, p, at_this, pt, rv);  // tv == t
        }
        pair.ring(1).wait_empty(tv);
        if (own_v) {
          Loader::store(rv, smem + Cfg::kVOffset(s), pt);
          wg::fence_proxy_async();
        }
        pair.fill(1, s, own_v, pt);
      }
    }
    pair.drain(num_tiles);
  }
};

}  // namespace metrale::kernels
