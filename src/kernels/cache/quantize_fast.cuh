// Fast quantizers for the cache-write kernel, bit-identical to the scalar
// codecs of metrale/codec.hpp (the definition, docs/spec.md 2).
//
// Everything here is __host__ __device__ and uses only integer operations,
// comparisons, min/max and IEEE f32 multiply, divide and (explicitly
// unfused) add, so a host program can check it against the codec
// (exhaustively over all 2^32 f32 inputs for the per-element functions),
// except the device-only hardware conversions (e4m3x4_rne_satfinite,
// e4m3_rne_satfinite_nonneg_hw, e4m3_to_float_hw), whose host branch is the
// codec itself; the documented behaviour each relies on is stated at it.
// byte_perm, shift_in_nibble and max_u16x2 are single device instructions
// with an exact host model.
#pragma once

#include <cmath>
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

// codec::e4m3_code_may_saturate of any of four packed codes: (b & 0x7f) + 2
// <= 0x81 cannot carry into the next byte, and its bit 7 is set exactly when
// b & 0x7f >= 0x7e.
METRALE_HD bool e4m3x4_may_saturate(uint32_t w) { return (((w & 0x7f7f7f7fu) + 0x02020202u) & 0x80808080u) != 0u; }

// The saturated elements (codec::nvfp4_saturates) of one NVFP4 group, its
// 16 bf16 values as 8 words (element 2i in the low half of w[i]); callers
// look here only where the group's scale code may saturate.
METRALE_HD uint32_t nvfp4_group_saturated(const uint32_t* w, float six_g) {
  uint32_t n = 0;
  for (int i = 0; i < 8; ++i) {
    n += codec::nvfp4_saturates(codec::f32_from_bits(w[i] << 16), six_g);
    n += codec::nvfp4_saturates(codec::f32_from_bits(w[i] & 0xffff0000u), six_g);
  }
  return n;
}

