// The prefill kernel's producer: one warpgroup fills a stage with the K and
// V tiles of kTileTokens consecutive positions of one kv head, as 16-bit
// swizzled shared-memory tiles (wgmma.cuh) in the MMA's operand type:
//   bf16   copied as it is, by TMA boxes (the sequence's partial last
//          16-position group by cp.async);
//   fp8    16 codes per 16-byte load -> 16 f16 (Fp8Format::unpack16);
//   nvfp4  32 codes + their two group scales -> 32 f16 (Nvfp4Format::unpack32);
//          both in whole rows per load instruction (PrefillVectorShare).
// The dequantised values are the decode kernel's operands (code, or code *
// group scale * 2^-6, exact in f16); the per-tensor factors stay folded into
// the kernel's qk_log2_scale and v_factor. Positions at or past the
// sequence's length, and pages outside the cache, load zeros.
#pragma once

#include <cstdint>

#include "kernels/formats/bf16.cuh"
#include "kernels/formats/fp8.cuh"
#include "kernels/formats/nvfp4.cuh"
#include "kernels/prefill/prefill_config.cuh"
#include "kernels/prefill/prefill_params.hpp"
#include "kernels/common/cp_async.cuh"
#include "kernels/common/wgmma.cuh"

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
  // CTA pairs (prefill_kernel.cuh): `boxes` false where the other CTA of the
  // pair issues the tile's boxes, and `multicast` (its CTA mask, else 0)
  // sends them to both; the tail rows each CTA copies for itself.
  __device__ __forceinline__ static void load(const CUtensorMap* map, const uint8_t* cache, const PrefillRows& rows,
                                              int32_t p0, const Group& grp, uint32_t tile, uint32_t full, int pt,
                                              bool boxes, uint16_t multicast) {
    const int whole = min(kGroups, max(0, (rows.seq_len - p0) / 16));  // groups inside the sequence
    if (pt == 0) wg::mbar_expect_tx(full, uint32_t(whole * kChunks * 2048));
    __syncwarp();
    if (pt < whole && boxes) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const uint32_t dst = tile + uint32_t(c * Cfg::kTileTokens * 128 + pt * 2048);
        if (multicast)
          tma_load_4d_multicast(dst, map, full, c * 128, rows.kv_head, grp.tok, grp.page, multicast);
        else
          tma_load_4d(dst, map, full, c * 128, rows.kv_head, grp.tok, grp.page);
      }
    }
    const int tail_rows = Cfg::kTileTokens - 16 * whole;
    for (int idx = pt; idx < tail_rows * kUnits; idx += kThreads) {
      const int t = 16 * whole + idx / kUnits, u = idx % kUnits;
      int64_t page_off = 0;
      int32_t row = 0;
      const bool ok = rows.locate(p0 + t, page_off, row);
      const int64_t off = ok ? page_off + (int64_t(row) * D + u * 8) * 2 : 0;
      cp_async_16_or_zero(tile + wg::swizzle_offset(Cfg::kTileTokens, t, u), cache + off, ok);
    }
    if (tail_rows > 0) {
      cp_async_commit();
      cp_async_wait<0>();
      wg::fence_proxy_async();
    }
    mbar_arrive(full);
  }
};

