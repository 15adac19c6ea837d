// Internal: the kernel geometry an AttnPlan carries for its launcher (the
// planner fills it, the backends read it). Not a stable interface: callers
// read AttnPlan's public fields (kernel, num_splits, merge, workspace_bytes).
#pragma once

#include <cstdint>

#include "metrale/cache.hpp"

namespace metrale::detail {

// How a CTA brings K/V tiles to its registers: straight from global memory,
// or through TMA copies into a shared-memory ring (bf16 and fp8 only).
// `automatic` is a tuning choice (plan/tuning.hpp), never a plan's value.
enum class LoadPath : uint8_t { automatic, registers, tma };

// One kernel instantiation: format x the kernel's head_dim (128 for a pair
// of 64) x load path x pairing x the runs kernel's column tiles and head_dim
// parts, or the prefill kernel with or without CTA pairs.
struct KernelId {
  KvFormat format = KvFormat::bf16;  // the pages it reads: bf16 for a staged prefill (KernelLaunch::stage_kv)
  int32_t head_dim = 0;
  LoadPath load_path = LoadPath::registers;
  bool pair_kv_heads = false;
  bool runs = false;          // the query-runs kernel (runs of several rows, sinks, soft-cap, lse)
  int32_t col_tiles = 1;      // runs kernel: n-tiles of 8 (query row, q head) columns per CTA
  int32_t head_dim_parts = 1; // runs kernel: 2 = head_dim split over teams of two warps
  bool prefill = false;       // the prefill kernel (query runs; format x head_dim)
  bool tile_pairs = false;    // prefill: launched as CTA pairs (clusters of two row tiles)
};

// The grid: (num_seqs * ctas_per_seq, num_splits), clusters of num_splits
// CTAs along y for the cluster merge. A decode / runs CTA serves one
// (sequence, kv head or head pair, tile of 8 * col_tiles columns, split). The
// prefill kernel: a CTA per (split, kv head, sequence, tile of 128 packed
// rows of its run): a grid (kv_units * num_splits, num_seqs, head_tiles), or
// where the sequences' K and V exceed L2 the same CTAs on a one-dimensional
// grid started in bands of tile_band tiles (docs/prefill.md).
struct KernelLaunch {
  bool pair_kv_heads = false;  // CTAs serve kv-head pairs (head_dim 64)
  LoadPath load_path = LoadPath::registers;
  int32_t kv_units = 0;        // kv heads (or pairs) per sequence
  int32_t unit_group = 0;      // q heads per kv unit
  int32_t col_tiles = 1;       // runs kernel: n-tiles of 8 columns per CTA
  int32_t head_dim_parts = 1;  // runs kernel: 2 = head_dim split over teams of two warps
  int32_t head_tiles = 0;      // tiles of 8 * col_tiles columns (prefill: of 128 rows) per kv unit
  int32_t tile_band = 0;       // prefill: row tiles per band of the launch order (0: the 3-D grid)
  // prefill: CTA pairs, clusters of two adjacent row tiles of a run that walk
  // the same K / V tiles (head_tiles and tile_band are then even)
  bool tile_pairs = false;
  // prefill over FP8 / NVFP4: the attended pages are dequantised to bf16
  // pages in the workspace first (plan/prefill_staging.hpp), and the bf16
  // prefill kernel reads those
  bool stage_kv = false;
  int64_t ctas_per_seq = 0;    // kv_units * head_tiles
};

}  // namespace metrale::detail
