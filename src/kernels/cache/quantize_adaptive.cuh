// The cache write's quantizer of Nvfp4ScaleRule::adaptive, bit-identical to
// codec::nvfp4_quantize_group_adaptive (the definition, metrale/codec.hpp;
// docs/nvfp4_scales.md) for two consecutive groups of one thread.
//
// The one idea: each group is encoded twice, with the absmax mapped to 6 and
// to 4, by the same magic-add rounding as fastq::nvfp4_quantize_groups, and
// that add also yields each element's squared error for free: t = v + M
// rounds v = min(|y|, 6) onto the E2M1 grid, so t - M is the code's value c
// (exact: t and M share a binade) and |y| - c is the codec's difference
// w - c. Per element and candidate that is three more operations
// (two adds, one FMA) on top of the encoding, and no table or branch.
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

// One candidate's codes of 8 elements (one word of packed codes, element i
// in bits 4i..4i+3, signs from e2m1x8_signs) and the running sum of their
// squared code errors, for a finite positive inv: per element y = x * inv,
// v = min(|y|, 6), t = v + M (e2m1_magnitude_bits' magic add), code = t's
// low nibble, c = t - M, acc = fma(|y| - c, |y| - c, acc), in element order
// (the codec's order within the group: word 0 holds elements 0..7).
METRALE_HD uint32_t e2m1x8_codes_sq_error(const uint32_t* v, float inv, float& acc) {
  uint32_t codes = 0;
  for (int i = 0; i < 8; ++i) {
    const float x = codec::f32_from_bits((i & 1) ? (v[i / 2] & 0xffff0000u) : (v[i / 2] << 16));
    const float a = fabsf(codec::mul_rn(x, inv));
    const float m = fminf(a, 6.0f);
    const uint32_t e = codec::f32_bits(m) & 0x7f800000u;
    const uint32_t mb = e + (e >> 22) + (0x0b000000u - 0xfeu);
    const float magic = codec::f32_from_bits(mb > 0x4a800000u ? mb : 0x4a800000u);
    const float t = add_rn(m, magic);
    codes = shift_in_nibble(codes, codec::f32_bits(t));
    const float d = sub_rn(a, sub_rn(t, magic));
    acc = codec::fma_rn(d, d, acc);
  }
  return codes | e2m1x8_signs(v);
}

// codec::nvfp4_quantize_group_adaptive of one group, its 16 bf16 values as
// the words v[0..7] (element 2i in the low half of v[i]), for a global scale
// g with nvfp4_unit_route_ok(g), so that every nonzero finite scale has a
// finite positive inv = 1 / (float(s) * g) (no NaN product: x is not NaN
// where s is finite). packed[j] holds element 8j+i in bits 4i..4i+3 (the
// codec's byte order); returns the chosen E4M3 code, and sets six to s6
// (max6's code: an element saturates only where it is 448 or NaN).
//  * amax (bf16x16_amax_bits), s6 = e4m3(amax / (6 g)), s4 = e4m3(amax / (4 g))
//    and their values, as the codec (one hardware conversion each for both
//    on the device).
//  * the group keeps s6 when s6 is 0 or NaN (codes 0), when s4 == s6, or
//    unless its s4 error is strictly smaller; the errors of a masked or
//    equal candidate are computed and discarded.
// One group at a time, so that fewer values are live than with both groups'
// four candidates interleaved (the caller's register budget).
METRALE_HD uint8_t nvfp4_quantize_group_adaptive_unit(const uint32_t* v, float six_g, float four_g, float global_scale,
                                                      uint32_t* packed, uint8_t& six) {
  const float amax = codec::f32_from_bits(bf16x16_amax_bits(v));
#if defined(__CUDA_ARCH__)
  const uint32_t c = e4m3x2_rne_satfinite_nonneg_hw(amax / six_g, amax / four_g);
  float sf6, sf4;
  e4m3x2_to_float_hw(c, &sf6, &sf4);
  const uint8_t s6 = uint8_t(c & 0xffu), s4 = uint8_t(c >> 8);
#else
  const uint8_t s6 = codec::e4m3_rne_satfinite(amax / six_g), s4 = codec::e4m3_rne_satfinite(amax / four_g);
  const float sf6 = codec::e4m3_to_float(s6), sf4 = codec::e4m3_to_float(s4);
#endif
  const float inv6 = 1.0f / (sf6 * global_scale), inv4 = 1.0f / (sf4 * global_scale);
  float acc6 = 0.0f, acc4 = 0.0f;
  const uint32_t a0 = e2m1x8_codes_sq_error(v, inv6, acc6), a1 = e2m1x8_codes_sq_error(v + 4, inv6, acc6);
  const uint32_t b0 = e2m1x8_codes_sq_error(v, inv4, acc4), b1 = e2m1x8_codes_sq_error(v + 4, inv4, acc4);
  const bool nonzero = (s6 != 0u) & (s6 != codec::kE4M3NaN);
  const bool four = nonzero & (s4 != s6) &
                    (codec::mul_rn(codec::mul_rn(sf4, sf4), acc4) < codec::mul_rn(codec::mul_rn(sf6, sf6), acc6));
  const uint32_t keep = nonzero ? 0xffffffffu : 0u;
  packed[0] = (four ? b0 : a0) & keep;
  packed[1] = (four ? b1 : a1) & keep;
  six = s6;
  return four ? s4 : s6;
}

// Two consecutive groups (the cache write's chunk, layout as
// nvfp4_quantize_2groups_unit): nvfp4_quantize_group_adaptive_unit of each;
// six[g]: group g's max6 code.
METRALE_HD void nvfp4_quantize_2groups_adaptive_unit(const uint32_t* w, float global_scale, uint32_t* packed,
                                                     uint8_t* scale, uint8_t* six) {
  const float six_g = 6.0f * global_scale, four_g = 4.0f * global_scale;  // the codec's f32 products
  scale[0] = nvfp4_quantize_group_adaptive_unit(w, six_g, four_g, global_scale, packed, six[0]);
  scale[1] = nvfp4_quantize_group_adaptive_unit(w + 8, six_g, four_g, global_scale, packed + 2, six[1]);
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
