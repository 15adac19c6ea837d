// The cache write's quantizer of Nvfp4ScaleRule::adaptive, bit-identical to
// codec::nvfp4_quantize_group_adaptive (the definition, metrale/codec.hpp;
// docs/nvfp4_scales.md) for two consecutive groups of one thread.
//
// Each group is encoded twice, with the absmax mapped to 6 and to 4, by one
// magic add per element and candidate, and that add also yields the
// element's squared error: t = v + M rounds v = |y| (y = x * inv) onto the
// E2M1 grid, t's low nibble is the code and t - M the code's value c (exact:
// t and M share a binade), so |y| - c is the codec's difference w - c. Per
// element and candidate: one multiply, the magic M from y's exponent (two
// integer multiply-adds and a max), the add, one funnel shift for the code,
// two subtractions and one FMA for the error. Nothing else per element: the
// signs are taken once per word for the kept codes, and no code exceeds 7
// (see e2m1x8_codes_sq_error), so no saturation step.
//
// Per group: the scale codes from q6 = amax / (6 g) and 1.5f * q6 (two
// hardware conversions for both groups on the device), and the candidates'
// inv = 1 / (float(s) * g) and float(s)^2 from tables indexed by the code
// (nvfp4_adaptive_inv_entry, nvfp4_adaptive_sq_entry; the kernel fills them
// in shared memory), so the one division per group is max6's amax / (6 g).
//
// Like the codec, everything is IEEE f32 multiply, divide, add and one
// explicit FMA per element, each spelled as an _rn intrinsic on the device so
// that nothing is contracted; __host__ __device__ so a host test can check it
// against the codec without a GPU (the device's hardware E4M3 conversions
// have the codec itself as their host branch, quantize_fast.cuh).
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

// The entries of the adaptive unit route's tables, indexed by an E4M3 scale
// code c (0..127): inv[c] = 1.0f / (float(c) * g), the codec's f32 value for
// the global scale g, and sq[c] = float(c) * float(c) (exact), the factor of
// codec::nvfp4_group_sq_error; both 0 for the codes 0 and NaN (0x7f), whose
// groups are zeroed whatever their products. nvfp4_unit_route_ok(g) makes
// every other inv finite and positive.
METRALE_HD float nvfp4_adaptive_inv_entry(uint32_t c, float global_scale) {
  return (c == 0u || c >= codec::kE4M3NaN) ? 0.0f : 1.0f / (codec::e4m3_to_float(uint8_t(c)) * global_scale);
}
METRALE_HD float nvfp4_adaptive_sq_entry(uint32_t c) {
  const float sf = codec::e4m3_to_float(uint8_t(c));
  return (c == 0u || c >= codec::kE4M3NaN) ? 0.0f : sf * sf;
}

// The E2M1 rounding magic of e2m1_magnitude_bits for v >= +0 (not NaN), up
// to v < 8: M = 2^22, 2^23 + 2, 2^24 + 8 (bits 0x4a800000, 0x4b000002,
// 0x4b800004) for v below 2, in [2, 4), in [4, 8), from v's biased exponent
// e = bits(v) >> 23 (an IMAD.HI, v >= 0): e * 0x00800002 + 0x0affff02 gives
// the three for e = 127..129 and less below, where the max takes over (the
// product wraps harmlessly for e > 129, where the result is not used).
METRALE_HD float e2m1_magic(float v) {
  const uint32_t e = mulhi_u32(codec::f32_bits(v), 512u);
  return codec::f32_from_bits(max_u32(e * 0x00800002u + 0x0affff02u, 0x4a800000u));
}

