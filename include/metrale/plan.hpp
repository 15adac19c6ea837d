// The split planner: one decision function that picks single pass or split-K
// and num_splits for a decode batch (SYSTEM.md 1), used by both backends.
//
// Host-only and cheap: call it once per batch shape, reuse the plan for every
// layer; running a plan never allocates or synchronises.
#pragma once

#include <cstddef>
#include <cstdint>

#include "metrale/cache.hpp"
#include "metrale/ops.hpp"

namespace metrale {

struct DecodeProblem {
  int32_t num_seqs = 0;
  int32_t num_q_heads = 0;
  KvCacheLayout layout;        // format, heads, head_dim, block_size
  int32_t max_seq_len = 0;     // longest sequence of the batch (an upper bound is fine)
  int32_t sliding_window = 0;  // 0 = off
};

struct DecodePlan {
  int32_t num_splits = 1;      // 1 = single pass (no workspace, no reduce)
  size_t workspace_bytes = 0;  // f32 split-K workspace the run needs
};

// `num_sms`: multiprocessors of the target GPU (the CPU backend passes its
// thread count). Throws InvalidArgument on a malformed problem.
DecodePlan plan_decode(const DecodeProblem& problem, int32_t num_sms);

// Debug validator (SYSTEM.md 6): checks, on host copies, that every length is
// in [0, max_blocks_per_seq * block_size] and that every page a sequence
// attends to is a valid page of the cache. Throws InvalidArgument naming the
// first bad sequence.
void validate_block_tables(const KvCacheLayout& layout, const int32_t* block_tables, int32_t max_blocks_per_seq,
                           const int32_t* seq_lens, int32_t num_seqs, int32_t sliding_window = 0);

}  // namespace metrale
