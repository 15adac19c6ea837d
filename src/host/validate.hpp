// Argument validation shared by the CPU and CUDA backends (docs/spec.md 6).
// Each function throws InvalidArgument / Unsupported naming the argument,
// its value and the expectation; nothing is launched before it returns.
#pragma once

#include "metrale/context_parallel.hpp"
#include "metrale/ops.hpp"
#include "metrale/plan.hpp"

namespace metrale::detail {

void validate_cache_view(const KvCacheView& cache);
void validate_cache_write(const CacheWriteArgs& args);
// `writes_out`: false for a states_only plan, which writes the workspace only
// (args.out may then be null).
void validate_attn(const AttnArgs& args, bool writes_out = true);
// The values behind q_start, seq_lens and sinks (host memory: the CPU
// backend, and the debug validator for the CUDA one): q_start[0] = 0,
// non-decreasing, q_start[num_seqs] = num_q_rows, every run no longer than
// its sequence, no NaN sink.
void validate_query_runs(const AttnArgs& args);
// The shard view (kv_start, kv_lens) on host copies: both or neither, starts
// page-aligned, each view inside its sequence and block-table row.
void validate_kv_view(const AttnArgs& args);
void validate_workspace(const AttnArgs& args, const SplitKWorkspace& ws);
void validate_reduce(const ReduceArgs& args);
// run_attention's arguments: `args` as validate_attn, the plan made for
// their heads and layout and at least their num_seqs, and, where the plan
// merges through the workspace, `ws` laid out for the plan's num_splits.
void validate_run(const AttnPlan& plan, const AttnArgs& args, const SplitKWorkspace& ws);
// A context-parallel rank's decode arguments against its layout (both
// backends' cp_rank_states; implemented with the sharding, shard.cpp).
void validate_cp_rank_args(const cp::CpLayout& L, const AttnArgs& a);
void validate_absmax(const bf16* x, int64_t num_rows, int64_t row_len, int64_t row_stride, const float* absmax);

}  // namespace metrale::detail
