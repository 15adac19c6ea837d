// A ring of shared-memory stages signalled by mbarriers (PTX ISA:
// mbarrier): per stage a full barrier (the producer's arrivals and its
// copies' bytes complete it) and, where the consumers hand stages back
// through a barrier, an empty one (their arrivals complete it). Item t of a
// stream of items uses stage t % kStages in phase (t / kStages) & 1, so a
// consumer waits for parity (t / kStages) & 1 of its full barrier and a
// producer, before refilling the stage for item t, for the parity of the
// consumers' previous use of it.
//
// Layout: full barrier s at base + 8 s, empty barrier s at
// base + 8 (kStages + s); kBytes in all.
#pragma once

#include <cstdint>

#include "kernels/common/tma.cuh"

namespace metrale::kernels {

enum class RingRelease {
  by_barrier,  // the consumers arrive on the stage's empty barrier
  by_warp,     // producer and consumers are one warp (a __syncwarp orders them): no empty barrier
};

template <int kStages, RingRelease kRelease = RingRelease::by_barrier>
struct MbarrierRing {
  static constexpr int kBarriers = kRelease == RingRelease::by_barrier ? 2 * kStages : kStages;
  static constexpr int kBytes = 8 * kBarriers;

  uint32_t base;  // shared-window address of the first barrier

  __device__ __forceinline__ static int stage(int t) { return t % kStages; }
  __device__ __forceinline__ static uint32_t phase(int t) { return (t / kStages) & 1; }

  __device__ __forceinline__ uint32_t full(int s) const { return base + uint32_t(8 * s); }
  __device__ __forceinline__ uint32_t empty(int s) const {
    static_assert(kRelease == RingRelease::by_barrier, "a ring without empty barriers");
    return base + uint32_t(8 * (kStages + s));
  }

  // One thread, before anyone arrives: stage s's barriers (then
  // fence_mbarrier_init and a barrier of the threads that use them).
  __device__ __forceinline__ void init_full(int s, uint32_t arrivals) const { mbar_init(full(s), arrivals); }
  __device__ __forceinline__ void init_empty(int s, uint32_t arrivals) const { mbar_init(empty(s), arrivals); }

  // The consumer's wait for item t's stage to be filled.
  __device__ __forceinline__ void wait_full(int t) const { mbar_wait(full(stage(t)), phase(t)); }
  // The same with the stage and parity the caller keeps (a loop that
  // counts stages instead of items).
  __device__ __forceinline__ void wait_full(int s, uint32_t parity) const { mbar_wait(full(s), parity); }
  // The producer's wait before it fills the stage of item t: the
  // consumers gave back item t - kStages (the first kStages are free).
  __device__ __forceinline__ void wait_empty(int t) const {
    if (t >= kStages) mbar_wait(empty(stage(t)), ((t / kStages) - 1) & 1);
  }
};

}  // namespace metrale::kernels
