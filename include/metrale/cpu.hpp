// The CPU reference backend: every operation of SYSTEM.md section 1 on host
// memory, multithreaded. It is the oracle the CUDA kernels are tested against
// and the fallback on machines without a GPU. Quantizers are bit-exact with
// the GPU; decode accumulates in f32 over the dequantized cache.
#pragma once

#include <cstdint>

#include "metrale/ops.hpp"
#include "metrale/plan.hpp"

namespace metrale::cpu {

// Worker threads used by the backend (default: hardware concurrency).
int32_t num_threads();
void set_num_threads(int32_t n);

// Returns the number of tokens skipped because their slot was past the
// cache's capacity (also added to *args.skipped when given).
int64_t reshape_and_cache(const CacheWriteArgs& args);

// max |x| over num_rows rows of row_len values, row_stride elements apart,
// folded into *absmax (max with its current value; the caller zeroes it
// before the first batch). NaNs are ignored.
void bf16_absmax(const bf16* x, int64_t num_rows, int64_t row_len, int64_t row_stride, float* absmax);

// This backend as the planner sees it: its worker threads, no TMA, no
// clusters. plan_decode(problem, cpu::decode_target()).
DecodeTarget decode_target();

// Single pass or split-K + reduce, as the plan says (a cluster merge is the
// CUDA backend's: plans for this backend come from cpu::decode_target()).
void run_decode(const DecodePlan& plan, const DecodeArgs& args, const SplitKWorkspace& ws);

// Forced plans: single pass; the split-K pass of ws.num_splits splits into
// the workspace only (merge it with paged_decode_attn_reduce).
void paged_decode_attn(const DecodeArgs& args);
void paged_decode_attn_splitk(const DecodeArgs& args, const SplitKWorkspace& ws);
void paged_decode_attn_reduce(const ReduceArgs& args);

// Query runs (SYSTEM.md 8; decode is the run of one row): as run_decode
// with a plan of decode_problem(args), and the forced single pass and
// split-K pass (records per query row, q head, split; reduce with
// reduce_args_for(args, ws), which applies the sinks and writes lse).
void run_attn(const DecodePlan& plan, const PagedAttnArgs& args, const SplitKWorkspace& ws);
void paged_attn(const PagedAttnArgs& args);
void paged_attn_splitk(const PagedAttnArgs& args, const SplitKWorkspace& ws);

}  // namespace metrale::cpu
