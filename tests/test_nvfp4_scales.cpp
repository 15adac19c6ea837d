// NVFP4 group-scale rules (metrale/cache.hpp Nvfp4ScaleRule,
// docs/nvfp4_scales.md): the layout option and its names, the calibration
// of g by rule, the adaptive quantizer of metrale/codec.hpp against an
// independent float64 statement of the rule (special values included), max6
// against the spec's rule as it was written before the rule existed, and the
// GPU cache write's adaptive quantizers (host branches of
// src/kernels/cache/quantize_adaptive.cuh) against the codec bit for bit.
//
// Randomized tests print their seed on failure; METRALE_TEST_SEED replays it.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "kernels/cache/quantize_adaptive.cuh"
#include "metrale/cache.hpp"
#include "metrale/codec.hpp"
#include "metrale/error.hpp"
#include "metrale/format.hpp"

namespace {

using metrale::KvCacheLayout;
using metrale::KvFormat;
using metrale::Nvfp4ScaleRule;
namespace codec = metrale::codec;
namespace fq = metrale::cuda::fastq;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

uint64_t test_seed() {
  if (const char* env = std::getenv("METRALE_TEST_SEED")) return std::strtoull(env, nullptr, 0);
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd();
}

float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

uint8_t nibble(const uint8_t* packed, int i) { return uint8_t((packed[i / 2] >> (4 * (i & 1))) & 15); }

// The spec's max6 rule exactly as the codec wrote it before the adaptive
// rule existed (one function, no shared helpers): the bit-identity reference.
uint8_t spec_max6_group(const float* x, float global_scale, uint8_t* packed) {
  float amax = 0.0f;
  bool nan = false;
  for (int i = 0; i < 16; ++i) {
    const float a = std::fabs(x[i]);
    nan |= std::isnan(a);
    amax = a > amax ? a : amax;
  }
  if (nan) amax = kNaN;
  const uint8_t s = codec::e4m3_rne_satfinite(amax / (6.0f * global_scale));
  const bool zero = (s & 0x7fu) == 0;
  const float inv = zero ? 0.0f : 1.0f / (codec::e4m3_to_float(s) * global_scale);
  for (int i = 0; i < 16; i += 2) {
    const uint8_t lo = zero ? 0 : codec::e2m1_rne_satfinite(x[i] * inv);
    const uint8_t hi = zero ? 0 : codec::e2m1_rne_satfinite(x[i + 1] * inv);
    packed[i / 2] = uint8_t(lo | (hi << 4));
  }
  return s;
}

// Squared error of the dequantised group, in float64: sum (x - e2m1 * s * g)^2.
double dequant_sq_error(const float* x, uint8_t s, float g, const uint8_t* packed) {
  double e = 0.0;
  for (int i = 0; i < 16; ++i) {
    const double d = double(x[i]) - double(codec::e2m1_to_float(nibble(packed, i))) *
                                        double(codec::e4m3_to_float(s)) * double(g);
    e += d * d;
  }
  return e;
}

// The adaptive rule in float64 (docs/nvfp4_scales.md): both candidates from
// the spec's encoding, the one with the smaller dequantised squared error,
// max6 on ties, zero or NaN max6 scales and s4 == s6. Returns the chosen
// candidate (6 or 4) and, in `margin`, |e4 - e6| / max(e4, e6) (how far from
// a tie, where f32 rounding could decide otherwise).
int reference_choice(const float* x, float g, double* margin) {
  uint8_t p6[8], p4[8];
  const uint8_t s6 = spec_max6_group(x, g, p6);
  *margin = 1.0;
  if ((s6 & 0x7f) == 0 || s6 == codec::kE4M3NaN) return 6;
  float amax = 0.0f;
  for (int i = 0; i < 16; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const uint8_t s4 = codec::e4m3_rne_satfinite(1.5f * (amax / (6.0f * g)));  // the rule's f32 spelling
  if (s4 == s6) return 6;
  codec::nvfp4_encode_group(x, s4, g, p4);
  const double e6 = dequant_sq_error(x, s6, g, p6), e4 = dequant_sq_error(x, s4, g, p4);
  const double m = std::fmax(e4, e6);
  *margin = m > 0.0 ? std::fabs(e4 - e6) / m : 0.0;
  return e4 < e6 ? 4 : 6;
}

// ------------------------------------------------------ the layout option

TEST(Nvfp4ScaleRule, NamesRoundTripAndUnknownNamesAreListed) {
  EXPECT_STREQ(metrale::to_string(Nvfp4ScaleRule::max6), "max6");
  EXPECT_STREQ(metrale::to_string(Nvfp4ScaleRule::adaptive), "adaptive");
  for (Nvfp4ScaleRule r : {Nvfp4ScaleRule::max6, Nvfp4ScaleRule::adaptive})
    EXPECT_EQ(metrale::nvfp4_scale_rule_from_string(metrale::to_string(r)), r);
  try {
    metrale::nvfp4_scale_rule_from_string("max4");
    FAIL() << "no throw";
  } catch (const metrale::InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("nvfp4_scales"), std::string::npos) << m;
    EXPECT_NE(m.find("max4"), std::string::npos) << m;
    EXPECT_NE(m.find("max6 or adaptive"), std::string::npos) << m;
  }
}

TEST(Nvfp4ScaleRule, LayoutDefaultsToMax6AndTakesAdaptiveForNvfp4Only) {
  const KvCacheLayout l = KvCacheLayout::nvfp4(4, 16, 2, 128);
  EXPECT_EQ(l.nvfp4_scales, Nvfp4ScaleRule::max6);
  const KvCacheLayout a = l.with_nvfp4_scales(Nvfp4ScaleRule::adaptive);
  EXPECT_EQ(a.nvfp4_scales, Nvfp4ScaleRule::adaptive);
  EXPECT_EQ(a.page_stride_bytes, l.page_stride_bytes);  // same bytes
  EXPECT_EQ(a.kv_bytes_per_token(), l.kv_bytes_per_token());
  for (const KvCacheLayout& other : {KvCacheLayout::bf16(4, 16, 2, 128), KvCacheLayout::fp8(4, 16, 2, 128)}) {
    EXPECT_EQ(other.nvfp4_scales, Nvfp4ScaleRule::max6);
    EXPECT_NO_THROW(other.with_nvfp4_scales(Nvfp4ScaleRule::max6));
    try {
      other.with_nvfp4_scales(Nvfp4ScaleRule::adaptive);
      FAIL() << "no throw for " << metrale::to_string(other.format);
    } catch (const metrale::InvalidArgument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("layout.nvfp4_scales"), std::string::npos) << m;
      EXPECT_NE(m.find("adaptive"), std::string::npos) << m;
      EXPECT_NE(m.find(metrale::to_string(other.format)), std::string::npos) << m;
    }
  }
  KvCacheLayout bad = l;
  bad.nvfp4_scales = Nvfp4ScaleRule(7);
  try {
    bad.validate();
    FAIL() << "no throw";
  } catch (const metrale::InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("layout.nvfp4_scales"), std::string::npos) << m;
    EXPECT_NE(m.find("7"), std::string::npos) << m;
  }
}

