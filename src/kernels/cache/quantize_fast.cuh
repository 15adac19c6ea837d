// Fast quantizers for the cache-write kernel, bit-identical to the scalar
// codecs of metrale/codec.hpp (the definition, SYSTEM.md 2).
//
// Everything here except e4m3x4_rne_satfinite is __host__ __device__ and
// uses only integer operations, comparisons and IEEE f32 multiply, divide
// and (explicitly unfused) add, so a host program can check it against the
// codec (exhaustively over all 2^32 f32 inputs for the per-element
// functions).
#pragma once

#include <cstdint>

#include "metrale/codec.hpp"

namespace metrale::cuda::fastq {

// Four E4M3 codes packed in a word: turns any NaN code (S.1111.111, either
// sign) into the codec's NaN code 0x7f and leaves every other byte alone.
// (b & 0x7f) + 1 <= 0x80 cannot carry into the next byte; its bit 7 is set
// exactly when b & 0x7f == 0x7f.
METRALE_HD uint32_t e4m3x4_canonical_nan(uint32_t w) {
  const uint32_t nan = ((w & 0x7f7f7f7fu) + 0x01010101u) & 0x80808080u;
  return w & ~nan;
}

#if defined(__CUDACC__)
// codec::e4m3_rne_satfinite of a, b, c, d packed little-endian (a in byte 0).
// cvt.rn.satfinite.e4m3x2.f32 (sm_89+) rounds to nearest even, keeps the sign
// of zeros, saturates +-inf and magnitudes past 448 to +-448 and turns NaN
// into S.1111.111 (PTX ISA, cvt; the NaN keeps the input's sign in CUDA's
// own emulation, cuda_fp8.hpp), which e4m3x4_canonical_nan maps to 0x7f.
// Its second source goes to the low byte (as cuda_fp8.hpp's
// __nv_cvt_float2_to_fp8x2 uses it).
__device__ __forceinline__ uint32_t e4m3x4_rne_satfinite(float a, float b, float c, float d) {
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(b), "f"(a));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(d), "f"(c));
  return e4m3x4_canonical_nan(uint32_t(lo) | (uint32_t(hi) << 16));
}
#endif

// IEEE f32 addition, round to nearest even, never fused with a multiply.
METRALE_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// codec::e2m1_rne_satfinite without branches. With a = |y| as bits:
//  * |y| < 2: the code is |y| / 0.5 rounded to nearest even (0, .5, 1, 1.5
//    are codes 0..3 and 2.0 is code 4); adding 2^22, whose ulp is 0.5, rounds
//    exactly so, and the sum's bits minus those of 2^22 count the halves.
//  * |y| >= 2: codes 4..7 are the f32 exponent and top mantissa bit,
//    2 * (e - 126) + m; rounding the bits to nearest even at mantissa bit 22
//    gives them (a carry into the exponent is the correct round-up), and
//    everything past 6 (including inf) saturates to 7.
//  * NaN gives +0 (the codec drops its sign too).
METRALE_HD uint32_t e2m1_rne_satfinite(float y) {
  const uint32_t u = codec::f32_bits(y);
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t small = codec::f32_bits(add_rn(codec::f32_from_bits(a), 4194304.0f)) - 0x4a800000u;
  const uint32_t big = (a - 0x3f000000u + 0x1fffffu + ((a >> 22) & 1u)) >> 22;
  const uint32_t m = a < 0x40000000u ? small : (big < 7u ? big : 7u);
  return a > 0x7f800000u ? 0u : (((u >> 28) & 8u) | m);
}

// codec::nvfp4_quantize_group, same operations on the same values:
//  * amax as the largest |x| bit pattern: for non-negative floats the
//    unsigned order of the bits is the float order, and every NaN pattern
//    lies above +inf, so a NaN anywhere makes amax a NaN (its payload does
//    not matter: the scale code of any NaN is 0x7f). Being a max, it may be
//    taken in any order (a tree, for ILP).
//  * the scale and its inverse use the codec's own scalar functions and the
//    same IEEE divisions (per group, so cheap).
//  * codes through the branch-free e2m1_rne_satfinite above; a zero scale
//    zeroes every code (the codec's `zero` case: -0 codes are not kept).
// packed[j] holds element 8j+i in bits 4i..4i+3: read as the group's 8
// little-endian bytes, element 2i is the low nibble of byte i, as the codec
// packs.
METRALE_HD uint8_t nvfp4_quantize_group(const float* x, float global_scale, uint32_t* packed) {
  uint32_t a[16];
  for (int i = 0; i < 16; ++i) a[i] = codec::f32_bits(x[i]) & 0x7fffffffu;
  for (int w = 8; w >= 1; w >>= 1)
    for (int i = 0; i < w; ++i) a[i] = a[i] > a[i + w] ? a[i] : a[i + w];
  const float amax = codec::f32_from_bits(a[0]);
  const uint8_t s = codec::e4m3_rne_satfinite(amax / (6.0f * global_scale));
  const bool zero = (s & 0x7fu) == 0;
  const float inv = zero ? 0.0f : 1.0f / (codec::e4m3_to_float(s) * global_scale);
  const uint32_t keep = zero ? 0u : 0xffffffffu;
  for (int j = 0; j < 2; ++j) {
    uint32_t w = 0;
    for (int i = 0; i < 8; ++i) w |= e2m1_rne_satfinite(x[8 * j + i] * inv) << (4 * i);
    packed[j] = w & keep;
  }
  return s;
}

}  // namespace metrale::cuda::fastq
