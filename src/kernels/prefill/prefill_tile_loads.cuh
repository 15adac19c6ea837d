// The prefill kernel's producer: one warpgroup fills a stage with the K and
// V tiles of kTileTokens consecutive positions of one kv head, as 16-bit
// swizzled shared-memory tiles (wgmma.cuh) in the MMA's operand type:
//   bf16   copied as it is, by TMA boxes (the sequence's partial last
//          16-position group by cp.async);
//   fp8    16 codes per 16-byte load -> 16 f16 (Fp8Format::unpack16);
//   nvfp4  32 codes + their two group scales -> 32 f16 (Nvfp4Format::unpack32).
// The dequantised values are the decode kernel's operands (code, or code *
// group scale * 2^-6, exact in f16); the per-tensor factors stay folded into
// the kernel's qk_log2_scale and v_factor. Positions at or past the
// sequence's length, and pages outside the cache, load zeros.
#pragma once

#include <cstdint>

#include "kernels/decode/decode_params.hpp"
#include "kernels/formats/bf16.cuh"
#include "kernels/formats/fp8.cuh"
#include "kernels/formats/nvfp4.cuh"
#include "kernels/prefill/prefill_config.cuh"
#include "kernels/prefill/wgmma.cuh"

namespace metrale::kernels {

// Where the rows of one sequence's kv head live: byte offsets of a
// position's row (codes; NVFP4 scales at a separate offset) in a cache.
struct PrefillRows {
  const int32_t* table;  // the sequence's block-table row
  int32_t seq_len;
  int32_t block_size;
  int32_t num_kv_heads;
  int32_t kv_head;
  int32_t num_blocks;
  int64_t page_stride;
  int64_t scale_offset;

  // The row index (t*H + h) inside its page and the page's byte offset, or
  // false where the position has no row to load.
  __device__ __forceinline__ bool locate(int32_t pos, int64_t& page_off, int32_t& row) const {
    if (pos >= seq_len) return false;
    const int32_t id = __ldg(table + pos / block_size);
    if (id < 0 || id >= num_blocks) return false;
    page_off = int64_t(id) * page_stride;
    row = (pos % block_size) * num_kv_heads + kv_head;
    return true;
  }
};

template <class Fmt, int D>
struct PrefillTileLoader;

// Each producer thread owns one token row of the tile (half a row at 64
// tokens per tile): one block-table lookup per thread and tile, and
// consecutive vectors of the row.
template <class Cfg, int kVectorsPerRow>
struct PrefillRowShare {
  static constexpr int kThreadsPerRow = 128 / Cfg::kTileTokens;
  static_assert(kThreadsPerRow * Cfg::kTileTokens == 128, "a warpgroup covers the tile's rows");
  static constexpr int kPerThread = kVectorsPerRow / kThreadsPerRow;
  __device__ __forceinline__ static int token(int pt) { return pt / kThreadsPerRow; }
  __device__ __forceinline__ static int first_vector(int pt) { return (pt % kThreadsPerRow) * kPerThread; }
};

// bf16: a stage's K or V tile is filled by TMA, one box of 16 positions x
// 128 bytes of one head's rows per (16-position group, 64-element chunk),
// straight into the swizzled operand layout (the decode kernel's tensor
// maps: 128-byte swizzle, boxes at 2 KB offsets, so TMA's swizzle is the
// MMA's). Lane g of the first warp looks up group g's page (lookup, before
// the stage is free) and issues its boxes, so a tile's page-id loads and
// box issues run side by side. A group reaching past the sequence's end
// (its last partial group, and groups past it) is copied row by row with
// cp.async instead, zeros past the end. One warp does all of it (kThreads):
// lane 0 announces the boxes' bytes on the full barrier before they are
// issued; every lane arrives once its copies landed.
template <int D>
struct PrefillTileLoader<Bf16Format, D> {
  using Cfg = PrefillConfig<Bf16Format, D>;
  static constexpr bool kTma = true;
  static constexpr int kThreads = 32;         // the producer threads that load
  static constexpr int kUnits = D / 8;        // 16-byte units per row
  static constexpr int kChunks = D / 64;      // 128-byte boxes per row
  static constexpr int kGroups = Cfg::kTileTokens / 16;
  static_assert(kGroups <= 32, "a lane per group");
  // Lane g's group of the tile at p0: its page id and position in the page
  // (looked up before the producer waits for the stage, off the critical path).
  struct Group {
    int32_t page, tok;
  };
  __device__ __forceinline__ static Group lookup(const PrefillRows& rows, int32_t p0, int pt) {
    const int32_t pos = p0 + 16 * pt;
    if (pt >= kGroups || pos + 16 > rows.seq_len) return {0, 0};
    return {__ldg(rows.table + pos / rows.block_size), pos % rows.block_size};
  }
  __device__ __forceinline__ static void load(const CUtensorMap* map, const uint8_t* cache, const PrefillRows& rows,
                                              int32_t p0, const Group& grp, uint32_t tile, uint32_t full, int pt) {
    const int whole = min(kGroups, max(0, (rows.seq_len - p0) / 16));  // groups inside the sequence
    if (pt == 0) wg::mbar_expect_tx(full, uint32_t(whole * kChunks * 2048));
    __syncwarp();
    if (pt < whole) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
        tma_load_4d(tile + uint32_t(c * Cfg::kTileTokens * 128 + pt * 2048), map, full, c * 128, rows.kv_head,
                    grp.tok, grp.page);
    }
    const int tail_rows = Cfg::kTileTokens - 16 * whole;
    for (int idx = pt; idx < tail_rows * kUnits; idx += kThreads) {
      const int t = 16 * whole + idx / kUnits, u = idx % kUnits;
      int64_t page_off = 0;
      int32_t row = 0;
      const bool ok = rows.locate(p0 + t, page_off, row);
      const int64_t off = ok ? page_off + (int64_t(row) * D + u * 8) * 2 : 0;
      wg::cp_async_16(tile + wg::swizzle_offset(Cfg::kTileTokens, t, u), cache + off, ok);
    }
    if (tail_rows > 0) {
      wg::cp_async_commit();
      wg::cp_async_wait<0>();
      wg::fence_proxy_async();
    }
    mbar_arrive(full);
  }
};

