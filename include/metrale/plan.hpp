// The decode plan: every launch decision of one decode batch shape (single
// pass or split-K and num_splits, kv-head pairing, load path, how splits
// merge, the grid, the workspace), made by ONE function, plan_decode. The
// support check, the workspace sizing and both backends' launchers all go
// through it; run_decode launches what the plan says and decides nothing.
//
// Host-only and cheap: plan once per batch shape, reuse the plan for every
// layer; running a plan never allocates or synchronises. A plan made for
// num_seqs sequences runs any batch of the same heads and layout with at
// most num_seqs sequences and any lengths (the plan is a performance
// choice, not a correctness one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "metrale/cache.hpp"
#include "metrale/ops.hpp"

namespace metrale {

struct DecodeProblem {
  int32_t num_seqs = 0;
  int32_t num_q_heads = 0;
  KvCacheLayout layout;        // format, heads, head_dim, block_size
  int32_t max_seq_len = 0;     // longest sequence of the batch (an upper bound is fine)
  int32_t sliding_window = 0;  // 0 = off
  // Query runs (SYSTEM.md 8): the longest run and the rows of all runs (upper
  // bounds are fine). 1 and 0 (= num_seqs): decode.
  int32_t max_q_len = 1;
  int32_t num_q_rows = 0;
  // Sinks, soft-cap or lse requested: the runs kernel serves them (decode too).
  bool attn_options = false;
  // Rows given as runs (q_start), whatever their lengths: the runs kernel.
  bool query_runs = false;

