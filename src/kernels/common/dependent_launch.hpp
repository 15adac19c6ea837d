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
// `cluster` other than 1 x 1 x 1: thread-block clusters of those dimensions.
struct DependentLaunch {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attrs[2]{};
  DependentLaunch(dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream, dim3 cluster = dim3(1, 1, 1)) {
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem_bytes;
    cfg.stream = stream;
    attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[0].val.programmaticStreamSerializationAllowed = 1;
    attrs[1].id = cudaLaunchAttributeClusterDimension;
    attrs[1].val.clusterDim.x = cluster.x;
    attrs[1].val.clusterDim.y = cluster.y;
    attrs[1].val.clusterDim.z = cluster.z;
    cfg.attrs = attrs;
    cfg.numAttrs = cluster.x * cluster.y * cluster.z > 1 ? 2 : 1;
  }
};

template <class... Params, class... Args>
void launch_dependent(const DependentLaunch& l, void (*kernel)(Params...), const char* name, Args&&... args) {
  cuda_check(cudaLaunchKernelEx(&l.cfg, kernel, std::forward<Args>(args)...), name);
}

}  // namespace metrale::detail
