// The CUDA backend (Hopper, sm_90a): the same operations as metrale/cpu.hpp on
// device memory, enqueued on a stream. Launchers validate every argument
// before launching and throw CudaError when the runtime reports a failure.
// Nothing here allocates or synchronises, so every call can be captured in
// a CUDA graph.
#pragma once

#include <cstdint>
#include <string>

#include "metrale/ops.hpp"
#include "metrale/plan.hpp"

struct CUstream_st;

namespace metrale::cuda {

using Stream = CUstream_st*;  // cudaStream_t; nullptr = the legacy default stream

// True when a CUDA device usable by this build (sm_90) is present.
bool available();

struct DeviceInfo {
  int32_t device = 0;
  int32_t num_sms = 0;
  int32_t major = 0, minor = 0;
  int64_t l2_bytes = 0;
  std::string name;
};
DeviceInfo device_info();  // the current device; throws CudaError if none

void reshape_and_cache(const CacheWriteArgs& args, Stream stream = nullptr);

// Device counterpart of cpu::bf16_absmax: atomic max into *absmax (device f32).
void bf16_absmax(const bf16* x, int64_t num_rows, int64_t row_len, int64_t row_stride, float* absmax,
                 Stream stream = nullptr);

// The current GPU as the planner sees it: SM count, TMA, cluster residency
// of each decode kernel. plan_decode(problem, cuda::decode_target()).
DecodeTarget decode_target();

// Launches what the plan says (plan.hpp): the decode kernel, and the reduce
// where the plan merges through the workspace (`ws`: plan.workspace_bytes,
// laid out for plan.num_splits; unused by the other plans).
void run_decode(const DecodePlan& plan, const DecodeArgs& args, const SplitKWorkspace& ws, Stream stream = nullptr);

// Forced plans: single pass; the split-K pass of ws.num_splits splits into
// the workspace only (merge it with paged_decode_attn_reduce).
void paged_decode_attn(const DecodeArgs& args, Stream stream = nullptr);
void paged_decode_attn_splitk(const DecodeArgs& args, const SplitKWorkspace& ws, Stream stream = nullptr);
void paged_decode_attn_reduce(const ReduceArgs& args, Stream stream = nullptr);

// Query runs (SYSTEM.md 8), sinks, soft-cap, lse: as cpu::run_attn /
// paged_attn / paged_attn_splitk. The plan's max_q_len must bound every run
// (decode_problem(args, L, n) or args.max_q_len): the grid has
// ceil(max_q_len * group / 8) tiles per kv head; rows past it are not
// computed (the debug validator on host copies checks the runs).
void run_attn(const DecodePlan& plan, const PagedAttnArgs& args, const SplitKWorkspace& ws, Stream stream = nullptr);
void paged_attn(const PagedAttnArgs& args, Stream stream = nullptr);
void paged_attn_splitk(const PagedAttnArgs& args, const SplitKWorkspace& ws, Stream stream = nullptr);

}  // namespace metrale::cuda
