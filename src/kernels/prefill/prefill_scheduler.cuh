// The prefill kernel's tile scheduler: which rows of which query run a CTA
// serves, and which K/V tiles of the run's pages it walks.
//
// One CTA per (kv unit, sequence, tile of kRows packed rows), the packed row
// of query row j and q head h of the group being j * group + h, so the q
// heads that share a kv head are served by one pass over its pages. Tiles
// are counted from the run's end (tile 0 holds its last rows), so the CTAs
// with the most positions to attend start first; the first tile of a run
// may be partial. Where the sequences' K and V exceed L2 (p.tile_band > 0)
// the grid is one-dimensional, in bands of tiles, kv unit after kv unit
// within a band (prefill_item): the CTAs running at once read few kv heads'
// pages, not every head's. A CTA attends the positions its rows attend
// together, from its first row's window start to its last row's position,
// in tiles of kTileTokens.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/sequence_run.cuh"
#include "kernels/prefill/prefill_params.hpp"
#include "metrale/ops.hpp"

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

// This CTA's item. A three-dimensional grid (tile_band 0) is (unit,
// sequence, tile). CTA pairs: clusters of two CTAs along z, or along x on
// the one-dimensional grid, whose bands then order pairs of tiles.
template <bool kPairs>
__device__ __forceinline__ PrefillItem prefill_cta_item(const PrefillParams& p) {
  constexpr int pair_ctas = kPairs ? 2 : 1;
  PrefillItem item = PrefillItem{int(blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
  if (p.tile_band > 0) {
    item = prefill_item(blockIdx.x / pair_ctas, gridDim.x / pair_ctas, unsigned(p.num_kv_heads * p.num_splits),
                        unsigned(p.head_tiles / pair_ctas), unsigned(max(p.tile_band / pair_ctas, 1)));
    item.tile = item.tile * pair_ctas + int(blockIdx.x % pair_ctas);
  }
  return item;
}

// The CTA's rows and tiles. rows() reads the run's length (after the
// dependent-launch wait); a CTA with no rows leaves before span().
//
// CTA pairs: tiles 2k (role 0) and 2k + 1 (role 1) of a run, a cluster,
// walk the same K / V tiles (the union of their spans); the pair is formed
// where tile 2k + 1 has more than 64 rows, otherwise both run alone.
// A tile of at most 64 rows (verification, a run's partial first tile) is
// solo: it has none in consumer 0's half.
template <int kM, int kN, bool kPairs>
struct PrefillTile {
  int kv_head, split;
  int64_t seq;
  int tile;                 // from the run's end
  int32_t seq_len, row0, run_len, group;
  int32_t row_hi;           // the tile's packed rows [row_lo, row_hi)
  int32_t pair_hi;          // the pair's rows [pair_hi - 2 kM, pair_hi)
  bool paired;              // launched as a pair and paired with its neighbour
  int role;                 // 0 or 1 in its pair
  int32_t row_lo;           // negative in a run's partial first tile
  int32_t first_row;
  bool solo;
  int32_t p_begin;          // the first position of the CTA's first tile
  int num_tiles;            // its tiles of kN positions

  __device__ __forceinline__ void rows(const PrefillParams& p, const PrefillItem& item) {
    kv_head = item.unit % p.num_kv_heads;
    split = item.unit / p.num_kv_heads;
    seq = item.seq;
    tile = item.tile;
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    seq_len = clamped_seq_len(p, seq);
    const QueryRun run = query_run(p, seq, seq_len);
    row0 = run.row0;
    run_len = run.len;
    group = p.group;
    const int32_t packed = run_len * group;  // the run's packed rows
    row_hi = packed - tile * kM;
    pair_hi = packed - (tile & ~1) * kM;
    paired = kPairs && pair_hi - 2 * kM + 64 > 0;
    role = tile & 1;
  }

  __device__ __forceinline__ QueryRange range_of(const PrefillParams& p, int32_t packed_row) const {
    return query_range(seq_len, run_len, packed_row / group, p.sliding_window);
  }

  // The span's tiles from a page-group boundary; a split takes its share of
  // them by the runs kernel's rule (split_pages over tiles; none: an empty
  // record).
  __device__ __forceinline__ void span(const PrefillParams& p) {
    row_lo = row_hi - kM;
    first_row = max(row_lo, 0);
    solo = row_lo + 64 <= 0;
    const int32_t span_begin = range_of(p, paired ? max(pair_hi - 2 * kM, 0) : first_row).begin;
    const int32_t span_end = range_of(p, (paired ? pair_hi : row_hi) - 1).end;
    const int32_t span_first = span_begin & ~15;
    const int32_t span_tiles = span_end > span_first ? (span_end - span_first + kN - 1) / kN : 0;
    const PageRange my_tiles = split_pages(PageRange{0, span_tiles}, split, p.num_splits);
    p_begin = span_first + my_tiles.first * kN;
    num_tiles = my_tiles.end - my_tiles.first;
  }

  __device__ __forceinline__ int32_t p0_of(int t) const { return p_begin + t * kN; }
};

}  // namespace metrale::kernels
