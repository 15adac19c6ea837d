// Device parameters of the paged decode kernel: the user's AttnArgs and
// the plan's decisions converted once (factors folded, layout flattened),
// passed by value. Which instantiation runs (format, head_dim, load path,
// pairing) is the plan's and not repeated here.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "metrale/codec.hpp"
#include "plan/decode_geometry.hpp"

namespace metrale::kernels {

// The kernel's geometry (q heads per CTA, CTAs per SM, pairing) is the
// planner's: plan/decode_geometry.hpp.
constexpr int32_t kDecodeQHeadsPerCta = geometry::kDecodeQHeadsPerCta;

struct DecodeParams {
  // TMA descriptors of the K and V caches (kv_tensor_map.hpp): boxes of 16
  // tokens of one head's (or head pair's) rows of one page; set for the TMA
  // load path only.
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
  // The plan's kv units: with paired kv heads (decode_geometry.hpp),
  // num_kv_heads and group count the CTA's head pairs and their q heads
  // (num_kv_heads / 2 and 2 * group of the cache); the kernel runs at
  // head_dim 128.
  int32_t num_kv_heads;
  int32_t group;             // q heads per kv head
  int32_t head_tiles;        // ceil(group / kDecodeQHeadsPerCta): CTAs per (seq, kv head, split)
  int32_t block_size;        // multiple of 16
  int32_t sliding_window;    // 0 = off
  float qk_log2_scale;       // sm_scale * log2(e) * K dequant factor
  float v_factor;            // V dequant factor applied to the output
  int32_t num_splits;
  bf16* out;                 // single pass: [num_seqs, num_q_heads, D]
  float* workspace;          // split-K: records of D+2 floats (docs/spec.md 4)
  int32_t cluster_merge;     // split-K launched as clusters of its num_splits CTAs, which merge their
                             // records through distributed shared memory into `out` (no workspace, no reduce)
};

// The runs kernel's parameters (decode_runs.cuh): the decode kernel's, which
// stay as they are, and the query runs and their options. (The prefill
// kernel has its own: prefill/prefill_params.hpp.)
struct RunParams : DecodeParams {
  const int32_t* q_start;    // [num_seqs + 1] or null: one row per sequence
  const float* sinks;        // [num_q_heads] sink logits (natural log units), or null
  float softcap_scale;       // soft-cap c > 0: sm_scale * K factor / c (x = softcap_log2 * tanh(s * this))
  float softcap_log2;        // c * log2(e); 0: no soft-cap
  float* lse;                // [rows, num_q_heads] of the single pass, or null
};

template <bool kRuns>
using KernelParams = std::conditional_t<kRuns, RunParams, DecodeParams>;

}  // namespace metrale::kernels
