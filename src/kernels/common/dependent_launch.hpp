// Launching a kernel as a programmatic dependent of the previous kernel in
// its stream (host side only).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/common/cuda_check.hpp"

namespace metrale::detail {

// The grid may be scheduled while the stream's previous kernel finishes (once
// that kernel's CTAs have run griddepcontrol.launch_dependents, or exited),
// which hides the launch latency between the two. The kernel must read
// nothing the earlier kernels wrote before its griddepcontrol.wait.
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                      const char* name, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  cuda_check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), name);
}

}  // namespace metrale::detail