// IEEE f32 addition, round to nearest even, never fused with a multiply.
METRALE_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// Portable forms of three single-instruction device intrinsics (PRMT,
// funnel shift SHF.R.W, packed unsigned 16-bit max), same results on host.
METRALE_HD uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, sel);
#else
  const uint64_t v = (uint64_t(y) << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= uint32_t((v >> (8 * ((sel >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
#endif
}
// (hi:lo) >> 4, low word: lo shifted down a nibble, hi's low nibble on top.
METRALE_HD uint32_t shift_in_nibble(uint32_t lo, uint32_t hi) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(lo, hi, 4);
#else
  return (lo >> 4) | (hi << 28);
#endif
}
METRALE_HD uint32_t max_u16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __vmaxu2(a, b);
#else
  const uint32_t lo = (a & 0xffffu) > (b & 0xffffu) ? (a & 0xffffu) : (b & 0xffffu);
  const uint32_t hi = (a >> 16) > (b >> 16) ? (a >> 16) : (b >> 16);
  return lo | (hi << 16);
#endif
}

// E2M1 magnitude code of y = codec::e2m1_rne_satfinite(y) & 7, in the low
// nibble of the result (bit 3 clear, higher bits are garbage). y must not be
// NaN (the group quantizer guarantees it). One "magic" add rounds v =
// min(|y|, 6) onto the E2M1 grid of v's binade:
//  * the grid step q is 0.5 below 2, 1 in [2, 4), 2 in [4, 8); M is a float
//    with ulp q: 2^22, 2^23 + 2, 2^24 + 8 (bits 0x4a800000, 0x4b000002,
//    0x4b800004: mantissa offsets of 0, 2, 4 ulps), and v + M stays in M's
//    binade (M + v <= 2^23 q + 8q < 2^24 q, as v <= 4q), so the IEEE add
//    rounds v to the grid exactly once, ties to the even
//    multiple of q; the sum's significand is that multiple plus M's mantissa
//    offset 0/2/4, an even number, so "even multiple" is "even E2M1
//    mantissa", as the codec rounds.
//  * the sum's low bits = multiple + offset: 0..4 below 2 (codes 0..4),
//    2..4 + 2 in [2, 4) (codes 4..6), 2..3 + 4 in [4, 6] (codes 6, 7).
//  * M's bits from v's exponent bits e: e + (e >> 22) + 0x0b000000 - 0xfe
//    gives the three values above for v in [1, 2), [2, 4), [4, 8) and less
//    below 1, where the max with 0x4a800000 takes over. inf clamps to 6.
METRALE_HD uint32_t e2m1_magnitude_bits(float y) {
  const float v = fminf(fabsf(y), 6.0f);
  const uint32_t e = codec::f32_bits(v) & 0x7f800000u;
  const uint32_t mb = e + (e >> 22) + (0x0b000000u - 0xfeu);
  const float magic = codec::f32_from_bits(mb > 0x4a800000u ? mb : 0x4a800000u);
  return codec::f32_bits(add_rn(v, magic));
}

// The sign bits of 8 bf16 elements (4 little-endian pairs, element 2i in the
// low half of w[i]) at the sign positions of their E2M1 nibbles (bit 4k+3).
// PRMT gathers the high bytes: E holds elements 0,2,4,6 (sign at bit 8i+7,
// wanted at 8i+3), O elements 1,3,5,7 (already at 8i+7).
METRALE_HD uint32_t e2m1x8_signs(const uint32_t* w) {
  const uint32_t a = byte_perm(w[0], w[1], 0x7351u);  // w0.b1 w1.b1 w0.b3 w1.b3
  const uint32_t b = byte_perm(w[2], w[3], 0x7351u);
  const uint32_t even = byte_perm(a, b, 0x5410u);
  const uint32_t odd = byte_perm(a, b, 0x7632u);
  return ((even >> 4) & 0x08080808u) | (odd & 0x80808080u);
}

#if defined(__CUDA_ARCH__)
// codec::e4m3_rne_satfinite of a value that is +0, positive or NaN, by the
// hardware conversion (see e4m3x4_rne_satfinite): such a value has a code
// with sign bit 0 or the NaN code S.1111.111, so clearing bit 7 gives the
// codec's code in every case.
__device__ __forceinline__ uint8_t e4m3_rne_satfinite_nonneg_hw(float a) {
  uint16_t c;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(c) : "f"(0.0f), "f"(a));
  return uint8_t(c & 0x7fu);
}
// codec::e4m3_to_float: cvt.rn.f16x2.e4m3x2 (sm_89+) is exact, every E4M3
// value being an f16 (subnormals 2^-9 * m included), and so is f16 -> f32;
// the NaN code gives a NaN (its payload may differ: callers mask such
// groups). The low byte goes to the low half.
__device__ __forceinline__ float e4m3_to_float_hw(uint8_t c) {
  float f;
  asm("{\n\t.reg .b32 t;\n\t.reg .b16 lo, hi;\n\t"
      "cvt.rn.f16x2.e4m3x2 t, %1;\n\tmov.b32 {lo, hi}, t;\n\tcvt.f32.f16 %0, lo;\n\t}"
      : "=f"(f)
      : "h"(uint16_t(c)));
  return f;
}
#endif

// ---- The NVFP4 route for "ordinary" global scales (see
// nvfp4_unit_route_ok): codes from z = min(|x| * inv/8, 1), fewer and cheaper
// instructions per element than e2m1_magnitude_bits. ----

// Portable forms of IMAD.HI and the unsigned 32-bit max (VIMNMX.U32).
METRALE_HD uint32_t mulhi_u32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return uint32_t((uint64_t(a) * b) >> 32);
#endif
}
METRALE_HD uint32_t max_u32(uint32_t a, uint32_t b) { return a > b ? a : b; }

// z = min(max(|x| * inv8, 0), 1) with the product rounded to f32 first (NaN
// gives 0): one FMUL.SAT with an |x| operand on the device (mul.rn.sat.f32
// clamps the rounded product to [0, 1] and flushes a NaN to +0).
METRALE_HD float mul_abs_sat(float x, float inv8) {
#if defined(__CUDA_ARCH__)
  return __saturatef(__fmul_rn(fabsf(x), inv8));
#else
  const float p = fabsf(x) * inv8;
  return p > 0.0f ? (p < 1.0f ? p : 1.0f) : 0.0f;
#endif
}

// E2M1 magnitude code of y = 8z, z in [0, 1] (no NaN), plus the value 8 for
// y >= 7 (saturated to 7 by e2m1x8_saturate once per word), in the low
// nibble (bits 4..22 of the result are 0, higher bits are garbage). One magic
// add rounds z onto the grid of its binade (the E2M1 grid over 8): z < 1/4
// (y < 2) step 1/16, [1/4, 1/2) step 1/8, [1/2, 1) step 1/4, z = 1 step 1/2;
// the magic M has that step as its ulp and a mantissa offset of 0, 2, 4, 6
// ulps, M = 2^19, 2^20 + 2/8, 2^21 + 4/4, 2^22 + 6/2 (bits 0x49000000,
// 0x49800002, 0x4a000004, 0x4a800006), and z + M stays in M's binade, so the
// IEEE add rounds z to the grid exactly once, ties to the even multiple of
// the step, which with the even offsets is the even E2M1 mantissa; the sum's
// low bits are the multiple plus the offset: 0..4 (codes 0..4), 2..4 + 2
// (codes 4..6), 2..4 + 4 (codes 6, 7 and 8 = 8z rounded to 8), 2 + 6 = 8.
// M's bits from z's biased exponent e = bits(z) >> 23 (an IMAD.HI, z >= 0):
// e * 0x00800002 + 0x0affff08 gives the four values for e = 124..127 and less
// below, where the max with 0x49000000 takes over (e * 0x00800002 < 2^30, no
// wrap). Checked against codec::e2m1_rne_satfinite for every f32 y in
// [0, +inf] (tests/test_codec.cpp), with z = min(y / 8, 1).
// e2m1_sat8_magic(z) is that M, e2m1_sat8_bits(z) the sum's bits.
METRALE_HD float e2m1_sat8_magic(float z) {
  const uint32_t e = mulhi_u32(codec::f32_bits(z), 512u);
  return codec::f32_from_bits(max_u32(e * 0x00800002u + 0x0affff08u, 0x49000000u));
}
METRALE_HD uint32_t e2m1_sat8_bits(float z) { return codec::f32_bits(add_rn(z, e2m1_sat8_magic(z))); }

// Eight nibbles each in 0..8: turns every 8 into 7 (8 - 1 borrows nothing
// from the nibble above) and leaves 0..7 alone.
METRALE_HD uint32_t e2m1x8_saturate(uint32_t acc) { return acc - ((acc & 0x88888888u) >> 3); }

// Whether nvfp4_quantize_groups_unit may serve the global scale g: for every
// nonzero finite E4M3 code s, inv = 1 / (float(s) * g) (the codec's f32
// operations) is finite and >= 2^-123, so inv * 0.125 is exact and normal;
// then for every bf16 x, min(fl(|x| * inv/8), 1) is fl(|x| * inv) / 8 clamped
// to [0, 1] wherever that decides the code: an exact product >= 2^-123 scales
// exactly (an f32 overflow of |x| * inv, code 7, gives z = 1, code 8 -> 7),
// and a smaller one has code 0 either way (y and 8z below 2^-122). Host code,
// evaluated once per launch.
inline bool nvfp4_unit_route_ok(float global_scale) {
  for (uint32_t c = 1; c < codec::kE4M3NaN; ++c) {
    const float inv = 1.0f / (codec::e4m3_to_float(uint8_t(c)) * global_scale);
    if (!(inv >= codec::f32_from_bits(0x02000000u) && inv < codec::f32_from_bits(0x7f800000u))) return false;
  }
  return true;
}

#if defined(__CUDA_ARCH__)
// Two codec::e4m3_rne_satfinite of values that are +0, positive or NaN (a in
// the low byte), sign bits cleared (see e4m3_rne_satfinite_nonneg_hw).
__device__ __forceinline__ uint32_t e4m3x2_rne_satfinite_nonneg_hw(float a, float b) {
  uint16_t c;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(c) : "f"(b), "f"(a));
  return uint32_t(c) & 0x7f7fu;
}
// codec::e4m3_to_float of the two codes in the low two bytes of c (see
// e4m3_to_float_hw; byte 0 -> *a, byte 1 -> *b).
__device__ __forceinline__ void e4m3x2_to_float_hw(uint32_t c, float* a, float* b) {
  asm("{\n\t.reg .b32 t;\n\t.reg .b16 lo, hi;\n\t"
      "cvt.rn.f16x2.e4m3x2 t, %2;\n\tmov.b32 {lo, hi}, t;\n\tcvt.f32.f16 %0, lo;\n\tcvt.f32.f16 %1, hi;\n\t}"
      : "=f"(*a), "=f"(*b)
      : "h"(uint16_t(c)));
}
#endif

