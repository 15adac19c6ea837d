// The CPU reference backend: every operation of docs/spec.md section 1 on host
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
// clusters. plan_attention(problem, cpu::attention_target()).
AttnTarget attention_target();

// As cuda::run_attention (a cluster merge is the CUDA backend's: plans for
// this backend come from cpu::attention_target()); also serves shard views
// (AttnArgs::kv_start / kv_lens). The values behind q_start, seq_lens and
// sinks are validated here.
void run_attention(const AttnPlan& plan, const AttnArgs& args, const SplitKWorkspace& ws);

// As cuda::reduce_states.
void reduce_states(const ReduceArgs& args);

}  // namespace metrale::cpu