// The dequantising formats: fetch() loads one operand's raw bytes of the
// thread's share into registers, store() converts them into the stage.
// The producer fetches K and V (all their loads in flight at once) before
// it waits for the stage.
//
// The shares. A 16-byte vector of codes becomes kUnits 16-byte units of
// f16 (fp8 2, NVFP4 4). The tile's 16-position groups go to kGroupThreads
// threads each (16 at 128 positions per tile, a warp at 64), so a thread
// needs one page lookup per tile (block_size is a multiple of 16). Within
// a group, a quarter warp takes kUnits rows x 8 / kUnits vectors: lane i
// of the quarter the vector i % (8 / kUnits) of its vector block and the
// row i / (8 / kUnits) of its row block. Then
//   * a load instruction reads whole rows (kRowsPerLoad of them per group:
//     one row per thread read 32 rows' 16 bytes per load and kept the L1
//     near its throughput limit);
//   * in a store instruction (one unit j of every lane's vector) a quarter
//     warp's 8 units land in 8 different 16-byte bank groups: the vector
//     sets the swizzled unit's high bits, the row (through the swizzle,
//     wgmma.cuh) its low ones, and j and the instruction's row step are
//     the same for all 8 lanes;
//   * every store's address is a per-thread base, XOR a constant of
//     (j, k), plus a constant (the rows of a thread are r0 + kRowsPerLoad *
//     k, r0 < kRowsPerLoad, and the tile is 1024-byte aligned).
// (tools/prefill_vector_share_model.py checks all of it at every head_dim.
// Coalesced loads that rotate each lane's units and rows at run time for
// the same conflict-freedom double the producer's instructions.)
struct PrefillRowAt {
  bool ok;          // the thread's 16-position group has a page to load
  int64_t page_off;
  int32_t row;      // t * H + h inside the page of the thread's first row
  int32_t rows_in;  // positions inside the sequence from the thread's first row
};
template <class Cfg, int kVectors, int kUnits>
struct PrefillVectorShare {
  static constexpr int kT = Cfg::kTileTokens;
  static constexpr int kQuarterVectors = 8 / kUnits;                // a quarter's vectors of a row
  static constexpr int kQuarterRows = kUnits;                       // and its rows
  static constexpr int kGroupThreads = 128 * 16 / kT;               // threads per 16-position group
  static constexpr int kVectorBlocks = kVectors / kQuarterVectors;  // quarters per row
  static constexpr int kRowBlocks = kGroupThreads / 8 / kVectorBlocks;
  static constexpr int kRowsPerLoad = kRowBlocks * kQuarterRows;    // a group's rows per load instruction
  static constexpr int kCount = 16 / kRowsPerLoad;                  // vectors per thread
  static_assert(kVectors % kQuarterVectors == 0 && kRowBlocks >= 1 && kRowBlocks * kVectorBlocks * 8 == kGroupThreads,
                "a group's threads cover its rows");
  static_assert(kRowsPerLoad * kCount == 16 && (kRowsPerLoad & (kRowsPerLoad - 1)) == 0, "rows r0 + R * k");
  __device__ __forceinline__ static int group(int pt) { return pt / kGroupThreads; }
  __device__ __forceinline__ static int quarter(int pt) { return pt % kGroupThreads / 8; }
  // The thread's first row in its group and its vector of each row.
  __device__ __forceinline__ static int first_row(int pt) {
    return quarter(pt) / kVectorBlocks * kQuarterRows + pt % 8 / kQuarterVectors;
  }
  __device__ __forceinline__ static int vector(int pt) {
    return quarter(pt) % kVectorBlocks * kQuarterVectors + pt % 8 % kQuarterVectors;
  }
  __device__ __forceinline__ static PrefillRowAt at(const PrefillRows& rows, int32_t p0, int pt) {
    PrefillRowAt at{false, 0, 0, 0};
    const int32_t pos = p0 + 16 * group(pt);
    at.ok = rows.locate(pos, at.page_off, at.row);
    at.row += first_row(pt) * rows.num_kv_heads;
    at.rows_in = rows.seq_len - pos - first_row(pt);
    return at;
  }
  // Whether the thread's k-th row has data.
  __device__ __forceinline__ static bool loads(const PrefillRowAt& at, int k) {
    return at.ok && kRowsPerLoad * k < at.rows_in;
  }
  // The shared-memory address of the thread's k-th row's unit j (of its
  // vector) in the tile at `tile`: swizzle_offset() of row 16 g + r0 + R k,
  // unit kUnits * m + j, as a base XOR a constant plus a constant.
  struct Dst {
    uint32_t base;
    __device__ __forceinline__ Dst(uint32_t tile, int pt) {
      const int r0 = first_row(pt), m = vector(pt);
      base = tile + uint32_t(m / kQuarterVectors * kT * 128 + (16 * group(pt) + r0) * 128 +
                             (((kUnits * m) ^ r0) & 7) * 16);
    }
    __device__ __forceinline__ uint32_t operator()(int k, int j) const {
      return (base ^ uint32_t(((j ^ (kRowsPerLoad * k)) & 7) * 16)) + uint32_t(kRowsPerLoad * k * 128);
    }
  };
};

