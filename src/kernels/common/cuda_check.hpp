// Turning CUDA runtime errors into metrale::CudaError (host side only).
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "metrale/error.hpp"

namespace metrale::detail {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CudaError(std::string("metrale: ") + what + ": " + cudaGetErrorString(e));
}

// Call right after a launch: reports configuration errors of that launch.
inline void check_launch(const char* kernel) { cuda_check(cudaGetLastError(), kernel); }

// Grid dimension limits (no silent failure for very large batches).
constexpr int64_t kMaxGridX = 2147483647;
constexpr int64_t kMaxGridYZ = 65535;

}  // namespace metrale::detail
