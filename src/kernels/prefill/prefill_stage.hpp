// The staged prefill's first kernel (plan/prefill_staging.hpp): the pages
// of each sequence's attended span, FP8 or NVFP4, dequantised to bf16 pages
// in the plan's workspace, and their block table. The bf16 prefill kernel
// then reads them (make_prefill_params points it there).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "metrale/codec.hpp"
#include "metrale/ops.hpp"
#include "metrale/plan.hpp"

namespace metrale::kernels {

struct PrefillStageParams {
  const uint8_t* k_cache;       // the cache's pages (AttnArgs::cache)
  const uint8_t* v_cache;
  int64_t page_stride;          // bytes
  int64_t scale_offset;         // NVFP4: bytes from a page's start to its scale section
  int32_t num_blocks;
  const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq;
  const int32_t* seq_lens;
  const int32_t* q_start;       // or null: one row per sequence
  int32_t block_size;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t sliding_window;
  int32_t slots;                // staged pages per sequence
  int32_t table_stride;         // staged block-table entries per sequence
  int32_t* table;               // staged: [num_seqs, table_stride], page ids into k / v
  bf16* k;                      // staged pages of page_elems elements each
  bf16* v;
  int64_t page_elems;
};

// The staging kernel's arguments for validated `a` of a plan with
// launch.stage_kv.
PrefillStageParams make_prefill_stage_params(const AttnPlan& plan, const AttnArgs& a, void* workspace);

// One CTA per (staged page slot, sequence, K or V) of `num_seqs` sequences, as a
// programmatic dependent of the stream's previous kernel.
void launch_prefill_stage(const PrefillStageParams& p, KvFormat format, int32_t num_seqs, cudaStream_t stream);

}  // namespace metrale::kernels