// ------------------------------------------------------------ calibration

// Both rules calibrate g = absmax / 2688: every candidate scale is a finite
// E4M3 value; a group holding the absmax keeps max6 (its 4-candidate
// saturates to the same 448), one within 2/3 of it competes with a 4-candidate
// of scale 448 (absmax mapped between 4 and 6, nothing clipped), and no value
// up to the calibrated absmax saturates under either rule.
TEST(Nvfp4ScaleRule, CalibratedGlobalScaleKeepsBothCandidatesFinite) {
  for (float absmax : {1.0f, 37.5f, 0.003f, 6.0e4f}) {
    const float g = metrale::nvfp4_global_scale_from_absmax(absmax);
    float x[16];
    for (int i = 0; i < 16; ++i) x[i] = absmax * float(16 - i) / 16.0f * (i % 2 ? -1.0f : 1.0f);
    uint8_t pa[8], p6[8];
    EXPECT_EQ(int(codec::nvfp4_quantize_group_adaptive(x, g, pa)), 0x7e) << absmax;
    EXPECT_EQ(int(codec::nvfp4_quantize_group(x, g, p6)), 0x7e);
    EXPECT_EQ(0, std::memcmp(pa, p6, 8));
    for (float frac : {0.8f, 0.67f, 0.5f, 0.1f}) {
      const float a = absmax * frac;
      const uint8_t s4 = codec::e4m3_rne_satfinite(a / (4.0f * g));
      EXPECT_LE(int(s4), 0x7e);
      EXPECT_LE(a / (codec::e4m3_to_float(s4) * g), 6.0f) << "4-candidate clips at " << frac;
      for (float v : {a, absmax}) {
        EXPECT_FALSE(codec::nvfp4_saturates(v, 6.0f * g));
      }
    }
  }
}

