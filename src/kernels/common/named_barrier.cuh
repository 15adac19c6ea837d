// Named barriers (PTX ISA: bar.sync, bar.arrive, bar.red) over a subset of
// a CTA's warps: `id` 1..15 (0 is __syncthreads'), kThreads a multiple of
// 32 counting every thread that syncs or arrives on it (an immediate).
#pragma once

#include <cstdint>

namespace metrale::kernels {

template <int kThreads>
__device__ __forceinline__ void named_barrier_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

template <int kThreads>
__device__ __forceinline__ void named_barrier_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kThreads) : "memory");
}

// The barrier, and whether `mine` was true in any of its threads.
template <int kThreads>
__device__ __forceinline__ bool named_barrier_or(bool mine, int id) {
  uint32_t any;
  asm volatile(
      "{\n .reg .pred mine, any;\n setp.ne.u32 mine, %1, 0;\n bar.red.or.pred any, %2, %3, mine;\n"
      " selp.u32 %0, 1, 0, any;\n}\n"
      : "=r"(any)
      : "r"(uint32_t(mine)), "r"(id), "n"(kThreads)
      : "memory");
  return any != 0;
}

}  // namespace metrale::kernels
