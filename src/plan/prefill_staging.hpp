// The staged prefill (docs/prefill.md): for a plan of the prefill kernel
// over an FP8 or NVFP4 cache, the pages of each sequence's attended span are
// first dequantised to bf16 pages in the plan's workspace, with a block
// table of their own, and the bf16 prefill kernel then runs over those. A
// prefill tile of K / V serves every row tile of its run: dequantised in
// the kernel's producer it is converted once per row tile, staged it is
// converted once. CUDA-free: the planner sizes the workspace with it and
// the CUDA launcher places the staged pages with it, so the two cannot
// drift.
#pragma once

#include <cstddef>
#include <cstdint>

#include "metrale/plan.hpp"

namespace metrale::geometry {

// The planner stages runs of at least this many query rows (tokens). On the
// H200 (head_dim 128, 32 / 8 heads, 2026-12-04) staging made FP8 / NVFP4
// prompts of 2048-16384 tokens 1.05-1.24x faster, within 0.96-1.03x of
// bf16's own time; prompts of 1024 tokens and batches of short ones (4 x
// 1024, 16 x 512, 64 x 256) ran 0.75-1.02x: there the bf16 kernel's
// 176-position tiles lose to the dequantising kernel's 128 over short causal
// spans, and the staging pass does not pay for itself.
constexpr int32_t kPrefillStageMinRun = 2048;

// Where the staged pages live: a region of the workspace after the split-K
// records (the plan's workspace_bytes less this region's bytes), its start
// aligned up to kPrefillStageAlign, holding the staged block table, then the K pages,
// then the V pages, each a bf16 page of the cache's block_size, kv heads
// and head_dim (row (token, head) at (token * H + head) * D).
constexpr size_t kPrefillStageAlign = 256;
struct PrefillStaging {
  int32_t table_stride = 0;  // staged block-table entries per sequence: ceil(max_seq_len / block_size)
  int32_t slots = 0;         // staged pages per sequence: the most an attended span can cover
  int64_t page_bytes = 0;    // one bf16 page
  size_t table_offset = 0;   // offsets from the aligned region start
  size_t k_offset = 0;
  size_t v_offset = 0;
  size_t bytes = 0;          // the region, with kPrefillStageAlign of slack to align its start
};

// The region of a problem: every sequence of the plan's bounds
// (num_seqs, max_seq_len, and with a window max_q_len: a run's span is its
// rows' windows, run_len - 1 + window positions).
PrefillStaging prefill_staging(const AttnProblem& p);

}  // namespace metrale::geometry