// ------------------------------------------------- the rule, by example

TEST(Nvfp4Adaptive, FourMappingChosenWhenItsErrorIsSmaller) {
  // amax 4, g 1: max6's scale e4m3(4/6) = 0.6875 puts 4 at 5.82 -> 6, i.e.
  // 4.125; the 4-mapping's scale 1.0 holds 4, 2, 1 and 0.5 exactly.
  float x[16];
  for (int i = 0; i < 16; ++i) x[i] = (i % 2 ? -1.0f : 1.0f) * float(4 >> (i % 4));  // 4, -2, 1, -0, ...
  uint8_t packed[8];
  const uint8_t s = codec::nvfp4_quantize_group_adaptive(x, 1.0f, packed);
  EXPECT_EQ(int(s), 0x38);  // 1.0
  for (int i = 0; i < 16; ++i)
    EXPECT_EQ(double(codec::e2m1_to_float(nibble(packed, i))) * codec::e4m3_to_float(s), double(x[i])) << i;
  uint8_t p6[8];
  EXPECT_EQ(codec::e4m3_to_float(codec::nvfp4_quantize_group(x, 1.0f, p6)), 0.6875f);  // max6's choice
  double margin;
  EXPECT_EQ(reference_choice(x, 1.0f, &margin), 4);
}

TEST(Nvfp4Adaptive, Max6KeptWhenItsErrorIsSmaller) {
  // On max6's grid (scale 1.0): 6, 3, 1.5, 0.5 are exact; the 4-mapping
  // (scale 1.5) cannot hold 0.5 (0.33 -> 0.5, i.e. 0.75).
  const float x[16] = {6, 3, 1.5f, 0.5f, -6, -3, -1.5f, -0.5f, 0, 0, 0, 0, 0, 0, 0, 0};
  uint8_t packed[8], p6[8];
  EXPECT_EQ(int(codec::nvfp4_quantize_group_adaptive(x, 1.0f, packed)), 0x38);
  EXPECT_EQ(int(codec::nvfp4_quantize_group(x, 1.0f, p6)), 0x38);
  EXPECT_EQ(0, std::memcmp(packed, p6, 8));
}

TEST(Nvfp4Adaptive, TieKeepsMax6) {
  // Both exact: 6 and 0 under scale 1.0, 4 and 0 under 1.5 (error 0 each).
  float x[16] = {};
  x[3] = 6.0f;
  x[10] = -6.0f;
  uint8_t packed[8], p6[8];
  EXPECT_EQ(int(codec::nvfp4_quantize_group_adaptive(x, 1.0f, packed)), 0x38);
  EXPECT_EQ(int(codec::nvfp4_quantize_group(x, 1.0f, p6)), 0x38);
  EXPECT_EQ(0, std::memcmp(packed, p6, 8));
  // Equal nonzero errors (f32, as the rule computes them) with different
  // codes: found among two-element groups {amax, v} of bf16 values.
  int ties = 0;
  for (uint32_t ab = 0x3c00; ab < 0x4140 && ties < 50; ++ab) {
    const float amax = float_of(ab << 16);
    for (uint32_t vb = 0x3800; vb < ab; ++vb) {
      float z[16] = {};
      z[0] = amax;
      z[9] = -float_of(vb << 16);
      const uint8_t s6 = codec::e4m3_rne_satfinite(amax / 6.0f), s4 = codec::e4m3_rne_satfinite(1.5f * (amax / 6.0f));
      if (s4 == s6) continue;
      uint8_t c6[8], c4[8];
      codec::nvfp4_encode_group(z, s6, 1.0f, c6);
      codec::nvfp4_encode_group(z, s4, 1.0f, c4);
      const float e6 = codec::nvfp4_group_sq_error(z, s6, 1.0f, c6), e4 = codec::nvfp4_group_sq_error(z, s4, 1.0f, c4);
      if (e6 != e4 || e6 == 0.0f) continue;
      ++ties;
      EXPECT_EQ(int(codec::nvfp4_quantize_group_adaptive(z, 1.0f, packed)), int(s6)) << amax << " " << z[9];
      EXPECT_EQ(0, std::memcmp(packed, c6, 8));
    }
  }
  EXPECT_GT(ties, 0) << "no nonzero tie found to test";
}