  // Whether the plan's kernel is the runs kernel (one definition).
  bool runs_kernel() const { return query_runs || max_q_len > 1 || attn_options; }
};

// The query rows a problem's plan is made for (num_q_rows, or num_seqs).
inline int32_t decode_problem_rows(const DecodeProblem& p) { return p.num_q_rows > 0 ? p.num_q_rows : p.num_seqs; }

// The problem of a call's arguments. `max_seq_len` < 0: the block table's
// capacity (max_blocks_per_seq * block_size), an upper bound of every length;
// `max_q_len` <= 0 for query runs: that capacity too (runs are never longer
// than their sequence).
DecodeProblem decode_problem(const DecodeArgs& args, int32_t max_seq_len = -1);
DecodeProblem decode_problem(const PagedAttnArgs& args, int32_t max_seq_len = -1, int32_t max_q_len = -1);

// How a CTA brings K/V tiles to its registers: straight from global memory,
// or through TMA copies into a shared-memory ring (bf16 and fp8 only).
enum class DecodeLoadPath : uint8_t { automatic, registers, tma };
// How the splits of a split-K plan merge: none (single pass), inside a
// thread-block cluster of the split CTAs through distributed shared memory,
// or through the f32 workspace and the reduce kernel.
enum class DecodeMerge : uint8_t { automatic, single_pass, cluster, workspace };
// Whether a CTA serves two adjacent kv heads of head_dim 64 as one of 128.
enum class DecodePairing : uint8_t { automatic, off, on };
// Whether query runs take the prefill kernel (tensor-core tiles of 128
// packed (query row, q head) rows per CTA, split-K through the workspace;
// kernels/prefill)
// instead of the runs kernel (8-16 columns per CTA, split-K).
enum class DecodePrefill : uint8_t { automatic, off, on };

const char* to_string(DecodeLoadPath p);
const char* to_string(DecodeMerge m);
const char* to_string(DecodePairing p);
const char* to_string(DecodePrefill p);
// The inverses of to_string (benchmark flags, Python); InvalidArgument naming
// `arg` and listing the names.
DecodeLoadPath decode_load_path_from_string(const std::string& name, const char* arg = "load_path");
DecodeMerge decode_merge_from_string(const std::string& name, const char* arg = "merge");
DecodePairing decode_pairing_from_string(const std::string& name, const char* arg = "pairing");
DecodePrefill decode_prefill_from_string(const std::string& name, const char* arg = "prefill");

// Decisions a caller (a benchmark, a test, a forced entry point) takes
// instead of the planner; `automatic` / 0 leave them to it. A forced choice
// the problem or the target cannot run throws Unsupported.
struct DecodePlanOptions {
  int32_t num_splits = 0;  // 0 = the planner's; 1 = single pass; up to kMaxSplits
  DecodePairing pairing = DecodePairing::automatic;
  DecodeLoadPath load_path = DecodeLoadPath::automatic;
  DecodeMerge merge = DecodeMerge::automatic;
  int32_t col_tiles = 0;  // runs kernel: 0 = the planner's; 1 or 2 n-tiles of 8 columns per CTA
  // runs kernel: 0 = the planner's; 1; 2 = head_dim split over the two warps
  // of a team (NVFP4 at head_dim 256, with 2 column tiles)
  int32_t head_dim_parts = 0;
  DecodePrefill prefill = DecodePrefill::automatic;  // on: query runs in the prefill kernel
  // The prefill kernel's launch order (prefill on only): -1 = the planner's;
  // 0 = the 3-D grid; n > 0 = bands of n row tiles on a 1-D grid (at most
  // the plan's head_tiles).
  int32_t tile_band = -1;
  // The prefill kernel's CTA pairs (prefill on only): -1 = the planner's; 0 =
  // off; 1 = clusters of two adjacent row tiles sharing their K / V loads
  // wherever a run has two tiles.
  int32_t tile_pairs = -1;
};

// One decode kernel instantiation: format x the kernel's head_dim (128 for a
// pair of 64) x load path x pairing.
struct DecodeKernelId {
  KvFormat format = KvFormat::bf16;
  int32_t head_dim = 0;
  DecodeLoadPath load_path = DecodeLoadPath::registers;
  bool pair_kv_heads = false;
  bool runs = false;  // the query-runs kernel (runs of several rows, sinks, soft-cap, lse)
  int32_t col_tiles = 1;  // runs kernel: n-tiles of 8 (query row, q head) columns per CTA
  int32_t head_dim_parts = 1;  // runs kernel: 2 = head_dim split over teams of two warps
  bool prefill = false;   // the prefill kernel (query runs; format x head_dim)
  bool tile_pairs = false;  // prefill: launched as CTA pairs (clusters of two row tiles)
};

// What the planner knows of the machine that runs the plan:
// cuda::decode_target() (the current GPU) or cpu::decode_target().
struct DecodeTarget {
  int32_t num_sms = 0;  // multiprocessors (the CPU backend: worker threads)
  bool tma = false;     // TMA tensor maps can be encoded (the driver's encoder is there)
  int64_t l2_bytes = 0; // the L2 cache's size (0: unknown)
  // Most clusters of `cluster_size` CTAs of `kernel` resident on the GPU at
  // once; empty or 0: no cluster launches.
  std::function<int64_t(const DecodeKernelId& kernel, int32_t cluster_size)> resident_clusters;
};

struct DecodePlan {
  DecodeProblem problem;                                // what it was made for
  int32_t num_splits = 1;                               // 1 = single pass
  bool pair_kv_heads = false;                           // CTAs serve kv-head pairs (head_dim 64)
  DecodeLoadPath load_path = DecodeLoadPath::registers;
  DecodeMerge merge = DecodeMerge::single_pass;
  // The grid: (num_seqs * ctas_per_seq, num_splits), clusters of num_splits
  // CTAs along y when merge == cluster. A CTA serves one (sequence, kv head
  // or head pair, tile of geometry::kDecodeQHeadsPerCta q heads, split).
  int32_t kv_units = 0;      // kv heads (or pairs) per sequence
  int32_t unit_group = 0;    // q heads per kv unit
  int32_t col_tiles = 1;     // n-tiles of 8 columns per CTA (geometry::runs_col_tiles)
  int32_t head_dim_parts = 1;  // 2: head_dim split over teams of two warps (geometry::runs_head_dim_parts)
  // The prefill kernel: a CTA per (split, kv head, sequence, tile of
  // kPrefillRowsPerCta packed rows of its run): a grid (kv_units *
  // num_splits, num_seqs, head_tiles), or where the sequences' K and V exceed
  // L2 the same CTAs on a one-dimensional grid started in bands of tile_band
  // tiles (docs/prefill.md); its splits merge through the workspace.
  bool prefill = false;
  int32_t head_tiles = 0;    // tiles of 8 * col_tiles columns (prefill: of 128 rows) per kv unit
  int32_t tile_band = 0;     // prefill: row tiles per band of the launch order (0: the 3-D grid)
  // prefill: CTA pairs, clusters of two adjacent row tiles of a run that walk
  // the same K / V tiles, each CTA's producer filling every other one into
  // both (head_tiles and tile_band are then even; docs/prefill.md)
  bool tile_pairs = false;
  int64_t ctas_per_seq = 0;  // kv_units * head_tiles
  size_t workspace_bytes = 0;  // f32 split-K workspace the run needs (merge == workspace), else 0

  DecodeKernelId kernel() const;
  int64_t grid_x(int32_t num_seqs) const { return int64_t(num_seqs) * ctas_per_seq; }
};

// The one decision function. Throws InvalidArgument on a malformed problem
// or target and Unsupported on a forced choice that cannot run.
DecodePlan plan_decode(const DecodeProblem& problem, const DecodeTarget& target, const DecodePlanOptions& options = {});

// Debug validator (SYSTEM.md 6): checks, on host copies, that every length is
// in [0, max_blocks_per_seq * block_size] and that every page a sequence
// attends to is a valid page of the cache. Throws InvalidArgument naming the
// first bad sequence.
void validate_block_tables(const KvCacheLayout& layout, const int32_t* block_tables, int32_t max_blocks_per_seq,
                           const int32_t* seq_lens, int32_t num_seqs, int32_t sliding_window = 0);

}  // namespace metrale
