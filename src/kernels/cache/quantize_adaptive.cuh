// The cache write's quantizer of Nvfp4ScaleRule::adaptive, bit-identical to
// codec::nvfp4_quantize_group_adaptive (the definition, metrale/codec.hpp;
// docs/nvfp4_scales.md) for two consecutive groups of one thread.
//
// Each group is encoded twice, with the absmax mapped to 6 and to 4, by the
// NVFP4 unit route's magic add (fastq::nvfp4_quantize_2groups_unit: codes
// from z = min(|x| * inv/8, 1)), and that add also yields each element's
// squared error, which the codec measures in the same units (w = |x| *
// inv/8, codec::nvfp4_group_sq_error): t = z + M rounds z onto the E2M1
// grid over 8, so t - M is the code's value over 8, c (exact: t and M share
// a binade), and z - c is the codec's w - c wherever z is w (below 1) and
// the code is at most 7. Per element and candidate: one multiply (with the
// clamp), the magic from z's exponent (an IMAD.HI, an IMAD and a max), the
// add, one funnel shift for the code, two subtractions and one FMA for the
// error; five of the nine run on the FMA pipe, where the codec's own units
// (|y| = |x| * inv, min(|y|, 6), the magic from y's exponent) took five on
// the integer ALU, the kernel's busiest pipe.
//
// Where z can reach 7/8 (a code past 7 or w past 1) the shortcut does not
// hold: only in max6's candidate, and only for the scale codes 448 (a
// saturated group: there s4 == s6, so its errors are never compared; its
// codes 8 saturate to 7 as in the unit route) and the subnormal codes 1..3
// (a scale rounded down by up to half a step: w up to 9/8), whose rare
// groups take e2m1x8_codes_sq_error_clamped.
//
// Like the codec, everything is IEEE f32 multiply, divide, add and one
// explicit FMA per element, each spelled as an _rn intrinsic on the device so
// that nothing is contracted; __host__ __device__ so a host test can check it
// against the codec without a GPU (the device's hardware E4M3 conversions
// and its reciprocal have the codec itself as their host branch).
#pragma once

#include <cstdint>

#include "kernels/cache/quantize_fast.cuh"
#include "metrale/codec.hpp"