__device__ __forceinline__ void st_shared_16(uint32_t addr, const uint4& v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// fp8: 16 codes per vector -> two 16-byte units of f16.
template <int D>
struct PrefillTileLoader<Fp8Format, D> : PrefillVectorShare<PrefillConfig<Fp8Format, D>, D / 16, 2> {  // its at()
  using Cfg = PrefillConfig<Fp8Format, D>;
  static constexpr bool kTma = false;
  static constexpr int kThreads = 128;  // every producer thread loads
  using Share = PrefillVectorShare<Cfg, D / 16, 2>;  // 16-byte code vectors per row
  struct Raw {
    uint4 c[Share::kCount];
  };
  __device__ __forceinline__ static void fetch(const uint8_t* cache, const PrefillParams& p, const PrefillRowAt& at, int pt,
                                               Raw& raw) {
    const uint8_t* src = cache + at.page_off + int64_t(at.row) * D + Share::vector(pt) * 16;
    const int64_t step = int64_t(Share::kRowsPerLoad) * p.num_kv_heads * D;
#pragma unroll
    for (int k = 0; k < Share::kCount; ++k)
      raw.c[k] = Share::loads(at, k) ? __ldg(reinterpret_cast<const uint4*>(src + k * step)) : make_uint4(0, 0, 0, 0);
  }
  __device__ __forceinline__ static void store(const Raw& raw, uint8_t* tile, int pt) {
    const typename Share::Dst dst(smem_addr(tile), pt);
#pragma unroll
    for (int k = 0; k < Share::kCount; ++k) {
      uint4 h16[2];
      Fp8Format::unpack16(raw.c[k], h16);
#pragma unroll
      for (int j = 0; j < 2; ++j) st_shared_16(dst(k, j), h16[j]);
    }
  }
};

// nvfp4: 32 codes and their two group scales per vector -> four units of f16.
template <int D>
struct PrefillTileLoader<Nvfp4Format, D> : PrefillVectorShare<PrefillConfig<Nvfp4Format, D>, D / 32, 4> {  // its at()
  using Cfg = PrefillConfig<Nvfp4Format, D>;
  static constexpr bool kTma = false;
  static constexpr int kThreads = 128;  // every producer thread loads
  using Share = PrefillVectorShare<Cfg, D / 32, 4>;  // 16-byte code vectors (two scale groups) per row
  struct Raw {
    uint4 c[Share::kCount];
    uint32_t s[Share::kCount];
  };
  __device__ __forceinline__ static void fetch(const uint8_t* cache, const PrefillParams& p, const PrefillRowAt& at,
                                               int pt, Raw& raw) {
    const int m = Share::vector(pt);
    const uint8_t* src = cache + at.page_off + int64_t(at.row) * (D / 2) + m * 16;
    const uint8_t* ssrc = cache + at.page_off + p.scale_offset + int64_t(at.row) * (D / 16) + m * 2;
    const int64_t rows = int64_t(Share::kRowsPerLoad) * p.num_kv_heads;
#pragma unroll
    for (int k = 0; k < Share::kCount; ++k) {
      const bool ok = Share::loads(at, k);
      raw.c[k] = ok ? __ldg(reinterpret_cast<const uint4*>(src + k * rows * (D / 2))) : make_uint4(0, 0, 0, 0);
      raw.s[k] = ok ? __ldg(reinterpret_cast<const uint16_t*>(ssrc + k * rows * (D / 16))) : 0u;
    }
  }
  __device__ __forceinline__ static void store(const Raw& raw, uint8_t* tile, int pt) {
    const typename Share::Dst dst(smem_addr(tile), pt);
#pragma unroll
    for (int k = 0; k < Share::kCount; ++k) {
      uint4 h16[4];
      Nvfp4Format::unpack32(raw.c[k], raw.s[k], h16);
#pragma unroll
      for (int j = 0; j < 4; ++j) st_shared_16(dst(k, j), h16[j]);
    }
  }
};

}  // namespace metrale::kernels