// One candidate's codes of 8 elements x[0..7] (one word of packed
// magnitudes, element i in bits 4i..4i+2, bit 4i+3 clear) and the running
// sum of their squared code errors, for a finite positive inv: per element
// y = |x| * inv, v = y (kClamp: min(y, 6)), M = e2m1_magic(v), t = v + M,
// code = t's low nibble, c = t - M, acc = fma(y - c, y - c, acc), in element
// order (the codec's order: the group's word 0 holds elements 0..7). Valid
// where y < 7 for every element, or for any finite y with kClamp: then t's
// low nibble is codec::e2m1_rne_satfinite(y)'s magnitude (0..7; for y in
// (6, 7) the add rounds to 6 itself, code 7) and c its value, so y - c is
// exact as in the codec. Where neither holds the results are garbage (the
// caller discards them).
template <bool kClamp>
METRALE_HD uint32_t e2m1x8_codes_sq_error(const float* x, float inv, float& acc) {
  uint32_t codes = 0;
  METRALE_UNROLL
  for (int i = 0; i < 8; ++i) {
    const float y = codec::mul_rn(fabsf(x[i]), inv);
    const float v = kClamp ? fminf(y, 6.0f) : y;
    const float m = e2m1_magic(v);
    const float t = add_rn(v, m);
    // Element i ends in bits 4i..4i+3 after the remaining 7 - i shifts.
    codes = shift_in_nibble(codes, codec::f32_bits(t));
    const float d = sub_rn(y, sub_rn(t, m));
    acc = codec::fma_rn(d, d, acc);
  }
  return codes;
}

// codec::nvfp4_quantize_group_adaptive of one group, its 16 bf16 values as
// the words v[0..7] (element 2i in the low half of v[i]), with the scale
// codes s6 and s4 already taken (nvfp4_quantize_2groups_adaptive_unit), inv
// and sq the tables of the group's g (nvfp4_adaptive_inv_entry,
// nvfp4_adaptive_sq_entry; index 0..127). packed[j] holds
// element 8j+i in bits 4i..4i+3 (the codec's byte order); returns the chosen
// E4M3 code.
//  * both candidates' codes and errors by e2m1x8_codes_sq_error. The
//    4-candidate's y stay below 7 wherever it is compared (s4 != s6, s6 not 0
//    or NaN): amax * inv4 is at most about 4 * 16/15 for a normal s4, below
//    6 for a subnormal one (amax / (4 g) below 1.5 of its code's step), and
//    below 432 * 6 / 448 where s4 saturates to 448 but s6 does not. So are
//    the 6-candidate's (at most 6 * 17/16 for a normal s6 below 448, 6 * 4.5/4
//    for a subnormal one from 4 up), except where s6 is one of the subnormal
//    codes 1..3 (a scale rounded down by up to half its step: y up to
//    6 * 1.5) or 448 (values past the largest scale saturate: any y), whose
//    6-candidate codes are kept or compared: kClamp6 clamps them
//    (nvfp4_adaptive_needs_clamp), and gives the same results as without on
//    every other group.
//  * the group keeps s6 when s6 is 0 or NaN (codes 0), when s4 == s6, or
//    unless sq[s4] * acc4 < sq[s6] * acc6 (the codec's errors); the
//    errors of a masked or equal candidate are computed and discarded.
//  * signs of x (inv > 0, so y keeps x's sign, -0 included) once for the
//    kept codes.
template <bool kClamp6>
METRALE_HD uint8_t nvfp4_quantize_group_adaptive_unit(const uint32_t* v, uint8_t s6, uint8_t s4, const float* inv,
                                                      const float* sq, uint32_t* packed) {
  float x[codec::kNvfp4GroupSize];
  METRALE_UNROLL
  for (int i = 0; i < codec::kNvfp4GroupSize; ++i)
    x[i] = codec::f32_from_bits((i & 1) ? (v[i / 2] & 0xffff0000u) : (v[i / 2] << 16));
  const float inv6 = inv[s6], inv4 = inv[s4];
  float acc6 = 0.0f, acc4 = 0.0f;
  const uint32_t a0 = e2m1x8_codes_sq_error<kClamp6>(x, inv6, acc6);
  const uint32_t a1 = e2m1x8_codes_sq_error<kClamp6>(x + 8, inv6, acc6);
  const uint32_t b0 = e2m1x8_codes_sq_error<false>(x, inv4, acc4);
  const uint32_t b1 = e2m1x8_codes_sq_error<false>(x + 8, inv4, acc4);
  const bool nonzero = (s6 != 0u) & (s6 != codec::kE4M3NaN);
  const bool four = nonzero & (s4 != s6) & (codec::mul_rn(sq[s4], acc4) < codec::mul_rn(sq[s6], acc6));
  const uint32_t keep = nonzero ? 0xffffffffu : 0u;
  packed[0] = ((four ? b0 : a0) | e2m1x8_signs(v)) & keep;
  packed[1] = ((four ? b1 : a1) | e2m1x8_signs(v + 4)) & keep;
  return four ? s4 : s6;
}

