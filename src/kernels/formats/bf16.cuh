// BF16: the cache holds the bf16 values as they are (metrale/format.hpp's
// first entry; interface in format_policy.cuh).
#pragma once

#include "kernels/formats/format_policy.cuh"

namespace metrale::kernels {

struct Bf16Format : FormatPolicy<KvFormat::bf16>, VQuadByPairs<Bf16Format> {
  using Op = Bf16Op;
  __host__ __device__ static constexpr int k_elem(int kk, int r) { return 4 * kk + r; }
  // Elements 4kk..4kk+3 of the thread's K stream are words 2kk, 2kk+1.
  template <int N>
  __device__ __forceinline__ static void k_pair(const uint32_t (&w)[N], int kk, uint32_t /*scale*/, uint32_t& b0,
                                                uint32_t& b1) {
    b0 = w[2 * kk];
    b1 = w[2 * kk + 1];
  }
  // Elements j, j+1 (j even) of the V streams of tokens a and b, as (a, b)
  // pairs: rows g and g+8 of PV tile j/2.
  template <int N>
  __device__ __forceinline__ static void v_pair(const uint32_t (&wa)[N], const uint32_t (&wb)[N], int j,
                                                uint32_t /*scales*/, uint32_t& r0, uint32_t& r1) {
    r0 = byte_perm(wa[j / 2], wb[j / 2], 0x5410);
    r1 = byte_perm(wa[j / 2], wb[j / 2], 0x7632);
  }

  // ---- cache write: 8 elements (16-byte load, 16-byte store), copied bit for bit ----
  static constexpr int kWriteElems = 8;
  struct WriteChunk {
    uint4 v;
  };
  __device__ static WriteChunk load_chunk(const bf16* src) { return {__ldg(reinterpret_cast<const uint4*>(src))}; }
  // BF16 never saturates: returns 0 (kSaturates is false).
  __device__ static uint32_t store_chunk(const WriteChunk& c, uint8_t* page, int64_t row, int32_t chunk, int32_t D,
                                         int64_t /*data_section*/, float /*param*/) {
    *reinterpret_cast<uint4*>(page + ((row * D) << 1) + chunk * 16) = c.v;
    return 0;
  }
  __device__ static uint32_t chunk_saturated(const bf16* /*src*/, uint32_t /*may*/, float /*param*/) { return 0; }
  static float write_param(float /*tensor_scale*/) { return 0.0f; }  // unused
};

}  // namespace metrale::kernels