// ------------------------------------------------------- special values

TEST(Nvfp4Adaptive, ZeroGroupsAndScalesRoundingToZeroKeepMax6) {
  for (float g : {1.0f, 0.37f, 1e-3f, 250.0f})
    for (float z : {0.0f, -0.0f}) {
      float x[16];
      for (float& v : x) v = z;
      uint8_t packed[8];
      std::memset(packed, 0xcd, 8);
      EXPECT_EQ(int(codec::nvfp4_quantize_group_adaptive(x, g, packed)), 0);
      for (int i = 0; i < 8; ++i) EXPECT_EQ(int(packed[i]), 0) << i;
    }
  // amax / 6 rounds to a zero scale while amax / 4 would not (2^-10 < amax/4):
  // the group keeps max6's all-zero codes.
  float x[16] = {};
  x[2] = -5.0f * 0x1p-10f;  // amax/6 = 0.83 * 2^-10 -> 0; amax/4 = 1.25 * 2^-10 -> 2^-9
  uint8_t packed[8];
  std::memset(packed, 0xcd, 8);
  EXPECT_EQ(int(codec::nvfp4_quantize_group_adaptive(x, 1.0f, packed)), 0);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(int(packed[i]), 0) << i;
  EXPECT_NE(int(codec::e4m3_rne_satfinite(5.0f * 0x1p-10f / 4.0f)), 0);
}

TEST(Nvfp4Adaptive, NaNGroupsHaveTheNaNScaleAndNoFiniteCodes) {
  for (float g : {1.0f, 0.01f, 3.0f})
    for (int pos : {0, 7, 15})
      for (uint32_t nb : {0x7fc00000u, 0xffc00000u, 0x7f800001u}) {
        float x[16];
        for (int i = 0; i < 16; ++i) x[i] = float(i) - 7.5f;
        x[pos] = float_of(nb);
        uint8_t packed[8], p6[8];
        const uint8_t s = codec::nvfp4_quantize_group_adaptive(x, g, packed);
        EXPECT_EQ(int(s), int(codec::kE4M3NaN));
        EXPECT_EQ(int(spec_max6_group(x, g, p6)), int(s));
        EXPECT_EQ(0, std::memcmp(packed, p6, 8));
        for (int i = 0; i < 16; ++i)
          EXPECT_TRUE(std::isnan(codec::e2m1_to_float(nibble(packed, i)) * codec::e4m3_to_float(s))) << i;
      }
}

TEST(Nvfp4Adaptive, SaturatedAndInfiniteGroupsEqualMax6) {
  // amax / (6 g) past 464: both candidates' scales saturate to 448 (same codes).
  for (float g : {1.0f, 0.02f})
    for (float big : {6.0f * 464.5f, 1e6f, FLT_MAX, kInf, -kInf}) {
      float x[16];
      for (int i = 0; i < 16; ++i) x[i] = float(i) * 40.0f * (i % 2 ? -1.0f : 1.0f);
      x[5] = big;
      uint8_t packed[8], p6[8];
      const uint8_t s = codec::nvfp4_quantize_group_adaptive(x, g, packed);
      EXPECT_EQ(int(s), 0x7e) << big;
      EXPECT_EQ(int(spec_max6_group(x, g, p6)), 0x7e);
      EXPECT_EQ(0, std::memcmp(packed, p6, 8)) << big;
    }
  // Only the 4-candidate saturates (amax / (4g) > 464 >= amax / (6g)): its
  // scale is 448, not clipped (amax / 448 < 6), and it competes as usual.
  float x[16];
  for (int i = 0; i < 16; ++i) x[i] = 2400.0f * float(16 - i) / 16.0f;
  uint8_t packed[8];
  const uint8_t s = codec::nvfp4_quantize_group_adaptive(x, 1.0f, packed);
  double margin;
  const int want = reference_choice(x, 1.0f, &margin);
  EXPECT_EQ(int(codec::e4m3_rne_satfinite(2400.0f / 4.0f)), 0x7e);
  EXPECT_LT(int(codec::e4m3_rne_satfinite(2400.0f / 6.0f)), 0x7e);
  if (margin > 1e-5) EXPECT_EQ(int(s), want == 4 ? 0x7e : int(codec::e4m3_rne_satfinite(2400.0f / 6.0f)));
}

