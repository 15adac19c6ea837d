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

// The current GPU as the planner sees it: SM count, L2, TMA, cluster
// residency of each kernel. plan_attention(problem, cuda::attention_target()).
AttnTarget attention_target();

// Attention of every query shape (AttnArgs; decode is q_start null):
// launches what the plan says, the kernel and, where the plan merges through
// the workspace, the reduce (`ws`: plan.workspace_bytes, laid out for
// plan.num_splits; unused by the other plans). The plan must fit the
// arguments (plan.hpp): runs longer than its max_q_len are not computed (the
// debug validator on host copies checks the runs).
void run_attention(const AttnPlan& plan, const AttnArgs& args, const SplitKWorkspace& ws, Stream stream = nullptr);

// Merges split-K states (a states_only plan's, or states computed
// anywhere: docs/spec.md 4) into args.out, applying the sinks, writing lse.
void reduce_states(const ReduceArgs& args, Stream stream = nullptr);
}  // namespace metrale::cuda

namespace metrale::detail {
// Whether the CUDA backend ships the kernel instantiation `id` names
// (internal: every plan's does, tests/test_planner.cpp). Host code, no GPU
// needed.
bool cuda_kernel_instantiated(const KernelId& id);
}  // namespace metrale::detail