namespace metrale::cuda::fastq {

METRALE_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

// 1.0f / x, IEEE round to nearest, for x whose biased exponent is 1..252:
// the hardware reciprocal approximation and one Newton step, the sequence
// CUDA's own IEEE reciprocal runs for exactly those x (its range test sends
// the others, zero, subnormals, huge values and inf/NaN, to a slow path). No
// branch, so the two candidates' code loops can interleave. The callers
// check the range on the host (nvfp4_adaptive_route_ok) or pass a scale code
// whose candidate is masked (0 or NaN: any result serves).
METRALE_HD float rcp_rn_normal(float x) {
#if defined(__CUDA_ARCH__)
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return __fmaf_rn(r, __fmaf_rn(-x, r, 1.0f), r);
#else
  return 1.0f / x;
#endif
}

// Whether the adaptive unit route serves the global scale g: the unit
// route's condition (nvfp4_unit_route_ok) and, for every nonzero finite
// E4M3 code s, float(s) * g in rcp_rn_normal's range. Host code, once per
// launch.
inline bool nvfp4_adaptive_route_ok(float global_scale) {
  if (!nvfp4_unit_route_ok(global_scale)) return false;
  for (uint32_t c = 1; c < codec::kE4M3NaN; ++c) {
    const uint32_t e = (codec::f32_bits(codec::e4m3_to_float(uint8_t(c)) * global_scale) >> 23) & 0xffu;
    if (e < 1u || e > 252u) return false;
  }
  return true;
}

// z = min(max(a * inv8, 0), 1) with the product rounded to f32 first: one
// FMUL.SAT (as mul_abs_sat, for an a the caller knows is not negative).
METRALE_HD float mul_sat(float a, float inv8) {
#if defined(__CUDA_ARCH__)
  return __saturatef(__fmul_rn(a, inv8));
#else
  const float p = a * inv8;
  return p > 0.0f ? (p < 1.0f ? p : 1.0f) : 0.0f;
#endif
}

// One candidate's codes of 8 elements (one word, element i in bits
// 4i..4i+3; magnitudes only, 0..8: the caller saturates and adds the signs)
// and the running sum of their squared errors, from the elements' bf16
// magnitudes m (sign bits cleared, so no per-element |x|, which the compiler
// would otherwise compute once for both candidates as an instruction of its
// own), for inv8 = inv * 0.125f of a nonzero finite scale: per element
// z = min(|x| * inv8, 1) (mul_sat),
// t = z + M (e2m1_sat8_magic), code = t's low nibble, c = t - M,
// acc = fma(z - c, z - c, acc), in element order (the codec's order within
// the group: word 0 holds elements 0..7). Equal to the codec's code and
// error wherever |x| * inv8 < 7/8.
METRALE_HD uint32_t e2m1x8_codes_sq_error(const uint32_t* m, float inv8, float& acc) {
  uint32_t codes = 0;
  for (int i = 0; i < 8; ++i) {
    const float a = codec::f32_from_bits((i & 1) ? (m[i / 2] & 0xffff0000u) : (m[i / 2] << 16));
    const float z = mul_sat(a, inv8);
    const float magic = e2m1_sat8_magic(z);
    const float t = add_rn(z, magic);
    codes = shift_in_nibble(codes, codec::f32_bits(t));
    const float d = sub_rn(z, sub_rn(t, magic));
    acc = codec::fma_rn(d, d, acc);
  }
  return codes;
}

// The same codes, and the codec's errors for any |x| * inv8 (every non-NaN
// x): w = |x| * inv8 unclamped, c = min(t - M, 6/8) (a z of 1, or one
// rounding to it, is the code 7: the value 6/8), acc = fma(w - c, w - c,
// acc). Two operations more per element.
METRALE_HD uint32_t e2m1x8_codes_sq_error_clamped(const uint32_t* m, float inv8, float& acc) {
  uint32_t codes = 0;
  for (int i = 0; i < 8; ++i) {
    const float a = codec::f32_from_bits((i & 1) ? (m[i / 2] & 0xffff0000u) : (m[i / 2] << 16));
    const float z = mul_sat(a, inv8);
    const float magic = e2m1_sat8_magic(z);
    const float t = add_rn(z, magic);
    codes = shift_in_nibble(codes, codec::f32_bits(t));
    const float d = sub_rn(codec::mul_rn(a, inv8), fminf(sub_rn(t, magic), 0.75f));
    acc = codec::fma_rn(d, d, acc);
  }
  return codes;
}

// codec::nvfp4_quantize_group_adaptive of one group, its 16 bf16 values as
// the words v[0..7] (element 2i in the low half of v[i]), for a global scale
// g with nvfp4_adaptive_route_ok(g), so that every nonzero finite scale has
// a finite positive inv = 1 / (float(s) * g) with inv8 = inv / 8 exact (no
// NaN product: x is not NaN where s is finite). packed[j] holds element
// 8j+i in bits 4i..4i+3 (the codec's byte order); returns the chosen E4M3
// code, and sets six to s6 (max6's code: an element saturates only where it
// is 448 or NaN).
//  * amax (bf16x16_amax_bits), q6 = amax / (6 g), s6 = e4m3(q6),
//    s4 = e4m3(1.5f * q6) and their values, as the codec (one hardware
//    conversion each for both on the device).
//  * the group keeps s6 when s6 is 0 or NaN (codes 0), when s4 == s6, or
//    unless its s4 error is strictly smaller; the errors of a masked or
//    equal candidate are computed and discarded.
// One group at a time, so that fewer values are live than with both groups'
// four candidates interleaved (the caller's register budget).
METRALE_HD uint8_t nvfp4_quantize_group_adaptive_unit(const uint32_t* v, float six_g, float global_scale,
                                                      uint32_t* packed, uint8_t& six) {
  const float q6 = codec::f32_from_bits(bf16x16_amax_bits(v)) / six_g;
  const float q4 = codec::mul_rn(1.5f, q6);
#if defined(__CUDA_ARCH__)
  const uint32_t c = e4m3x2_rne_satfinite_nonneg_hw(q6, q4);
  float sf6, sf4;
  e4m3x2_to_float_hw(c, &sf6, &sf4);
  const uint8_t s6 = uint8_t(c & 0xffu), s4 = uint8_t(c >> 8);
#else
  const uint8_t s6 = codec::e4m3_rne_satfinite(q6), s4 = codec::e4m3_rne_satfinite(q4);
  const float sf6 = codec::e4m3_to_float(s6), sf4 = codec::e4m3_to_float(s4);
#endif
  const float inv6 = codec::mul_rn(rcp_rn_normal(codec::mul_rn(sf6, global_scale)), 0.125f);
  const float inv4 = codec::mul_rn(rcp_rn_normal(codec::mul_rn(sf4, global_scale)), 0.125f);
  uint32_t m[8];  // the magnitudes (bf16x16_amax_bits takes the same words: one LOP3 each)
  for (int i = 0; i < 8; ++i) m[i] = v[i] & 0x7fff7fffu;
  float acc6 = 0.0f, acc4 = 0.0f;
  uint32_t a0, a1;
  if (s6 - 1u < 3u) {  // rare: a subnormal scale rounded down, w up to 9/8
    a0 = e2m1x8_codes_sq_error_clamped(m, inv6, acc6);
    a1 = e2m1x8_codes_sq_error_clamped(m + 4, inv6, acc6);
  } else {
    a0 = e2m1x8_codes_sq_error(m, inv6, acc6);
    a1 = e2m1x8_codes_sq_error(m + 4, inv6, acc6);
  }
  const uint32_t b0 = e2m1x8_codes_sq_error(m, inv4, acc4), b1 = e2m1x8_codes_sq_error(m + 4, inv4, acc4);
  const bool nonzero = (s6 != 0u) & (s6 != codec::kE4M3NaN);
  const bool four = nonzero & (s4 != s6) &
                    (codec::mul_rn(codec::mul_rn(sf4, sf4), acc4) < codec::mul_rn(codec::mul_rn(sf6, sf6), acc6));
  const uint32_t keep = nonzero ? 0xffffffffu : 0u;
  // max6's codes may hold 8s (saturated to 7); the 4-candidate's never do
  // where it is kept (its z stays below 0.78).
  packed[0] = ((four ? b0 : e2m1x8_saturate(a0)) | e2m1x8_signs(v)) & keep;
  packed[1] = ((four ? b1 : e2m1x8_saturate(a1)) | e2m1x8_signs(v + 4)) & keep;
  six = s6;
  return four ? s4 : s6;
}

// Two consecutive groups (the cache write's chunk, layout as
// nvfp4_quantize_2groups_unit): nvfp4_quantize_group_adaptive_unit of each;
// six[g]: group g's max6 code.
METRALE_HD void nvfp4_quantize_2groups_adaptive_unit(const uint32_t* w, float global_scale, uint32_t* packed,
                                                     uint8_t* scale, uint8_t* six) {
  const float six_g = 6.0f * global_scale;  // the codec's f32 product
  scale[0] = nvfp4_quantize_group_adaptive_unit(w, six_g, global_scale, packed, six[0]);
  scale[1] = nvfp4_quantize_group_adaptive_unit(w + 8, six_g, global_scale, packed + 2, six[1]);
}

// The same for any finite positive g (an extreme one, where 0 * inf
// products need the codec's per-element path): the codec itself, on the 32
// values widened to f32.
METRALE_HD void nvfp4_quantize_2groups_adaptive_codec(const uint32_t* w, float global_scale, uint32_t* packed,
                                                      uint8_t* scale) {
  METRALE_UNROLL
  for (int g = 0; g < 2; ++g) {
    float x[codec::kNvfp4GroupSize];
    METRALE_UNROLL
    for (int i = 0; i < codec::kNvfp4GroupSize; ++i) {
      const uint32_t word = w[8 * g + i / 2];
      x[i] = codec::f32_from_bits((i & 1) ? (word & 0xffff0000u) : (word << 16));
    }
    uint8_t bytes[codec::kNvfp4GroupSize / 2];
    scale[g] = codec::nvfp4_quantize_group_adaptive(x, global_scale, bytes);
    METRALE_UNROLL
    for (int j = 0; j < 2; ++j)
      packed[2 * g + j] = uint32_t(bytes[4 * j]) | uint32_t(bytes[4 * j + 1]) << 8 | uint32_t(bytes[4 * j + 2]) << 16 |
                          uint32_t(bytes[4 * j + 3]) << 24;
  }
}

}  // namespace metrale::cuda::fastq