// The largest |x| of a group (8 words of bf16 pairs) as an f32 bit pattern
// (bf16 pattern << 16): packed unsigned 16-bit max of the sign-cleared halves
// (see nvfp4_quantize_groups), then the max of the two halves, by swapping
// them (PRMT) and one more packed max; a NaN pattern beats every number.
METRALE_HD uint32_t bf16x16_amax_bits(const uint32_t* v) {
  uint32_t m[4];
  for (int i = 0; i < 4; ++i) m[i] = max_u16x2(v[i] & 0x7fff7fffu, v[i + 4] & 0x7fff7fffu);
  const uint32_t mm = max_u16x2(max_u16x2(m[0], m[1]), max_u16x2(m[2], m[3]));
  return max_u16x2(mm, byte_perm(mm, 0u, 0x1032u)) & 0xffff0000u;
}

// codec::nvfp4_quantize_group for 2 consecutive groups (layout as
// nvfp4_quantize_groups<2>), for a global scale g with
// nvfp4_unit_route_ok(g); six_g = 6.0f * g (f32, as the codec computes it).
//  * amax, q = amax / six_g and the scale code s as nvfp4_quantize_groups
//    (one conversion instruction for both groups on the device).
//  * s = 0 (the codec's `zero`) or s = NaN code: every code 0 (keep mask);
//    the products are then garbage and masked.
//  * otherwise inv = 1 / (float(s) * g) is finite, >= 2^-123 (route
//    condition), inv8 = inv * 0.125 exact; per element
//    z = mul_abs_sat(x, inv8), magnitude by e2m1_sat8_bits (8 saturated to 7
//    per word), sign = x's sign (inv > 0, so x * inv keeps it, -0 included;
//    a NaN x cannot occur: the group's s would be the NaN code).
METRALE_HD void nvfp4_quantize_2groups_unit(const uint32_t* w, float six_g, float global_scale, uint32_t* packed,
                                            uint8_t* scale) {
  const float q0 = codec::f32_from_bits(bf16x16_amax_bits(w)) / six_g;
  const float q1 = codec::f32_from_bits(bf16x16_amax_bits(w + 8)) / six_g;
#if defined(__CUDA_ARCH__)
  const uint32_t s01 = e4m3x2_rne_satfinite_nonneg_hw(q0, q1);
  float sf0, sf1;
  e4m3x2_to_float_hw(s01, &sf0, &sf1);
  const uint8_t s[2] = {uint8_t(s01 & 0xffu), uint8_t(s01 >> 8)};
#else
  const uint8_t s[2] = {codec::e4m3_rne_satfinite(q0), codec::e4m3_rne_satfinite(q1)};
  const float sf0 = codec::e4m3_to_float(s[0]), sf1 = codec::e4m3_to_float(s[1]);
#endif
  const float inv8[2] = {(1.0f / (sf0 * global_scale)) * 0.125f, (1.0f / (sf1 * global_scale)) * 0.125f};
  uint32_t keep[2];
  for (int g = 0; g < 2; ++g) {
    scale[g] = s[g];
    keep[g] = ((s[g] != 0u) & (s[g] != codec::kE4M3NaN)) ? 0xffffffffu : 0u;
  }
  for (int k = 0; k < 4; ++k) {
    const uint32_t* v = w + 4 * k;
    uint32_t acc = 0;
    for (int i = 0; i < 8; ++i) {
      const float x = codec::f32_from_bits((i & 1) ? (v[i / 2] & 0xffff0000u) : (v[i / 2] << 16));
      // Element i ends in bits 4i..4i+3 after the remaining 7 - i shifts.
      acc = shift_in_nibble(acc, e2m1_sat8_bits(mul_abs_sat(x, inv8[k / 2])));
    }
    packed[k] = (e2m1x8_saturate(acc) | e2m1x8_signs(v)) & keep[k / 2];
  }
}

