// Hopper tensor-map copies into shared memory and the mbarriers that signal
// their completion (PTX ISA: cp.async.bulk.tensor, mbarrier). Addresses of shared memory are 32-bit shared-window addresses.
//
// Ordering rules the users rely on:
//  - a barrier is initialised by one thread, then fence_mbarrier_init() and a
//    warp/CTA barrier before anyone arrives on it or a copy signals it;
//  - a stage that was read through ordinary loads is refilled by a copy only
//    after its readers synchronised with the issuing thread (an mbarrier or
//    __syncwarp), as CUTLASS's TMA pipelines release a stage.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace metrale::kernels {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}

__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` of copies completing on `bar`.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Blocks until the phase with parity `parity` of `bar` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      " .reg .pred done;\n"
      "WAIT:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// A box of a 4-d tensor map, at coordinates (c0 innermost .. c3), into
// shared memory at `dst` (128-byte aligned); completes `bytes` on `bar`.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int32_t c0, int32_t c1,
                                            int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// The same box into the shared memory of every CTA of the cluster named in
// `cta_mask` (bit i: rank i), at the same CTA-relative `dst`, each copy
// completing its bytes on the barrier at the same CTA-relative `bar`.
__device__ __forceinline__ void tma_load_4d_multicast(uint32_t dst, const CUtensorMap* map, uint32_t bar, int32_t c0,
                                                      int32_t c1, int32_t c2, int32_t c3, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
      "[%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar), "h"(cta_mask)
      : "memory");
}

// ---- clusters (PTX ISA: mapa, barrier.cluster, cp.async.bulk) ----
__device__ __forceinline__ uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}

// The shared::cluster address of CTA `rank`'s copy of the local shared address `addr`.
__device__ __forceinline__ uint32_t cluster_addr(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}

// One arrival on a barrier of another CTA of the cluster (`bar` from
// cluster_addr), with the default semantics (as CUTLASS's ClusterBarrier):
// .release.cluster compiles to a GPU-scope MEMBAR before every arrival.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// `bytes` (a multiple of 16) of this CTA's shared memory at `src` into another
// CTA's at `dst`, completing them on its barrier `bar` (both from cluster_addr).
// The source was written by ordinary stores: their threads fenced the async
// proxy (fence.proxy.async) and synchronised with the issuing thread first.
__device__ __forceinline__ void bulk_copy_to_cluster(uint32_t dst, uint32_t src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   dst),
               "r"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// Every thread of the cluster: the barrier over all of its CTAs (their
// barriers initialised before any CTA signals another's).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

}  // namespace metrale::kernels