TEST(Nvfp4Adaptive, TinyGroupsOnSubnormalScales) {
  // Group scales on the E4M3 subnormal grid (amax / 6 around 2^-9 .. 2^-6),
  // where max6's rounding of the scale can leave amax * inv near 9; every
  // choice agrees with the float64 statement of the rule.
  std::mt19937_64 rng(test_seed());
  int fours = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const float amax = std::ldexp(1.0f + float(rng() % 1000) / 1000.0f, -10 + int(rng() % 7)) * 6.0f;
    float x[16];
    for (int i = 0; i < 16; ++i)
      x[i] = codec::bf16_to_float(codec::float_to_bf16(amax * float(int(rng() % 2001) - 1000) / 1000.0f));
    x[rng() % 16] = codec::bf16_to_float(codec::float_to_bf16(amax));
    uint8_t packed[8];
    const uint8_t s = codec::nvfp4_quantize_group_adaptive(x, 1.0f, packed);
    double margin;
    const int want = reference_choice(x, 1.0f, &margin);
    uint8_t p6[8];
    const uint8_t s6 = spec_max6_group(x, 1.0f, p6);
    const bool chose4 = s != s6 || std::memcmp(packed, p6, 8) != 0;
    fours += chose4;
    if (margin > 1e-5) ASSERT_EQ(chose4 ? 4 : 6, want) << "iter " << iter << " amax " << amax;
  }
  EXPECT_GT(fours, 100);
}

TEST(Nvfp4Adaptive, NegativeZeroAndTinyNegativesKeepTheirSign) {
  // A group the 4-mapping wins (scale 1.0 holds 4, 2, 1 exactly; max6's
  // 0.6875 does not): -0 -> 0x8, -0.01 and -0.1 -> 0x8 (-0), -2 -> 0xc.
  const float x[16] = {4.0f, -0.0f, -0.01f, -2.0f, 1.0f, -0.1f, 2.0f, -4.0f, 0, 0, 0, 0, 0, 0, 0, 0};
  uint8_t packed[8];
  EXPECT_EQ(int(codec::nvfp4_quantize_group_adaptive(x, 1.0f, packed)), 0x38);
  const int want[8] = {0x6, 0x8, 0x8, 0xc, 0x2, 0x8, 0x4, 0xe};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(int(nibble(packed, i)), want[i]) << i;
  for (int i = 8; i < 16; ++i) EXPECT_EQ(int(nibble(packed, i)), 0) << i;
}

// ---------------------------------------------------- random groups

// Groups like the GPU tests' (gaussian-ish, outliers, signed zeros,
// subnormals, occasional specials), global scales from 1 to extreme.
void random_group(std::mt19937_64& rng, float center, bool specials, uint16_t* bits, float* x) {
  for (int i = 0; i < 16; ++i) {
    const uint64_t r = rng();
    uint16_t b;
    switch (r % 41) {
      case 0: b = 0x7fc0; break;
      case 1: b = 0x7f80; break;
      case 2: b = 0xff80; break;
      case 3: b = 0x8000; break;
      case 4: b = uint16_t(0x0001 + (r >> 8) % 0x7f); break;
      case 5: b = uint16_t(r >> 16); break;
      default: {
        const float v = center * std::exp2(float(int((r >> 8) % 24)) - 16.0f) * float(int((r >> 16) % 2001) - 1000) /
                        1000.0f;
        b = codec::float_to_bf16(v).bits;
      }
    }
    if (!specials && (b & 0x7fff) >= 0x7f80) b = uint16_t(b & 0x8000);
    bits[i] = b;
    x[i] = float_of(uint32_t(b) << 16);
  }
}

