// Device parameters of the paged decode kernel: the user's DecodeArgs
// converted once (factors folded, layout flattened), passed by value.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "metrale/codec.hpp"

namespace metrale::kernels {

// q heads one decode CTA serves (the N of its MMAs); the launcher and the
// planner count CTAs with it.
constexpr int32_t kDecodeQHeadsPerCta = 8;

// Resident decode CTAs per SM the split planner fills (~255 registers x
// 128 threads: 2 fit an SM).
constexpr int32_t kDecodeCtasPerSm = 2;

// head_dim 64: a CTA serves two adjacent kv heads as one head of head_dim
// 128 (their rows are adjacent in a token's row of the cache), their q
// heads side by side in its 8 columns. Half-width rows put the per-step
// costs of the kernel on half the bytes (fp8 0.58-0.63 R against 0.83-0.87
// at head_dim 128). Pairing halves the CTAs of a batch, so it is chosen
// only where the batch still fills a third of a resident wave (at most 2
// splits): split shapes doubled their splits and lost (clusters of 4, or
// 66 splits at 1x32768; session 6 in bench/RESULTS.md). The planner and
// the launcher both decide by this rule.
inline bool decode_pairs_kv_heads(int32_t head_dim, int32_t num_kv_heads, int32_t group, int64_t num_seqs,
                                  int32_t num_sms) {
  return head_dim == 64 && num_kv_heads % 2 == 0 && 2 * group <= kDecodeQHeadsPerCta &&
         3 * num_seqs * (num_kv_heads / 2) > int64_t(num_sms) * kDecodeCtasPerSm;
}

struct DecodeParams {
  // TMA descriptors of the K and V caches (kv_tensor_map.hpp): boxes of 16
  // tokens of one head's (or head pair's) rows of one page; valid when use_tma.
  CUtensorMap k_map;
  CUtensorMap v_map;
  bool use_tma;
  const bf16* q;             // [num_seqs, q_stride]; head h at h*D
  int64_t q_stride;          // elements
  const uint8_t* k_cache;    // page p at p*page_stride bytes
  const uint8_t* v_cache;
  int64_t page_stride;       // bytes
  int64_t scale_offset;      // NVFP4: bytes from a page's start to its scale section
  int32_t num_blocks;        // valid page ids are [0, num_blocks)
  const int32_t* block_tables;  // [num_seqs, max_blocks_per_seq]
  int32_t max_blocks_per_seq;
  const int32_t* seq_lens;   // [num_seqs]
  int32_t num_q_heads;
  // With pair_kv_heads (decode_pairs_kv_heads), num_kv_heads and group
  // count the CTA's head pairs and their q heads (num_kv_heads / 2 and
  // 2 * group of the cache); the kernel runs at head_dim 128.
  int32_t pair_kv_heads;
  int32_t num_kv_heads;
  int32_t group;             // q heads per kv head
  int32_t head_tiles;        // ceil(group / kDecodeQHeadsPerCta): CTAs per (seq, kv head, split)
  int32_t block_size;        // multiple of 16
  int32_t sliding_window;    // 0 = off
  float qk_log2_scale;       // sm_scale * log2(e) * K dequant factor
  float v_factor;            // V dequant factor applied to the output
  int32_t num_splits;
  bf16* out;                 // single pass: [num_seqs, num_q_heads, D]
  float* workspace;          // split-K: records of D+2 floats (SYSTEM.md 4)
  int32_t cluster_merge;     // split-K launched as clusters of its num_splits CTAs, which merge their
                             // records through distributed shared memory into `out` (no workspace, no reduce)
};

}  // namespace metrale::kernels