// The dequantising formats: fetch() loads one operand's raw bytes of the
// thread's row share into registers, store() converts them into the stage.
// The producer fetches K and V (all their loads in flight at once) before
// it waits for the stage.
struct PrefillRowAt {
  bool ok;          // the position has a row to load
  int64_t page_off;
  int32_t row;      // t * H + h inside the page
};
// Where the thread's row share of the tile at p0 lives (both dequantising
// loaders derive their at() from here).
template <class Share>
struct PrefillShareLocator {
  __device__ __forceinline__ static PrefillRowAt at(const PrefillRows& rows, int32_t p0, int pt) {
    PrefillRowAt at{false, 0, 0};
    at.ok = rows.locate(p0 + Share::token(pt), at.page_off, at.row);
    return at;
  }
};

// fp8: 16 codes per vector -> two 16-byte units of f16.
template <int D>
struct PrefillTileLoader<Fp8Format, D> : PrefillShareLocator<PrefillRowShare<PrefillConfig<Fp8Format, D>, D / 16>> {
  using Cfg = PrefillConfig<Fp8Format, D>;
  static constexpr bool kTma = false;
  static constexpr int kThreads = 128;  // every producer thread loads a row share
  using Share = PrefillRowShare<Cfg, D / 16>;  // 16-byte code vectors per row
  static constexpr int kPerThread = Share::kPerThread;
  struct Raw {
    uint4 c[kPerThread];
  };
  __device__ __forceinline__ static void fetch(const uint8_t* cache, const RunParams&, const PrefillRowAt& at, int pt,
                                               Raw& raw) {
    const uint4* src = reinterpret_cast<const uint4*>(cache + at.page_off + int64_t(at.row) * D +
                                                      Share::first_vector(pt) * 16);
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) raw.c[k] = at.ok ? __ldg(src + k) : make_uint4(0, 0, 0, 0);
  }
  __device__ __forceinline__ static void store(const Raw& raw, uint8_t* tile, int pt) {
    const int t = Share::token(pt);
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int u = Share::first_vector(pt) + k;
      uint4 h16[2];
      Fp8Format::unpack16(raw.c[k], h16);
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<uint4*>(tile + wg::swizzle_offset(Cfg::kTileTokens, t, 2 * u + h)) = h16[h];
    }
  }
};

// nvfp4: 32 codes and their two group scales per vector -> four units of f16.
template <int D>
struct PrefillTileLoader<Nvfp4Format, D> : PrefillShareLocator<PrefillRowShare<PrefillConfig<Nvfp4Format, D>, D / 32>> {
  using Cfg = PrefillConfig<Nvfp4Format, D>;
  static constexpr bool kTma = false;
  static constexpr int kThreads = 128;  // every producer thread loads a row share
  using Share = PrefillRowShare<Cfg, D / 32>;  // 16-byte code vectors (two scale groups) per row
  static constexpr int kPerThread = Share::kPerThread;
  struct Raw {
    uint4 c[kPerThread];
    uint32_t s[kPerThread];
  };
  __device__ __forceinline__ static void fetch(const uint8_t* cache, const RunParams& p, const PrefillRowAt& at,
                                               int pt, Raw& raw) {
    const int u0 = Share::first_vector(pt);
    const uint4* src = reinterpret_cast<const uint4*>(cache + at.page_off + int64_t(at.row) * (D / 2) + u0 * 16);
    const uint16_t* ssrc = reinterpret_cast<const uint16_t*>(cache + at.page_off + p.scale_offset +
                                                             int64_t(at.row) * (D / 16) + u0 * 2);
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      raw.c[k] = at.ok ? __ldg(src + k) : make_uint4(0, 0, 0, 0);
      raw.s[k] = at.ok ? __ldg(ssrc + k) : 0u;
    }
  }
  __device__ __forceinline__ static void store(const Raw& raw, uint8_t* tile, int pt) {
    const int t = Share::token(pt);
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int u = Share::first_vector(pt) + k;
      uint4 h16[4];
      Nvfp4Format::unpack32(raw.c[k], raw.s[k], h16);
#pragma unroll
      for (int h = 0; h < 4; ++h)
        *reinterpret_cast<uint4*>(tile + wg::swizzle_offset(Cfg::kTileTokens, t, 4 * u + h)) = h16[h];
    }
  }
};

}  // namespace metrale::kernels