TEST(Nvfp4Adaptive, Max6IsBitIdenticalToTheSpecRule) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> ue(-40.0f, 40.0f);
  for (int iter = 0; iter < 200000; ++iter) {
    const float g = iter % 3 == 0 ? 1.0f : std::exp2(ue(rng) * (iter % 7 == 0 ? 3.0f : 0.3f));
    uint16_t bits[16];
    float x[16];
    random_group(rng, std::exp2(ue(rng) * 0.5f), iter % 5 == 0, bits, x);
    uint8_t a[8], b[8];
    const uint8_t sa = codec::nvfp4_quantize_group(x, g, a), sb = spec_max6_group(x, g, b);
    ASSERT_TRUE(sa == sb && std::memcmp(a, b, 8) == 0) << "iter " << iter;
  }
}

TEST(Nvfp4Adaptive, RandomGroupsFollowTheRuleAndNeverLoseToMax6) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  double sum6 = 0, sum4 = 0, sumx = 0;
  int fours = 0;
  for (int iter = 0; iter < 100000; ++iter) {
    const float g = iter % 2 ? 1.0f : 4.5f * 0.37f / 2688.0f;  // calibrated-like: 4.5 sigma maps to 2688
    float x[16];
    for (float& v : x) v = codec::bf16_to_float(codec::float_to_bf16(n01(rng) * 0.37f));
    uint8_t pa[8], p6[8];
    const uint8_t sa = codec::nvfp4_quantize_group_adaptive(x, g, pa);
    const uint8_t s6 = codec::nvfp4_quantize_group(x, g, p6);
    const double ea = dequant_sq_error(x, sa, g, pa), e6 = dequant_sq_error(x, s6, g, p6);
    // The f32 error of the rule can only mis-order near-ties.
    ASSERT_LE(ea, e6 * (1.0 + 1e-5)) << "iter " << iter;
    double margin;
    const int want = reference_choice(x, g, &margin);
    const bool chose4 = sa != s6 || std::memcmp(pa, p6, 8) != 0;
    if (margin > 1e-5) ASSERT_EQ(chose4 ? 4 : 6, want) << "iter " << iter;
    if (chose4) {
      uint8_t p4[8];
      float amax = 0;
      for (float v : x) amax = std::fmax(amax, std::fabs(v));
      ASSERT_EQ(sa, codec::e4m3_rne_satfinite(amax / (4.0f * g)));
      codec::nvfp4_encode_group(x, sa, g, p4);
      ASSERT_EQ(0, std::memcmp(pa, p4, 8));
    }
    fours += chose4;
    sum6 += e6;
    sum4 += ea;
    for (float v : x) sumx += double(v) * v;
  }
  // Gaussian groups: about 9.5% relative RMS error under max6, less under
  // adaptive (Cook et al. report 8.7%).
  const double rms6 = std::sqrt(sum6 / sumx), rmsa = std::sqrt(sum4 / sumx);
  EXPECT_GT(rms6, 0.07);
  EXPECT_LT(rms6, 0.12);
  EXPECT_LT(rmsa, rms6 * 0.97);
  EXPECT_GT(fours, 20000);
  std::printf("gaussian groups: relative RMS error max6 %.4f, adaptive %.4f (%d of 100000 groups mapped to 4)\n",
              rms6, rmsa, fours);
}

// ------------------------------------- the GPU write's quantizers (host)

