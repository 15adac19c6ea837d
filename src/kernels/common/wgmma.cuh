// Warpgroup MMA plumbing (PTX ISA: wgmma, its shared-memory matrix
// descriptors and ordering) for the prefill kernel; the MMAs themselves are
// wgmma_ops.cuh.
//
// Shared-memory operands use the 128-byte swizzle: a tile of R rows x C
// 16-bit elements is stored as C/64 "chunks" of R rows of 128 bytes (64
// elements), chunk regions one after the other, and the 16-byte unit u of
// row r of a chunk at r*128 + ((u ^ (r % 8)) * 16) (swizzle_offset). Every
// region is 1024-byte aligned. One such tile serves as
//   * a K-major operand (rows = M or N, the reduction along the row): the
//     descriptor of k-step kk (16 elements) starts at chunk kk/4, byte
//     32*(kk%4) of row 0; SBO = 1024 (8-row groups), LBO unused;
//   * an MN-major operand (rows = the reduction, e.g. V's tokens): k-step kk
//     starts at row 16*kk of chunk 0; LBO = R*128 (from one 64-element
//     chunk of N to the next), SBO = 1024.
// The producer writes the tiles with ordinary stores or cp.async (the
// generic proxy), so it executes fence.proxy.async before signalling them.
#pragma once

#include <cstdint>

#include "kernels/common/tma.cuh"
#include "kernels/common/wgmma_ops.cuh"

namespace metrale::kernels::wg {

// Byte offset of 16-byte unit `u` (of C/8) of row `r` in a swizzled tile of `rows` rows.
__device__ __forceinline__ uint32_t swizzle_offset(int rows, int r, int u) {
  return uint32_t((u >> 3) * rows * 128 + r * 128 + (((u & 7) ^ (r & 7)) << 4));
}

// A 128-byte-swizzle matrix descriptor (start, leading and stride byte
// offsets) of the operand `offset` bytes into a tile at `tile`. The offset
// is added to the start field of the tile's descriptor (shared addresses
// stay below 2^18, so the 14-bit field cannot carry): one integer add per
// MMA on a descriptor computed once per tile.
__device__ __forceinline__ uint64_t descriptor(uint32_t tile, uint32_t offset, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  const uint32_t lo = (((tile & 0x3ffffu) >> 4) | (((lbo_bytes >> 4) & 0x3fffu) << 16)) + (offset >> 4);
  const uint32_t hi = ((sbo_bytes >> 4) & 0x3fffu) | (1u << 30);  // 128-byte swizzle
  return (uint64_t(hi) << 32) | lo;
}
// k-step kk of a K-major tile at `tile` (any rows).
__device__ __forceinline__ uint64_t k_major(uint32_t tile, int rows, int kk) {
  return descriptor(tile, uint32_t((kk >> 2) * rows * 128 + (kk & 3) * 32), 16, 1024);
}
// k-step kk (rows 16kk..16kk+15) of an MN-major tile of `rows` rows at `tile`.
__device__ __forceinline__ uint64_t mn_major(uint32_t tile, int rows, int kk) {
  return descriptor(tile, uint32_t(kk * 16 * 128), uint32_t(rows * 128), 1024);
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accesses of accumulator registers across
// the asynchronous MMAs' issue and wait.
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// The A fragments a register-A MMA reads until its wait: kept where they are.
template <int K>
__device__ __forceinline__ void fence_operands(uint32_t (&a)[K][4]) {
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int r = 0; r < 4; ++r) asm volatile("" : "+r"(a[k][r])::"memory");
}
// Generic-proxy writes of shared memory (st.shared, cp.async) made visible
// to the async proxy (wgmma operand reads).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Register budgets of a warpgroup's role (setmaxnreg; multiples of 8).
template <int R>
__device__ __forceinline__ void regs_dealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void regs_alloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}

// Announces `bytes` more of asynchronous copies completing on `bar` (no arrival).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

}  // namespace metrale::kernels::wg
