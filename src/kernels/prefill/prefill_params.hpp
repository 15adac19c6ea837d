// Device parameters of the prefill kernel (prefill_kernel.cuh): the user's
// AttnArgs and the plan's decisions converted once (make_prefill_params:
// factors folded, layout flattened), passed by value as one
// __grid_constant__ struct. Which instantiation runs (format, head_dim, CTA
// pairs) is the plan's and not repeated here.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "metrale/codec.hpp"

namespace metrale {
struct AttnArgs;
struct AttnPlan;
}  // namespace metrale

namespace metrale::kernels {

struct PrefillParams {
  // TMA descriptors of the K and V caches (kv_tensor_map.hpp): boxes of 16
  // tokens of one head's rows of one page; set for the TMA load path (bf16).
  CUtensorMap k_map;
  CUtensorMap v_map;
  const bf16* q;             // row r, head h at r*q_stride + h*q_head_stride
  int64_t q_stride;          // elements between rows
  int64_t q_head_stride;     // elements between heads
  const uint8_t* k_cache;    // page p at p*page_stride bytes
  const uint8_t* v_cache;
  int64_t page_stride;       // bytes
  int64_t scale_offset;      // NVFP4: bytes from a page's start to its scale section
  int32_t num_blocks;        // valid page ids are [0, num_blocks)
  const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq;
  const int32_t* seq_lens;   // [num_seqs]
  int32_t num_q_heads;
  int32_t num_kv_heads;
  int32_t group;             // q heads per kv head
  int32_t head_tiles;        // row tiles of kPrefillRowsPerCta packed rows per (kv unit, sequence)
  int32_t block_size;        // multiple of 16
  int32_t sliding_window;    // 0 = off
  float qk_log2_scale;       // sm_scale * log2(e) * K dequant factor
  float v_factor;            // V dequant factor applied to the output
  int32_t num_splits;
  bf16* out;                 // single pass: [rows, num_q_heads, D]
  float* workspace;          // split-K: records of D+2 floats (docs/spec.md 4)
  const int32_t* q_start;    // [num_seqs + 1] or null: one row per sequence
  const float* sinks;        // [num_q_heads] sink logits (natural log units), or null
  float softcap_scale;       // soft-cap c > 0: sm_scale * K factor / c (x = softcap_log2 * tanh(s * this))
  float softcap_log2;        // c * log2(e); 0: no soft-cap
  float* lse;                // [rows, num_q_heads] of the single pass, or null
  int32_t tile_band;         // launch order: row tiles per band (plan.launch.tile_band), 0: a 3-d grid
};

struct PrefillStageParams;

// The plan's arguments for the prefill kernel: validated `a` (and, for
// split-K through the workspace, `workspace`); `staged` (a plan with
// launch.stage_kv): the staging kernel's params, whose bf16 pages and block
// table the kernel reads instead of the cache's. Throws CudaError where the
// driver cannot encode the TMA plan's page maps.
PrefillParams make_prefill_params(const AttnPlan& plan, const AttnArgs& a, float* workspace,
                                  const PrefillStageParams* staged = nullptr);

}  // namespace metrale::kernels
