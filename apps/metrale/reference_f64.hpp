// Float64 attention references and the per-(sequence, q head) error of an
// output against them.
//
// Two references over the same batch: over the ORIGINAL bf16 K/V rows (before
// quantization), which shows what each KV format costs in accuracy, and over
// the dequantized cache (the exact values the kernel is meant to see,
// SYSTEM.md 5), which shows the kernel's own error.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "host_batch.hpp"
#include "metrale/cache.hpp"

namespace metrale::cli {

// Writes the K and V rows (head_dim values each) of position `pos` of
// sequence `seq`, kv head `kv_head`, as the reference should see them.
using KvRowSource = std::function<void(int32_t seq, int32_t pos, int32_t kv_head, double* k, double* v)>;

// The batch's bf16 rows, as written (before quantization).
KvRowSource bf16_rows(const HostBatch& batch);
// The dequantized rows of a cache in host memory holding the batch (codes x
// group scales x per-tensor scales, from the SYSTEM.md 2-3 layout math).
KvRowSource cache_rows(const HostBatch& batch, const KvCacheView& host_cache);

// softmax(sm_scale * q . k_j) . v_j over positions [0, L) of each sequence:
// [num_seqs, num_q_heads, head_dim]; q head h reads kv head h / group.
std::vector<double> attention_f64(const HostBatch& batch, const KvRowSource& rows);

struct ErrorStats {
  double max_rel_l2 = 0.0;   // worst ||out - ref||_2 / ||ref||_2 over (seq, q head) blocks
  double mean_rel_l2 = 0.0;  // mean of the same over the blocks
  int64_t blocks = 0;        // blocks compared (reference norm > 0)
  int64_t nonfinite = 0;     // output elements that are NaN or Inf
};

ErrorStats compare_to_reference(const bf16* out, const std::vector<double>& ref, int32_t num_seqs,
                                int32_t num_q_heads, int32_t head_dim);

}  // namespace metrale::cli
