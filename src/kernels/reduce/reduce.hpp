// The split-K reduce kernel's launch, for callers that validated its
// arguments (run_attention); cuda::reduce_states validates first.
#pragma once

#include <cuda_runtime.h>

#include "metrale/ops.hpp"

namespace metrale::kernels {

void launch_splitk_reduce(const ReduceArgs& args, cudaStream_t stream);

}  // namespace metrale::kernels
