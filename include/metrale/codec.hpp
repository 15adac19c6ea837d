// Scalar codecs of the three KV formats, usable on host and device.
//
// These are THE definition of the quantizers (docs/spec.md section 2): the CPU
// reference and the CUDA cache-write kernels both call them, which is how
// GPU and CPU codes and scales stay bit-identical. Everything is integer bit
// manipulation plus IEEE f32 multiply/divide, which round identically on
// host and device (no fused or approximate operations are involved).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define METRALE_HD __host__ __device__ __forceinline__
#else
#define METRALE_HD inline
#endif
// Full unrolling of a short constant loop in device code (so that its
// arrays stay in registers); nothing on the host.
#if defined(__CUDA_ARCH__)
#define METRALE_UNROLL _Pragma("unroll")
#else
#define METRALE_UNROLL
#endif

namespace metrale {

// Storage type of one bfloat16 value (bit pattern). Host code never does
// arithmetic on it; use bf16_to_float / float_to_bf16.
struct bf16 {
  uint16_t bits;
};
static_assert(sizeof(bf16) == 2, "bf16 must be 2 bytes");

namespace codec {

METRALE_HD uint32_t f32_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}
METRALE_HD float f32_from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

METRALE_HD float bf16_to_float(bf16 v) { return f32_from_bits(uint32_t(v.bits) << 16); }

// Round to nearest even; NaN stays a (quiet) NaN with its sign.
METRALE_HD bf16 float_to_bf16(float x) {
  uint32_t u = f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{uint16_t((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{uint16_t(u >> 16)};
}

// ---- E4M3 (OCP E4M3FN): bias 7, max 448, no infinities, S.1111.111 = NaN ----
constexpr float kE4M3Max = 448.0f;
constexpr uint8_t kE4M3NaN = 0x7f;

METRALE_HD float e4m3_to_float(uint8_t c) {
  const uint32_t sign = uint32_t(c & 0x80u) << 24;
  const uint32_t em = c & 0x7fu;
  if (em == 0x7fu) return f32_from_bits(sign | 0x7fc00000u);
  const uint32_t e = em >> 3, m = em & 7u;
  float mag;
  if (e == 0) {
    mag = float(m) * (1.0f / 512.0f);  // subnormal: m * 2^-9, exact
  } else {
    mag = f32_from_bits(((e + 120u) << 23) | (m << 20));  // 2^(e-7) * 1.m
  }
  return f32_from_bits(f32_bits(mag) | sign);
}

// Round to nearest even, saturating to +-448 (infinities too); NaN -> 0x7f.
// Tiny magnitudes round to a signed zero.
METRALE_HD uint8_t e4m3_rne_satfinite(float x) {
  const uint32_t u = f32_bits(x);
  const uint8_t sign = uint8_t((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return kE4M3NaN;
  uint32_t q;
  if (a < 0x3c800000u) {  // |x| < 2^-6: subnormal grid of step 2^-9
    // |x| * 2^9 is exact; round its integer part to nearest even by hand.
    const float s = f32_from_bits(a) * 512.0f;  // in [0, 8)
    const uint32_t su = f32_bits(s);
    if (s <= 0.5f) {
      q = 0u;  // 0.5 is a tie and goes to the even code 0
    } else {
      // s = 1.f * 2^k with k in [-1, 2]; integer part and remainder in fixed point.
      const int k = int(su >> 23) - 127;
      const uint32_t mant = (su & 0x7fffffu) | 0x800000u;  // s = mant * 2^(k-23)
      const int shift = 23 - k;                             // 21..24
      q = mant >> shift;
      const uint32_t rem = mant & ((1u << shift) - 1u);
      const uint32_t half = 1u << (shift - 1);
      if (rem > half || (rem == half && (q & 1u))) ++q;
    }
  } else {
    // Normal: keep 3 mantissa bits of the rebiased value; the increment may
    // carry into the exponent, which is the correct rounding up.
    const uint32_t t = (((a >> 23) - 120u) << 23) | (a & 0x7fffffu);
    q = t >> 20;
    const uint32_t rem = t & 0xfffffu;
    if (rem > 0x80000u || (rem == 0x80000u && (q & 1u))) ++q;
    if (q > 0x7eu) q = 0x7eu;  // satfinite: 448
  }
  return uint8_t(sign | q);
}

// ---- E2M1: sign, 2 exponent bits, 1 mantissa bit: +-{0,.5,1,1.5,2,3,4,6} ----
constexpr float kE2M1Max = 6.0f;

METRALE_HD float e2m1_to_float(uint8_t c) {
  // Magnitude = code * 0.5 for codes 0..4, then 3, 4, 6.
  const uint32_t m = c & 7u;
  const float mag = m < 5 ? float(m) * 0.5f : (m == 5 ? 3.0f : (m == 6 ? 4.0f : 6.0f));
  return f32_from_bits(f32_bits(mag) | (uint32_t(c & 8u) << 28));
}

// Round to nearest, ties to the even mantissa bit, saturating at 6.
// A NaN encodes as +0: the group's scale carries the NaN (docs/spec.md 2).
METRALE_HD uint8_t e2m1_rne_satfinite(float x) {
  const uint32_t u = f32_bits(x);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0;
  const uint8_t sign = uint8_t((u >> 28) & 8u);
  const float v = f32_from_bits(a);
  uint8_t m;
  // Midpoints between neighbours; <= keeps a tie on the even code (0,1.0,2,4
  // have mantissa 0), < sends it up to the even neighbour.
  if (v <= 0.25f) m = 0;
  else if (v < 0.75f) m = 1;
  else if (v <= 1.25f) m = 2;
  else if (v < 1.75f) m = 3;
  else if (v <= 2.5f) m = 4;
  else if (v < 3.5f) m = 5;
  else if (v <= 5.0f) m = 6;
  else m = 7;
  return uint8_t(sign | m);
}

// ---- NVFP4: one E4M3 scale per 16 consecutive head_dim elements ----
constexpr int kNvfp4GroupSize = 16;

// The largest |x| of a group, NaN if any element is NaN.
METRALE_HD float nvfp4_group_amax(const float* x) {
  float amax = 0.0f;
  bool nan = false;
  METRALE_UNROLL
  for (int i = 0; i < kNvfp4GroupSize; ++i) {
    const float a = f32_from_bits(f32_bits(x[i]) & 0x7fffffffu);
    nan |= (a != a);
    amax = a > amax ? a : amax;
  }
  return nan ? f32_from_bits(0x7fc00000u) : amax;
}

// The codes of a group for the E4M3 scale code `s` (the spec's steps after
// the scale): s == 0 gives every code 0; else inv = 1.0f / (float(s) * g)
// and code_i = e2m1_rne_satfinite(x_i * inv). 8 packed bytes, element 2i in
// bits 0-3.
METRALE_HD void nvfp4_encode_group(const float* x, uint8_t s, float global_scale, uint8_t* packed) {
  const bool zero = (s & 0x7fu) == 0;
  const float inv = zero ? 0.0f : 1.0f / (e4m3_to_float(s) * global_scale);
  METRALE_UNROLL
  for (int i = 0; i < kNvfp4GroupSize; i += 2) {
    const uint8_t lo = zero ? 0 : e2m1_rne_satfinite(x[i] * inv);
    const uint8_t hi = zero ? 0 : e2m1_rne_satfinite(x[i + 1] * inv);
    packed[i / 2] = uint8_t(lo | (hi << 4));
  }
}

// Quantizes one group of 16 values (already converted from bf16 to f32) by
// the spec's rule (Nvfp4ScaleRule::max6): s = e4m3_rne_satfinite(amax / (6 g)).
// `global_scale` is the per-tensor second scale g (1.0 = none); it must be a
// finite positive f32. Writes 8 packed bytes (element 2i in bits 0-3) and
// returns the E4M3 scale code.
METRALE_HD uint8_t nvfp4_quantize_group(const float* x, float global_scale, uint8_t* packed) {
  const uint8_t s = e4m3_rne_satfinite(nvfp4_group_amax(x) / (6.0f * global_scale));
  nvfp4_encode_group(x, s, global_scale, packed);
  return s;
}

// f32 operations the compilers may not fuse with their neighbours: nvcc
// contracts a * b + c into an FMA by default, and so does a host compiler on
// an FMA target under -ffp-contract=fast (GCC's default for GNU C++), which
// would round a product the rule rounds. fma_rn is the one fused operation
// the rule takes, spelled out.
METRALE_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  volatile float p = a * b;
  return p;
#endif
}
METRALE_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// The squared error of a group's codes `packed` (scale code s, nonzero and
// not NaN) in units of 8 times its scale, float(s)^2 * sum_i (w_i - c_i)^2,
// where w_i = |x_i| * inv8, inv8 = (1.0f / (float(s) * g)) * 0.125f (each
// rounded to f32: the quantizer's inv over 8), and c_i = |e2m1 value of
// code i| / 8 (exact). For every ordinary g, inv8 is inv / 8 exactly and so is
// w_i the quantizer's own product |x_i| * inv over 8 wherever it is a normal
// f32; measuring in units of 8 s lets the GPU take w_i and c_i from the
// operations that make its codes (kernels/cache/quantize_adaptive.cuh).
// Wherever two candidates are compared each difference is exact (c_i is w_i
// rounded to the E2M1 grid over 8, or 6/8 below a w_i of at most 9/8:
// Sterbenz, or c_i = 0); the squares are summed in element order, each by
// one FMA, and the sum is scaled by float(s)^2 (exact) in one rounding.
// Times 64 g^2 it is the squared error of the dequantised group up to those
// roundings, and g is common to the candidates compared.
METRALE_HD float nvfp4_group_sq_error(const float* x, uint8_t s, float global_scale, const uint8_t* packed) {
  const float sf = e4m3_to_float(s);
  const float inv8 = mul_rn(1.0f / (sf * global_scale), 0.125f);
  float acc = 0.0f;
  METRALE_UNROLL
  for (int i = 0; i < kNvfp4GroupSize; ++i) {
    const float w = mul_rn(f32_from_bits(f32_bits(x[i]) & 0x7fffffffu), inv8);
    const float c = mul_rn(e2m1_to_float(uint8_t((packed[i / 2] >> (4 * (i & 1))) & 7u)), 0.125f);
    acc = fma_rn(w - c, w - c, acc);
  }
  return mul_rn(sf * sf, acc);
}

// Quantizes one group by Nvfp4ScaleRule::adaptive ("Four Over Six"): the
// spec's scale s6 = e4m3_rne_satfinite(q6), q6 = amax / (6 g), and the
// candidate s4 = e4m3_rne_satfinite(1.5f * q6) (the absmax mapped to 4 up to
// the f32 rounding of the product, a scale about 1.5x larger; a multiply
// where amax / (4 g) would be a second division), each encoded as the spec
// does (nvfp4_encode_group); s4 and
// its codes are kept when nvfp4_group_sq_error(s4) < nvfp4_group_sq_error(s6),
// otherwise (ties included) s6 and its codes. A group whose s6 is 0 or NaN
// keeps max6's result (all codes 0), as does one where s4 == s6 (same
// codes). Same arguments and result as nvfp4_quantize_group.
METRALE_HD uint8_t nvfp4_quantize_group_adaptive(const float* x, float global_scale, uint8_t* packed) {
  const float q6 = nvfp4_group_amax(x) / (6.0f * global_scale);
  const uint8_t s6 = e4m3_rne_satfinite(q6);
  nvfp4_encode_group(x, s6, global_scale, packed);
  if ((s6 & 0x7fu) == 0 || s6 == kE4M3NaN) return s6;
  const uint8_t s4 = e4m3_rne_satfinite(mul_rn(1.5f, q6));
  if (s4 == s6) return s6;
  uint8_t packed4[kNvfp4GroupSize / 2];
  nvfp4_encode_group(x, s4, global_scale, packed4);
  if (!(nvfp4_group_sq_error(x, s4, global_scale, packed4) < nvfp4_group_sq_error(x, s6, global_scale, packed)))
    return s6;
  METRALE_UNROLL
  for (int i = 0; i < kNvfp4GroupSize / 2; ++i) packed[i] = packed4[i];
  return s4;
}

// ---- Saturation: a value past the range its scales were calibrated for ----
// `q` is the value in units of an E4M3 code, the argument the quantizer
// hands to e4m3_rne_satfinite: FP8's x * inv_scale, NVFP4's amax / (6 g) of
// a group (the block scale). It saturates when the limit at 448 changes its
// code: when its magnitude is past 464, the midpoint between 448 and the
// next step of the E4M3 grid (480), up to which it rounds to 448 as it would
// in a format without the limit. So the calibrated absmax itself, which maps
// to 448 up to the f32 rounding of its scale, never counts, and a value 5%
// past it does (a model's decode-time K). +-inf saturates; NaN never
// does (it is kept as a NaN, docs/spec.md 2). This is the one definition the
// cache write counts by on both backends (CacheWriteArgs::saturated).
constexpr float kE4M3SaturationBound = 464.0f;
METRALE_HD bool e4m3_saturates(float q) {
  const uint32_t a = f32_bits(q) & 0x7fffffffu;
  return a > f32_bits(kE4M3SaturationBound) && a <= 0x7f800000u;
}
// Element x of an FP8 row, inv_scale = 1.0f / scale (the quantizer's product).
METRALE_HD bool fp8_saturates(float x, float inv_scale) { return e4m3_saturates(x * inv_scale); }
// Element x of an NVFP4 group, six_g = 6.0f * global_scale (the codec's f32
// product): x alone would need a block scale past the largest (448), so its
// group's scale saturates and the group's largest values are clipped. A group's scale saturates iff
// one of its elements does (the division is monotonic).
METRALE_HD bool nvfp4_saturates(float x, float six_g) { return e4m3_saturates(x / six_g); }

// Whether an E4M3 code can come from a saturating argument: only the
// largest magnitude (448) and NaN codes can (a NaN group scale may sit beside
// saturated elements). Lets a writer look at an element only where this holds.
METRALE_HD bool e4m3_code_may_saturate(uint8_t code) { return (code & 0x7fu) >= 0x7eu; }

}  // namespace codec
}  // namespace metrale