TEST(Nvfp4AdaptiveFast, ElementCodesAndErrorsForEveryBf16AndScale) {
  // e2m1x8_codes_sq_error and its clamped form on a word whose element 0 is
  // |x| (the others 0) against the codec's code and squared difference in
  // units of 8 s (codec::nvfp4_group_sq_error), every bf16 x and every
  // nonzero finite scale, at g = 1 and a calibrated-like g: the fast form
  // wherever |x| * inv8 < 7/8 (elsewhere its code saturates to 7), the
  // clamped form everywhere.
  uint64_t bad = 0, fast = 0;
  for (float g : {1.0f, 30.0f / 1792.0f}) {
    ASSERT_TRUE(fq::nvfp4_adaptive_route_ok(g)) << g;
    for (uint32_t s = 1; s < codec::kE4M3NaN; ++s) {
      const float inv = 1.0f / (codec::e4m3_to_float(uint8_t(s)) * g), inv8 = inv * 0.125f;
      for (uint32_t b = 0; b < 0x10000u; ++b) {
        if ((b & 0x7fffu) > 0x7f80u) continue;  // NaN: the group's scale is NaN
        const uint32_t m[4] = {b & 0x7fffu, 0, 0, 0};
        const float x = float_of(b << 16);
        const uint8_t want = codec::e2m1_rne_satfinite(x * inv) & 7u;
        const float w = std::fabs(x) * inv8, c = codec::e2m1_to_float(want) * 0.125f;
        const float want_acc = std::fma(w - c, w - c, 0.0f);
        float acc = 0.0f, acc_clamped = 0.0f;
        const uint32_t codes = fq::e2m1x8_codes_sq_error(m, inv8, acc);
        const uint32_t codes_clamped = fq::e2m1x8_codes_sq_error_clamped(m, inv8, acc_clamped);
        bool ok = codes == codes_clamped && (fq::e2m1x8_saturate(codes) & 0xfu) == want && (codes >> 4) == 0 &&
                  std::memcmp(&acc_clamped, &want_acc, 4) == 0;
        if (w < 0.875f) {
          ok &= (codes & 0xfu) == want && std::memcmp(&acc, &want_acc, 4) == 0;
          ++fast;
        }
        if (!ok && ++bad <= 10)
          ADD_FAILURE() << "g " << g << " s " << s << " x bits " << b << ": code " << (codes & 15) << " want "
                        << int(want) << ", err " << acc << " / " << acc_clamped << " want " << want_acc;
      }
    }
  }
  EXPECT_EQ(bad, 0u);
  EXPECT_GT(fast, 1000000u);
}

TEST(Nvfp4AdaptiveFast, GroupsMatchCodec) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> ue(-40.0f, 40.0f);
  int bad = 0, unit_chunks = 0, codec_chunks = 0;
  for (int iter = 0; iter < 200000; ++iter) {
    float g = iter % 3 == 0 ? 1.0f : std::exp2(ue(rng) * (iter % 7 == 0 ? 3.2f : 0.3f));
    if (iter % 101 == 0) g = 1e-42f;  // extreme: subnormal g
    const float center = std::exp2(ue(rng) * 0.5f) * (iter % 11 == 0 ? 0x1p-12f : 1.0f);  // tiny groups too
    uint32_t w[16];
    float x[32];
    uint16_t bits[32];
    random_group(rng, center, iter % 5 == 0, bits, x);
    random_group(rng, center, iter % 5 == 0, bits + 16, x + 16);
    for (int i = 0; i < 16; ++i) w[i] = uint32_t(bits[2 * i]) | uint32_t(bits[2 * i + 1]) << 16;
    uint8_t want_packed[16], want_s[2];
    want_s[0] = codec::nvfp4_quantize_group_adaptive(x, g, want_packed);
    want_s[1] = codec::nvfp4_quantize_group_adaptive(x + 16, g, want_packed + 8);
    auto check = [&](const char* name, const uint32_t* packed, const uint8_t* s) {
      if ((std::memcmp(packed, want_packed, 16) != 0 || s[0] != want_s[0] || s[1] != want_s[1]) && ++bad <= 10)
        ADD_FAILURE() << name << " iter " << iter << " g " << g << " scales " << int(s[0]) << "," << int(s[1])
                      << " want " << int(want_s[0]) << "," << int(want_s[1]);
    };
    uint32_t packed[4];
    uint8_t s[2];
    fq::nvfp4_quantize_2groups_adaptive_codec(w, g, packed, s);
    check("adaptive_codec", packed, s);
    ++codec_chunks;
    if (fq::nvfp4_adaptive_route_ok(g)) {
      uint8_t six[2];
      fq::nvfp4_quantize_2groups_adaptive_unit(w, g, packed, s, six);
      check("adaptive_unit", packed, s);
      // six: the max6 codes, which alone decide whether a group may saturate
      uint8_t max6_packed[8];
      for (int grp = 0; grp < 2; ++grp)
        if (six[grp] != codec::nvfp4_quantize_group(x + 16 * grp, g, max6_packed) && ++bad <= 10)
          ADD_FAILURE() << "adaptive_unit max6 code, iter " << iter << " group " << grp;
      ++unit_chunks;
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(unit_chunks, 150000);
  EXPECT_EQ(codec_chunks, 200000);
}

}  // namespace