// codec::nvfp4_quantize_group for N consecutive groups, group g's 16 bf16
// values as the 8 words w[8g..8g+7] (element 2i in the low half of w[i]),
// with the same operations on the same values:
//  * amax as the largest |x| bit pattern, taken on the bf16 halves (bf16 ->
//    f32 is exact and keeps the order): for non-negative values the
//    unsigned order of the bits is the float order, and every NaN pattern
//    lies above +inf, so a NaN anywhere makes amax a NaN (its payload does
//    not matter: the scale code of any NaN is 0x7f). A max may be taken in
//    any order.
//  * the scale code and its value: the codec's functions on the host, the
//    hardware conversions on the device; the same IEEE divisions.
//  * a zero scale zeroes every code (the codec's `zero` case); a NaN scale
//    makes inv and every product NaN, codes 0: all zero as well (masked).
//  * otherwise, with 0 < inv < inf, no product is NaN (x is not NaN, since
//    amax is not): codes by e2m1_magnitude_bits, signs those of x (inv > 0,
//    so y keeps x's sign, -0 included). inv = +inf (a tiny s * g underflows)
//    or 0 (a huge one overflows) can make 0 * inf = NaN products, which the
//    codec encodes +0: if any group has such an inv, every group takes the
//    codec's per-element path. Otherwise the groups' code loops hold no
//    branch, so the compiler can interleave them (ILP).
// packed[2g+j] holds element 8j+i of group g in bits 4i..4i+3: read as the
// group's 8 little-endian bytes, element 2i is the low nibble of byte i, as
// the codec packs.
template <int N>
METRALE_HD void nvfp4_quantize_groups(const uint32_t* w, float global_scale, uint32_t* packed, uint8_t* scale) {
  float inv[N];
  uint32_t keep[N];
  bool fast = true;
  for (int g = 0; g < N; ++g) {
    const uint32_t* v = w + 8 * g;
    uint32_t m[4];
    for (int i = 0; i < 4; ++i) m[i] = max_u16x2(v[i] & 0x7fff7fffu, v[i + 4] & 0x7fff7fffu);
    const uint32_t mm = max_u16x2(max_u16x2(m[0], m[1]), max_u16x2(m[2], m[3]));
    const float amax = codec::f32_from_bits(((mm >> 16) > (mm & 0xffffu) ? mm >> 16 : mm & 0xffffu) << 16);
    const float q = amax / (6.0f * global_scale);  // +0, positive or NaN
#if defined(__CUDA_ARCH__)
    const uint8_t s = e4m3_rne_satfinite_nonneg_hw(q);
    inv[g] = 1.0f / (e4m3_to_float_hw(s) * global_scale);
#else
    const uint8_t s = codec::e4m3_rne_satfinite(q);
    inv[g] = 1.0f / (codec::e4m3_to_float(s) * global_scale);
#endif
    scale[g] = s;
    const bool nonzero = (s != 0u) & (s != codec::kE4M3NaN);  // q >= 0: no negative codes
    keep[g] = nonzero ? 0xffffffffu : 0u;
    // Bitwise, not short-circuit: no branches before the code loops.
    fast &= !nonzero | ((inv[g] > 0.0f) & (inv[g] < codec::f32_from_bits(0x7f800000u)));
  }
  // One branch around all N groups' codes, so that they interleave.
  if (fast) {
    for (int k = 0; k < 2 * N; ++k) {
      const uint32_t* v = w + 4 * k;
      uint32_t acc = 0;
      for (int i = 0; i < 8; ++i) {
        const float x = codec::f32_from_bits((i & 1) ? (v[i / 2] & 0xffff0000u) : (v[i / 2] << 16));
        // Element i ends in bits 4i..4i+3 after the remaining 7 - i shifts.
        acc = shift_in_nibble(acc, e2m1_magnitude_bits(x * inv[k / 2]));
      }
      packed[k] = (acc | e2m1x8_signs(v)) & keep[k / 2];
    }
  } else {
    for (int k = 0; k < 2 * N; ++k) {
      const uint32_t* v = w + 4 * k;
      uint32_t acc = 0;
      for (int i = 0; i < 8; ++i) {
        const float x = codec::f32_from_bits((i & 1) ? (v[i / 2] & 0xffff0000u) : (v[i / 2] << 16));
        acc |= uint32_t(codec::e2m1_rne_satfinite(x * inv[k / 2])) << (4 * i);
      }
      packed[k] = acc & keep[k / 2];
    }
  }
}

}  // namespace metrale::cuda::fastq
