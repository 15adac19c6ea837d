// Per-thread asynchronous copies of global into shared memory (PTX ISA:
// cp.async, sm_80+): a thread's copies complete in the groups it commits,
// and cp_async_wait<N>() waits until at most N of its groups are pending;
// the data is then visible to that thread (to others after a barrier).
#pragma once

#include <cstdint>

namespace metrale::kernels {

// 16 bytes from src to dst, or zeros where !valid (nothing read).
__device__ __forceinline__ void cp_async_16_or_zero(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace metrale::kernels
