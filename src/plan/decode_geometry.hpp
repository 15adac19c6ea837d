// The geometry of the CUDA decode kernel that its planner counts with: how
// many q heads one CTA serves, how many CTAs an SM holds, when two kv heads
// share a CTA, the largest cluster of split CTAs. CUDA-free: the planner
// (src/plan) and the kernels (src/kernels/decode) both include it, so the
// grid the planner counts is the grid the launcher launches.
#pragma once

#include <cstdint>

namespace metrale::geometry {

// q heads one decode CTA serves: the N of its m16n8k16 MMAs.
constexpr int32_t kDecodeQHeadsPerCta = 8;

// Resident decode CTAs per SM the split planner fills (~255 registers x
// 128 threads: 2 fit an SM).
constexpr int32_t kDecodeCtasPerSm = 2;

// Largest split count merged inside a cluster of the split CTAs (the
// portable cluster size).
constexpr int32_t kMaxClusterSplits = 8;

// Splits shorter than this cost more (prologue, epilogue, record) than
// their parallelism gains: two 16-token steps per warp of a 4-warp CTA.
constexpr int32_t kMinTokensPerSplit = 128;

// The runs kernel's n-tiles of 8 columns per CTA for `columns` (query row,
// q head) columns of a kv head: every dequantised K/V fragment feeds that
// many MMAs, so a run's rows share one read of the pages. Two at head_dim
// <= 128 (a thread then holds 2 x 32 accumulators of O^T and 2 x 16 words
// of Q^T at head_dim 128); head_dim 256 keeps one (its accumulators alone
// are 64 registers per n-tile).
//
// NVFP4 at head_dim 256 splits head_dim over teams of two warps instead
// (head_dim_parts 2: each warp loads, dequantises and accumulates half of
// every row; DecodeConfig's HP), so an n-tile costs a thread half the
// registers and it takes two: a run of 4 rows at GQA 4 dequantises its pages
// once, not twice (whole rows where the columns fit one n-tile: there the
// teams' duplicated softmax and exchange cost more than they save). At
// head_dim 128, which has two n-tiles of whole rows, the teams lose to the
// prefill kernel (docs/query_runs.md).
constexpr int32_t kMaxRunsColTiles = 2;
constexpr bool runs_can_split_head_dim(bool scaled_format, int32_t head_dim) {
  return scaled_format && head_dim == 256;
}
constexpr int32_t runs_col_tiles(int32_t head_dim, int32_t head_dim_parts, int64_t columns) {
  return (head_dim <= 128 || head_dim_parts == 2) && columns > kDecodeQHeadsPerCta ? kMaxRunsColTiles : 1;
}

// The prefill kernel (kernels/prefill): a CTA serves this many packed
// (query row, q head) rows of one kv head, the rows j of a run and the
// group's heads h in order (j * group + h), in tiles counted from the run's
// end. The planner takes it for query runs of at least
// kPrefillMinRows rows per kv head (fewer: the runs kernel,
// whose CTAs serve 8-16 columns and split the pages): it reads a kv head's
// pages once for up to 128 rows, where the runs kernel reads them once per
// 16 columns. On the H200 (d128, GQA 4, 1 x 32768 to 64 x 4096) the
// prefill kernel is the faster one from 8 verification tokens (32 rows) in
// every format (a tile of at most 64 rows has one consumer, and for fp8 /
// NVFP4 two dequantising producers); 4 tokens (16 rows) stay on the runs
// kernel, which is faster there in every format.
constexpr int32_t kPrefillRowsPerCta = 128;
constexpr int32_t kPrefillMinRows = 32;
// Those short runs were measured over 4096-32768 attended positions only;
// over fewer, where a CTA's fixed costs (its Q, the ring's fill) weigh more,
// runs of fewer than kPrefillRowsPerCta rows keep the runs kernel.
constexpr int32_t kPrefillShortRunsMinAttended = 4096;
// Its splits (split-K, where its grid alone would leave SMs idle) hold at
// least this many positions: 8 tiles of 128, against a CTA's fixed costs
// (its Q, the ring's fill, a record of 128 rows). The counts it gives were
// the fastest of 1-16 forced at 64-512 tokens over 32768; the threshold
// itself was not swept.
constexpr int32_t kPrefillMinTokensPerSplit = 1024;
// Its grid is (kv heads x splits, sequences, tiles): y and z at most 65535.
constexpr int64_t kPrefillMaxGridYZ = 65535;
// CTA pairs (docs/prefill.md): two adjacent row tiles of a run as a cluster,
// each CTA's producer filling every other K / V tile into both. The
// dequantising producers at head_dim 256 have no registers for the pair's
// code (56-64 per thread: ptxas spilled 214-286 bytes), so they run alone.
constexpr bool prefill_can_pair_tiles(bool dequantised, int32_t head_dim) { return !dequantised || head_dim < 256; }
// The planner pairs where a CTA walks enough K / V tiles: at head_dim 128
// and 256, from 2048 attended positions, in every format; below that the
// pair's barrier at its start and its lockstep over a few tiles cost more
// than the shared loads save. Not at head_dim 64, where pairs lost at about
// as many shapes as they gained.
constexpr int64_t kPrefillPairsMinAttended = 2048;
constexpr bool prefill_pairs_tiles(bool dequantised, int32_t head_dim, int64_t attended) {
  return prefill_can_pair_tiles(dequantised, head_dim) && head_dim >= 128 && attended >= kPrefillPairsMinAttended;
}

// head_dim 64: a CTA serves two adjacent kv heads as one head of head_dim
// 128 (their rows are adjacent in a token's row of the cache), their q
// heads side by side in its 8 columns. Half-width rows put the per-step
// costs of the kernel on half the bytes (fp8 0.58-0.63 R against 0.83-0.87
// at head_dim 128). Pairing halves the CTAs of a batch, so it is chosen
// only where the batch still fills a third of a resident wave (at most 2
// splits): split shapes doubled their splits and lost (clusters of 4, or
// 66 splits at 1x32768).
constexpr bool decode_can_pair_kv_heads(int32_t head_dim, int32_t num_kv_heads, int32_t group) {
  return head_dim == 64 && num_kv_heads % 2 == 0 && 2 * group <= kDecodeQHeadsPerCta;
}
constexpr bool decode_pairs_kv_heads(int32_t head_dim, int32_t num_kv_heads, int32_t group, int64_t num_seqs,
                                     int32_t num_sms) {
  return decode_can_pair_kv_heads(head_dim, num_kv_heads, group) &&
         3 * num_seqs * (num_kv_heads / 2) > int64_t(num_sms) * kDecodeCtasPerSm;
}

}  // namespace metrale::geometry
