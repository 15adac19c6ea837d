// Vector loads of 4, 8 or 16 bytes into consecutive 32-bit words (shared
// memory, read-only global memory) and of 1 or 2 scale bytes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace metrale::kernels {

// Loads `Bytes` (4, 8 or 16) bytes of shared memory into consecutive words.
template <int Bytes>
__device__ __forceinline__ void load_smem_vec(const uint8_t* ptr, uint32_t* w) {
  if constexpr (Bytes == 16) {
    const uint4 v = *reinterpret_cast<const uint4*>(ptr);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if constexpr (Bytes == 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(ptr);
    w[0] = v.x, w[1] = v.y;
  } else {
    static_assert(Bytes == 4, "vector width");
    w[0] = *reinterpret_cast<const uint32_t*>(ptr);
  }
}

// Loads `Bytes` (4, 8 or 16) read-only bytes into consecutive words.
template <int Bytes>
__device__ __forceinline__ void load_vec(const uint8_t* ptr, uint32_t* w) {
  if constexpr (Bytes == 16) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(ptr));
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if constexpr (Bytes == 8) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(ptr));
    w[0] = v.x, w[1] = v.y;
  } else {
    static_assert(Bytes == 4, "vector width");
    w[0] = __ldg(reinterpret_cast<const uint32_t*>(ptr));
  }
}

// Loads `Bytes` (1 or 2) read-only bytes, zero-extended.
template <int Bytes>
__device__ __forceinline__ uint32_t load_bytes(const uint8_t* ptr) {
  static_assert(Bytes == 1 || Bytes == 2, "scale run width");
  if constexpr (Bytes == 2) return __ldg(reinterpret_cast<const uint16_t*>(ptr));
  return __ldg(ptr);
}

}  // namespace metrale::kernels