// Whether the 6-candidate of a group with scale code s6 needs the clamp
// (nvfp4_quantize_group_adaptive_unit): s6 one of the subnormal codes 1..3,
// or 448 (0x7e).
METRALE_HD bool nvfp4_adaptive_needs_clamp(uint8_t s6) { return uint8_t(s6 - 1u) < 3u || s6 == 0x7eu; }

// Two consecutive groups (the cache write's chunk, layout as
// nvfp4_quantize_2groups_unit), for a global scale g with
// nvfp4_unit_route_ok(g); six_g = 6.0f * g (the codec's f32 product), inv
// and sq g's tables. The scale codes of both groups first: q6 = amax / six_g,
// s6 = e4m3(q6), s4 = e4m3(1.5f * q6) (the codec's operations; one hardware
// conversion per candidate for both groups on the device). Then each group
// by nvfp4_quantize_group_adaptive_unit, with the 6-candidate's clamp only
// where some group needs it: on the device wherever one of the warp's
// (active) threads has such a group, so that the warp takes one path.
METRALE_HD void nvfp4_quantize_2groups_adaptive_unit(const uint32_t* w, float six_g, const float* inv, const float* sq,
                                                     uint32_t* packed, uint8_t* scale) {
  const float q0 = codec::f32_from_bits(bf16x16_amax_bits(w)) / six_g;
  const float q1 = codec::f32_from_bits(bf16x16_amax_bits(w + 8)) / six_g;
  const float r0 = codec::mul_rn(1.5f, q0), r1 = codec::mul_rn(1.5f, q1);
#if defined(__CUDA_ARCH__)
  const uint32_t c6 = e4m3x2_rne_satfinite_nonneg_hw(q0, q1), c4 = e4m3x2_rne_satfinite_nonneg_hw(r0, r1);
  const uint8_t s6[2] = {uint8_t(c6 & 0xffu), uint8_t(c6 >> 8)}, s4[2] = {uint8_t(c4 & 0xffu), uint8_t(c4 >> 8)};
  const bool clamp = __any_sync(__activemask(), nvfp4_adaptive_needs_clamp(s6[0]) | nvfp4_adaptive_needs_clamp(s6[1]));
#else
  const uint8_t s6[2] = {codec::e4m3_rne_satfinite(q0), codec::e4m3_rne_satfinite(q1)};
  const uint8_t s4[2] = {codec::e4m3_rne_satfinite(r0), codec::e4m3_rne_satfinite(r1)};
  const bool clamp = nvfp4_adaptive_needs_clamp(s6[0]) | nvfp4_adaptive_needs_clamp(s6[1]);
#endif
  if (clamp) {
    for (int g = 0; g < 2; ++g)
      scale[g] = nvfp4_quantize_group_adaptive_unit<true>(w + 8 * g, s6[g], s4[g], inv, sq, packed + 2 * g);
  } else {
    for (int g = 0; g < 2; ++g)
      scale[g] = nvfp4_quantize_group_adaptive_unit<false>(w + 8 * g, s6[g], s4[g], inv, sq, packed + 2 * g);
  }
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
