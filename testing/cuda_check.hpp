// The CUDA status check of the tests, the benchmarks and the `metrale`
// command (the library keeps its own, src/kernels/common/cuda_check.hpp,
// which throws metrale::CudaError). A failed call throws std::runtime_error
// naming the call, so the first CUDA error stops the program where it is.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace metrale::test {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

}  // namespace metrale::test

// The call's own text names it: METRALE_CUDA_OK(cudaDeviceSynchronize()).
#define METRALE_CUDA_OK(expr) ::metrale::test::cuda_check((expr), #expr)
