// Tests of the scalar codecs in include/metrale/codec.hpp (docs/spec.md section 2).
//
// Every expected value in this file comes from references written here,
// independently of the codec's bit manipulation: decoded values from the
// textbook formulas (std::ldexp in double, literal tables), encodings from a
// nearest-value search over the sorted table of representable values in
// double precision, with ties resolved to the even code. The only f32
// arithmetic the references share with the codec is what docs/spec.md itself
// prescribes (amax / (6 * g), 1.0f / (s * g), x * inv).
//
// Randomized tests draw their seed from std::random_device; it is printed
// via SCOPED_TRACE on any failure, and METRALE_TEST_SEED=<n> replays it.

#include <gtest/gtest.h>

#include <metrale/codec.hpp>

#include "kernels/cache/quantize_fast.cuh"  // host branches of the GPU cache-write quantizers

#include <algorithm>
#include <array>
#include <cfloat>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using metrale::bf16;
namespace codec = metrale::codec;

// ----------------------------------------------------------------- helpers

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

std::string hex(uint32_t v, int digits = 2) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%0*" PRIx32, digits, v);
  return buf;
}

// "x=1.5 (0x1.8p+0, bits 0x3fc00000)"
std::string desc(float x) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "x=%.9g (%a, bits 0x%08" PRIx32 ")", double(x), double(x), bits_of(x));
  return buf;
}

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kDenormMin = std::numeric_limits<float>::denorm_min();

float up(float x) { return std::nextafter(x, kInf); }
float down(float x) { return std::nextafter(x, -kInf); }

uint64_t test_seed() {
  if (const char* env = std::getenv("METRALE_TEST_SEED")) return std::strtoull(env, nullptr, 0);
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd();
}

// Stops a brute-force loop from flooding the log: the first few mismatches
// are reported in full, the rest only counted.
struct FailureBudget {
  int count = 0;
  bool report() { return ++count <= 10; }
  ~FailureBudget() {
    if (count > 10) ADD_FAILURE() << count << " mismatches in total (first 10 shown)";
  }
};

// ------------------------------------------------ independent references

// E4M3 (OCP E4M3FN): S.EEEE.MMM, bias 7, subnormals m/8 * 2^-6,
// S.1111.111 = NaN, no infinities.
double ref_e4m3_value(uint8_t c) {
  const int s = (c >> 7) & 1, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

// Positive finite E4M3 values in code order 0x00..0x7e (checked sorted below).
const std::array<double, 127>& e4m3_pos_table() {
  static const std::array<double, 127> t = [] {
    std::array<double, 127> a{};
    for (int c = 0; c < 127; ++c) a[c] = ref_e4m3_value(uint8_t(c));
    return a;
  }();
  return t;
}

const std::array<double, 8> kE2M1Pos = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

// Nearest entry of a sorted table (index = code), ties to the even index,
// saturating at the last entry. Pure double comparisons against exact
// midpoints (every midpoint of these tables is exact in double).
template <size_t N>
int ref_nearest_even(const std::array<double, N>& t, double a) {
  if (a >= t[N - 1]) return int(N - 1);
  const int k = int(std::upper_bound(t.begin(), t.end(), a) - t.begin()) - 1;  // t[k] <= a < t[k+1]
  const double mid = 0.5 * (t[k] + t[k + 1]);
  if (a < mid) return k;
  if (a > mid) return k + 1;
  return (k & 1) ? k + 1 : k;
}

uint8_t ref_e4m3_encode(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  return uint8_t(sign | ref_nearest_even(e4m3_pos_table(), std::fabs(double(x))));
}

uint8_t ref_e2m1_encode(float x) {
  if (std::isnan(x)) return 0;
  const uint8_t sign = std::signbit(x) ? 0x8 : 0x0;
  return uint8_t(sign | ref_nearest_even(kE2M1Pos, std::fabs(double(x))));
}

// bf16 value from the format definition: 1 sign, 8 exponent (bias 127),
// 7 mantissa bits.
double ref_bf16_value(uint16_t b) {
  const int s = b >> 15, e = (b >> 7) & 0xff, m = b & 0x7f;
  double mag;
  if (e == 0xff) mag = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (e == 0) mag = std::ldexp(m / 128.0, -126);
  else mag = std::ldexp(1.0 + m / 128.0, e - 127);
  return s ? -mag : mag;
}

// Round-to-nearest-even to bf16 by comparing |x| with the exact midpoint of
// its two bf16 neighbours in double (overflow rounds as if to 2^128 = inf).
uint16_t ref_float_to_bf16(float x) {
  const uint32_t u = bits_of(x);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const double a = std::fabs(double(x));
  const uint16_t lo = uint16_t((u >> 16) & 0x7fffu);  // truncated magnitude
  const double lo_v = ref_bf16_value(lo);
  if (a == lo_v) return uint16_t(sign | lo);
  const double hi_v = lo + 1 == 0x7f80 ? std::ldexp(1.0, 128) : ref_bf16_value(uint16_t(lo + 1));
  const double mid = 0.5 * (lo_v + hi_v);
  uint16_t r;
  if (a < mid) r = lo;
  else if (a > mid) r = uint16_t(lo + 1);
  else r = (lo & 1) ? uint16_t(lo + 1) : lo;
  return uint16_t(sign | r);
}

// NVFP4 group reference: amax in double, the f32 steps docs/spec.md prescribes,
// then the independent nearest-even searches above. Returns the scale code;
// codes[i] is left 0xff for a NaN group (codes are unspecified there).
uint8_t ref_nvfp4_group(const float* x, float g, uint8_t codes[16]) {
  bool nan = false;
  double amax = 0.0;
  for (int i = 0; i < 16; ++i) {
    if (std::isnan(x[i])) nan = true;
    else amax = std::max(amax, std::fabs(double(x[i])));
  }
  if (nan) {
    for (int i = 0; i < 16; ++i) codes[i] = 0xff;
    return 0x7f;
  }
  const float t = float(amax) / (6.0f * g);
  const uint8_t s = ref_e4m3_encode(t);
  if (s == 0) {
    for (int i = 0; i < 16; ++i) codes[i] = 0;
    return s;
  }
  const float inv = 1.0f / (float(ref_e4m3_value(s)) * g);
  for (int i = 0; i < 16; ++i) codes[i] = ref_e2m1_encode(x[i] * inv);
  return s;
}

uint8_t nibble(const uint8_t* packed, int i) { return (packed[i / 2] >> ((i & 1) * 4)) & 0xf; }

// Checks codes and scale of one group against the reference; returns true
// when everything matched.
bool check_group(const float* x, float g, FailureBudget& fb, const char* what) {
  uint8_t packed[8];
  std::memset(packed, 0xcd, sizeof packed);
  const uint8_t s = codec::nvfp4_quantize_group(x, g, packed);
  uint8_t want[16];
  const uint8_t want_s = ref_nvfp4_group(x, g, want);
  bool ok = s == want_s;
  for (int i = 0; i < 16 && want_s != 0x7f; ++i) ok &= nibble(packed, i) == want[i];
  if (!ok && fb.report()) {
    std::string m = std::string(what) + ": g=" + desc(g) + "\n  scale got " + hex(s) + " want " + hex(want_s);
    for (int i = 0; i < 16; ++i) {
      m += "\n  [" + std::to_string(i) + "] " + desc(x[i]) + " code got " + hex(nibble(packed, i), 1);
      if (want_s != 0x7f) m += " want " + hex(want[i], 1);
    }
    ADD_FAILURE() << m;
  }
  return ok;
}

// ------------------------------------------------------------ sanity of refs

TEST(CodecReference, E4M3TableIsSortedAndSpansTheFormat) {
  const auto& t = e4m3_pos_table();
  for (int c = 1; c < 127; ++c) EXPECT_LT(t[c - 1], t[c]) << "code " << hex(c);
  EXPECT_EQ(t[0], 0.0);
  EXPECT_EQ(t[1], std::ldexp(1.0, -9));  // smallest subnormal
  EXPECT_EQ(t[7], 7 * std::ldexp(1.0, -9));  // largest subnormal
  EXPECT_EQ(t[8], std::ldexp(1.0, -6));  // smallest normal
  EXPECT_EQ(t[0x38], 1.0);
  EXPECT_EQ(t[126], 448.0);
}

// ------------------------------------------------------------------- E4M3

TEST(E4M3, DecodesAll256Codes) {
  EXPECT_EQ(codec::kE4M3Max, 448.0f);
  EXPECT_EQ(codec::kE4M3NaN, 0x7f);
  for (int c = 0; c < 256; ++c) {
    const float got = codec::e4m3_to_float(uint8_t(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(got)) << "code " << hex(c) << " must be NaN, got " << desc(got);
      continue;
    }
    // Independent formula, spelled out once more per field.
    const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    double want = e == 0 ? m / 8.0 * std::ldexp(1.0, -6) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
    if (s) want = -want;
    EXPECT_EQ(bits_of(got), bits_of(float(want)))
        << "code " << hex(c) << ": got " << desc(got) << " want " << desc(float(want));
    EXPECT_EQ(std::signbit(got), s == 1) << "code " << hex(c);
  }
}

TEST(E4M3, SpotValues) {
  EXPECT_EQ(codec::e4m3_to_float(0x00), 0.0f);
  EXPECT_EQ(bits_of(codec::e4m3_to_float(0x80)), 0x80000000u);  // -0
  EXPECT_EQ(codec::e4m3_to_float(0x01), 0.001953125f);           // 2^-9
  EXPECT_EQ(codec::e4m3_to_float(0x08), 0.015625f);              // 2^-6
  EXPECT_EQ(codec::e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(codec::e4m3_to_float(0x3c), 1.5f);
  EXPECT_EQ(codec::e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(codec::e4m3_to_float(0xfe), -448.0f);
  EXPECT_EQ(codec::e4m3_to_float(0x78), 256.0f);
  EXPECT_EQ(codec::e4m3_to_float(0xb8), -1.0f);
  EXPECT_EQ(codec::e4m3_rne_satfinite(1.0f), 0x38);
  EXPECT_EQ(codec::e4m3_rne_satfinite(-2.0f), 0xc0);
  EXPECT_EQ(codec::e4m3_rne_satfinite(448.0f), 0x7e);
}

TEST(E4M3, EveryFiniteCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    const float v = codec::e4m3_to_float(uint8_t(c));
    EXPECT_EQ(int(codec::e4m3_rne_satfinite(v)), c) << "code " << hex(c) << " " << desc(v);
  }
}

// For every pair of adjacent representable values: the exact midpoint goes to
// the even code, the floats just above and below it go to the upper and
// lower neighbour; both signs. Expectations come from the code indices only.
TEST(E4M3, EveryRoundingBoundaryAndTie) {
  for (int k = 0; k < 126; ++k) {
    const double lo = ref_e4m3_value(uint8_t(k)), hi = ref_e4m3_value(uint8_t(k + 1));
    const float mid = float(0.5 * (lo + hi));
    ASSERT_EQ(double(mid), 0.5 * (lo + hi)) << "midpoint not exact in f32, k=" << hex(k);
    const int even = (k % 2 == 0) ? k : k + 1;
    struct Case {
      float x;
      int code;
    } cases[] = {{mid, even}, {down(mid), k}, {up(mid), k + 1}, {float(lo), k}, {float(hi), k + 1}};
    for (const Case& cs : cases) {
      for (int neg = 0; neg < 2; ++neg) {
        const float x = neg ? -cs.x : cs.x;
        const int want = (neg ? 0x80 : 0x00) | cs.code;
        EXPECT_EQ(int(codec::e4m3_rne_satfinite(x)), want)
            << "between codes " << hex(k) << " and " << hex(k + 1) << ": " << desc(x) << " want " << hex(want);
      }
    }
  }
}

TEST(E4M3, SubnormalGridAndHalfStepTies) {
  const double step = std::ldexp(1.0, -9);  // subnormal spacing, below 2^-6
  // Exact multiples m * 2^-9, m = 0..8 (8 is 2^-6, the first normal: code 0x08).
  for (int m = 0; m <= 8; ++m) {
    const float x = float(m * step);
    EXPECT_EQ(int(codec::e4m3_rne_satfinite(x)), m) << desc(x);
    EXPECT_EQ(int(codec::e4m3_rne_satfinite(-x)), 0x80 | m) << desc(-x);
  }
  // Half-way points (m + 0.5) * 2^-9 tie to the even of m, m+1 (2^-10 -> 0).
  for (int m = 0; m < 8; ++m) {
    const float x = float((m + 0.5) * step);
    const int even = (m % 2 == 0) ? m : m + 1;
    EXPECT_EQ(int(codec::e4m3_rne_satfinite(x)), even) << desc(x);
    EXPECT_EQ(int(codec::e4m3_rne_satfinite(-x)), 0x80 | even) << desc(-x);
    EXPECT_EQ(int(codec::e4m3_rne_satfinite(down(x))), m) << desc(down(x));
    EXPECT_EQ(int(codec::e4m3_rne_satfinite(up(x))), m + 1) << desc(up(x));
    EXPECT_EQ(int(codec::e4m3_rne_satfinite(-down(x))), 0x80 | m) << desc(-down(x));
    EXPECT_EQ(int(codec::e4m3_rne_satfinite(-up(x))), 0x80 | (m + 1)) << desc(-up(x));
  }
  // Quarter points are never ties.
  for (int m = 0; m < 8; ++m) {
    EXPECT_EQ(int(codec::e4m3_rne_satfinite(float((m + 0.25) * step))), m);
    EXPECT_EQ(int(codec::e4m3_rne_satfinite(float((m + 0.75) * step))), m + 1);
  }
  // The 2^-10 tie specifically, and everything below it, is zero.
  EXPECT_EQ(codec::e4m3_rne_satfinite(0x1p-10f), 0x00);
  EXPECT_EQ(codec::e4m3_rne_satfinite(up(0x1p-10f)), 0x01);
  EXPECT_EQ(codec::e4m3_rne_satfinite(0x1p-11f), 0x00);
  EXPECT_EQ(codec::e4m3_rne_satfinite(kDenormMin), 0x00);
  EXPECT_EQ(codec::e4m3_rne_satfinite(FLT_MIN), 0x00);
  EXPECT_EQ(codec::e4m3_rne_satfinite(1e-30f), 0x00);
  // Just below the first normal rounds up into it (carry 0x07 -> 0x08).
  EXPECT_EQ(codec::e4m3_rne_satfinite(float(7.5 * step)), 0x08);
  EXPECT_EQ(codec::e4m3_rne_satfinite(down(0x1p-6f)), 0x08);
}

TEST(E4M3, SaturatesPast448) {
  const float big[] = {up(448.0f), 450.0f, 456.0f, down(464.0f), 464.0f /* tie with nonexistent 480 */,
                       up(464.0f), 479.0f, 480.0f, 500.0f, 512.0f, 1000.0f, 65536.0f, 1e30f, FLT_MAX, kInf};
  for (float x : big) {
    EXPECT_EQ(int(codec::e4m3_rne_satfinite(x)), 0x7e) << desc(x);
    EXPECT_EQ(int(codec::e4m3_rne_satfinite(-x)), 0xfe) << desc(-x);
  }
  // Below 448: the neighbours are 416 (0x7d) and 448 (0x7e); their midpoint
  // 432 ties to the even code 0x7e.
  EXPECT_EQ(codec::e4m3_rne_satfinite(down(448.0f)), 0x7e);
  EXPECT_EQ(codec::e4m3_rne_satfinite(432.0f), 0x7e);
  EXPECT_EQ(codec::e4m3_rne_satfinite(down(432.0f)), 0x7d);
}

TEST(E4M3, NaNAndSignedZero) {
  const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffffffffu, 0x7fa00000u};
  for (uint32_t n : nans) {
    EXPECT_EQ(int(codec::e4m3_rne_satfinite(float_of(n))), 0x7f) << "NaN bits " << hex(n, 8);
  }
  EXPECT_EQ(codec::e4m3_rne_satfinite(0.0f), 0x00);
  const float tiny_neg[] = {-0.0f, -kDenormMin, -FLT_MIN, -1e-30f, -0x1p-11f, -0x1p-10f /* tie -> -0 */, -down(0x1p-10f)};
  for (float x : tiny_neg) EXPECT_EQ(int(codec::e4m3_rne_satfinite(x)), 0x80) << desc(x);
  EXPECT_EQ(codec::e4m3_rne_satfinite(-up(0x1p-10f)), 0x81);
  EXPECT_TRUE(std::isnan(codec::e4m3_to_float(codec::e4m3_rne_satfinite(kNaN))));
}

// The decoded value of the code is a nearest representable value (ties to the
// even code), checked against the independent table search.
TEST(E4M3, BruteForceNearestEven) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed) + " (replay with METRALE_TEST_SEED)");
  std::mt19937_64 rng(seed);
  FailureBudget fb;
  auto check = [&](float x) {
    const uint8_t got = codec::e4m3_rne_satfinite(x);
    const uint8_t want = ref_e4m3_encode(x);
    if (got != want && fb.report())
      ADD_FAILURE() << desc(x) << ": got " << hex(got) << " (" << codec::e4m3_to_float(got) << ") want "
                    << hex(want) << " (" << ref_e4m3_value(want) << ")";
  };
  // Deterministic sweep over all floats with exponents 2^-13 .. 2^9 (past
  // 448) on a prime stride, so every mantissa position gets exercised.
  for (uint32_t u = 0x39000000u; u < 0x44800000u; u += 127) {
    check(float_of(u));
    check(float_of(u | 0x80000000u));
  }
  // Random bit patterns (all exponents, NaNs, infinities, f32 subnormals).
  for (int i = 0; i < 1000000; ++i) check(float_of(uint32_t(rng())));
  // Random values log-uniform over the E4M3 range, both signs.
  std::uniform_real_distribution<float> lg(-12.0f, 9.5f);
  for (int i = 0; i < 1000000; ++i) {
    const float x = std::exp2(lg(rng));
    check((rng() & 1) ? -x : x);
  }
  // Random floats near every midpoint (a few ulps either side).
  const auto& t = e4m3_pos_table();
  std::uniform_int_distribution<int> kd(0, 125), dd(-4, 4);
  for (int i = 0; i < 200000; ++i) {
    const int k = kd(rng);
    const float mid = float(0.5 * (t[k] + t[k + 1]));
    const float x = float_of(uint32_t(int64_t(bits_of(mid)) + dd(rng)));
    check((rng() & 1) ? -x : x);
  }
  EXPECT_EQ(fb.count, 0);
}

// ------------------------------------------------------------------- E2M1

TEST(E2M1, DecodesAll16Codes) {
  const float want[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  EXPECT_EQ(codec::kE2M1Max, 6.0f);
  for (int c = 0; c < 16; ++c) {
    const float got = codec::e2m1_to_float(uint8_t(c));
    EXPECT_EQ(bits_of(got), bits_of(want[c])) << "code " << hex(c, 1) << ": got " << desc(got);
    // The high nibble (the other element of a packed byte) must be ignored.
    EXPECT_EQ(bits_of(codec::e2m1_to_float(uint8_t(c | 0xa0))), bits_of(want[c])) << "code " << hex(c | 0xa0);
  }
}

TEST(E2M1, EveryCodeRoundTrips) {
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(int(codec::e2m1_rne_satfinite(codec::e2m1_to_float(uint8_t(c)))), c) << "code " << hex(c, 1);
  }
}

TEST(E2M1, EveryMidpointTiesToEvenMantissa) {
  // {midpoint, code it ties to, code below, code above}; written out by hand.
  struct Tie {
    float mid;
    int tie, below, above;
  } ties[] = {
      {0.25f, 0 /*0.0*/, 0, 1},  {0.75f, 2 /*1.0*/, 1, 2}, {1.25f, 2 /*1.0*/, 2, 3}, {1.75f, 4 /*2.0*/, 3, 4},
      {2.5f, 4 /*2.0*/, 4, 5},   {3.5f, 6 /*4.0*/, 5, 6},  {5.0f, 6 /*4.0*/, 6, 7},
  };
  for (const Tie& t : ties) {
    for (int neg = 0; neg < 2; ++neg) {
      const int s = neg ? 8 : 0;
      const float sg = neg ? -1.0f : 1.0f;
      EXPECT_EQ(int(codec::e2m1_rne_satfinite(sg * t.mid)), s | t.tie) << desc(sg * t.mid);
      EXPECT_EQ(int(codec::e2m1_rne_satfinite(sg * down(t.mid))), s | t.below) << desc(sg * down(t.mid));
      EXPECT_EQ(int(codec::e2m1_rne_satfinite(sg * up(t.mid))), s | t.above) << desc(sg * up(t.mid));
      // And the tie target decodes to the value the table names.
      EXPECT_EQ(std::fabs(codec::e2m1_to_float(codec::e2m1_rne_satfinite(sg * t.mid))), kE2M1Pos[t.tie]);
    }
  }
}

TEST(E2M1, SaturationSignedZeroAndNaN) {
  const float big[] = {up(6.0f), 6.5f, 7.0f, 8.0f, 100.0f, 1e30f, FLT_MAX, kInf};
  for (float x : big) {
    EXPECT_EQ(int(codec::e2m1_rne_satfinite(x)), 0x7) << desc(x);
    EXPECT_EQ(int(codec::e2m1_rne_satfinite(-x)), 0xf) << desc(-x);
  }
  EXPECT_EQ(codec::e2m1_rne_satfinite(0.0f), 0x0);
  const float tiny_neg[] = {-0.0f, -kDenormMin, -FLT_MIN, -1e-30f, -0.1f, -0.25f /* tie -> -0 */};
  for (float x : tiny_neg) EXPECT_EQ(int(codec::e2m1_rne_satfinite(x)), 0x8) << desc(x);
  const float tiny_pos[] = {kDenormMin, FLT_MIN, 1e-30f, 0.1f, 0.25f};
  for (float x : tiny_pos) EXPECT_EQ(int(codec::e2m1_rne_satfinite(x)), 0x0) << desc(x);
  const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffffffffu};
  for (uint32_t n : nans) EXPECT_EQ(int(codec::e2m1_rne_satfinite(float_of(n))), 0x0) << "NaN bits " << hex(n, 8);
  // Codes never use more than 4 bits.
  for (uint32_t u = 0; u < 0xffffffffu - 9973u; u += 9973u)
    ASSERT_EQ(codec::e2m1_rne_satfinite(float_of(u)) & 0xf0, 0) << desc(float_of(u));
}

TEST(E2M1, BruteForceNearestEven) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed) + " (replay with METRALE_TEST_SEED)");
  std::mt19937_64 rng(seed);
  FailureBudget fb;
  auto check = [&](float x) {
    const uint8_t got = codec::e2m1_rne_satfinite(x);
    const uint8_t want = ref_e2m1_encode(x);
    if (got != want && fb.report()) ADD_FAILURE() << desc(x) << ": got " << hex(got, 1) << " want " << hex(want, 1);
  };
  for (uint32_t u = 0x3c000000u; u < 0x41800000u; u += 127) {  // 2^-7 .. 16
    check(float_of(u));
    check(float_of(u | 0x80000000u));
  }
  std::uniform_real_distribution<float> ud(-8.0f, 8.0f);
  for (int i = 0; i < 500000; ++i) check(ud(rng));
  for (int i = 0; i < 200000; ++i) check(float_of(uint32_t(rng())));
  EXPECT_EQ(fb.count, 0);
}

// ------------------------------------------------------------------- BF16

TEST(BF16, DecodesAllCodes) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const float got = codec::bf16_to_float(bf16{uint16_t(b)});
    const double want = ref_bf16_value(uint16_t(b));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << "bf16 " << hex(b, 4);
    } else {
      ASSERT_EQ(bits_of(got), bits_of(float(want))) << "bf16 " << hex(b, 4) << " got " << desc(got);
      ASSERT_EQ(std::signbit(got), (b >> 15) == 1) << "bf16 " << hex(b, 4);
    }
  }
}

TEST(BF16, RoundTripOfEveryCode) {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const bf16 r = codec::float_to_bf16(codec::bf16_to_float(bf16{uint16_t(b)}));
    if ((b & 0x7fffu) > 0x7f80u) {
      ASSERT_TRUE(std::isnan(codec::bf16_to_float(r))) << "NaN bf16 " << hex(b, 4) << " -> " << hex(r.bits, 4);
      ASSERT_EQ(r.bits & 0x8000u, b & 0x8000u) << "NaN sign lost, bf16 " << hex(b, 4);
    } else {
      ASSERT_EQ(r.bits, b) << "bf16 " << hex(b, 4);
    }
  }
}

TEST(BF16, TiesToEvenAndNeighbours) {
  // For a spread of bf16 values (every exponent, several mantissas) the exact
  // midpoint to the next bf16 goes to the even mantissa; nextafter either
  // side goes to the nearer one.
  for (uint32_t lo = 0; lo < 0x7f7fu; lo += 3) {
    const double a = ref_bf16_value(uint16_t(lo)), b = ref_bf16_value(uint16_t(lo + 1));
    const float mid = float(0.5 * (a + b));
    ASSERT_EQ(double(mid), 0.5 * (a + b));
    const uint32_t even = (lo & 1) ? lo + 1 : lo;
    for (uint32_t s = 0; s <= 0x8000u; s += 0x8000u) {
      const float sg = s ? -1.0f : 1.0f;
      ASSERT_EQ(codec::float_to_bf16(sg * mid).bits, s | even) << desc(sg * mid);
      ASSERT_EQ(codec::float_to_bf16(sg * down(mid)).bits, s | lo) << desc(sg * down(mid));
      ASSERT_EQ(codec::float_to_bf16(sg * up(mid)).bits, s | (lo + 1)) << desc(sg * up(mid));
    }
  }
  // Hand-written cases: 1 + 2^-8 is the tie between 1 (0x3f80) and 1+2^-7
  // (0x3f81) -> 0x3f80; 1 + 3*2^-8 ties between 0x3f81 and 0x3f82 -> 0x3f82.
  EXPECT_EQ(codec::float_to_bf16(1.0f + 0x1p-8f).bits, 0x3f80u);
  EXPECT_EQ(codec::float_to_bf16(1.0f + 3 * 0x1p-8f).bits, 0x3f82u);
  EXPECT_EQ(codec::float_to_bf16(up(1.0f + 0x1p-8f)).bits, 0x3f81u);
  EXPECT_EQ(codec::float_to_bf16(-(1.0f + 0x1p-8f)).bits, 0xbf80u);
  // Overflow follows IEEE: FLT_MAX is past the last tie -> inf.
  EXPECT_EQ(codec::float_to_bf16(FLT_MAX).bits, 0x7f80u);
  EXPECT_EQ(codec::float_to_bf16(-FLT_MAX).bits, 0xff80u);
  EXPECT_EQ(codec::float_to_bf16(float_of(0x7f7f7fffu)).bits, 0x7f7fu);
  EXPECT_EQ(codec::float_to_bf16(kInf).bits, 0x7f80u);
  EXPECT_EQ(codec::float_to_bf16(-kInf).bits, 0xff80u);
  EXPECT_EQ(codec::float_to_bf16(-0.0f).bits, 0x8000u);
  EXPECT_EQ(codec::float_to_bf16(kDenormMin).bits, 0x0000u);
  EXPECT_EQ(codec::float_to_bf16(float_of(0x00008000u)).bits, 0x0000u);  // tie -> even 0
  EXPECT_EQ(codec::float_to_bf16(float_of(0x00018000u)).bits, 0x0002u);  // tie -> even 2
}

TEST(BF16, NaNStaysNaN) {
  // Including signalling NaNs whose payload lives only in the low 16 bits
  // (plain truncation would turn them into infinities) and the all-ones
  // payload (plain rounding would carry into the sign).
  const uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7f80ffffu,
                           0x7fffffffu, 0xffffffffu, 0x7fbfffffu, 0x7fa00000u};
  for (uint32_t n : nans) {
    const bf16 r = codec::float_to_bf16(float_of(n));
    EXPECT_TRUE(std::isnan(codec::bf16_to_float(r))) << "bits " << hex(n, 8) << " -> " << hex(r.bits, 4);
    EXPECT_EQ(r.bits & 0x8000u, (n >> 16) & 0x8000u) << "bits " << hex(n, 8) << " -> " << hex(r.bits, 4);
  }
}

TEST(BF16, BruteForceAgainstReference) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed) + " (replay with METRALE_TEST_SEED)");
  std::mt19937_64 rng(seed);
  FailureBudget fb;
  auto check = [&](uint32_t u) {
    const float x = float_of(u);
    const uint16_t got = codec::float_to_bf16(x).bits;
    if (std::isnan(x)) {
      if (!std::isnan(codec::bf16_to_float(bf16{got})) && fb.report()) ADD_FAILURE() << desc(x) << " -> " << hex(got, 4);
      return;
    }
    const uint16_t want = ref_float_to_bf16(x);
    if (got != want && fb.report()) ADD_FAILURE() << desc(x) << ": got " << hex(got, 4) << " want " << hex(want, 4);
  };
  for (uint64_t u = 0; u <= 0xffffffffu; u += 1021) check(uint32_t(u));  // all exponents, prime stride
  for (int i = 0; i < 500000; ++i) check(uint32_t(rng()));
  for (int i = 0; i < 200000; ++i) check((uint32_t(rng()) & 0xffff0000u) | 0x8000u);  // exact ties
  EXPECT_EQ(fb.count, 0);
}

// ------------------------------------------------------------------ NVFP4

TEST(NVFP4, AllZeroGroup) {
  EXPECT_EQ(codec::kNvfp4GroupSize, 16);
  for (float g : {1.0f, 0.37f, 1e-3f, 250.0f}) {
    for (float z : {0.0f, -0.0f}) {
      float x[16];
      for (float& v : x) v = z;
      uint8_t packed[8];
      std::memset(packed, 0xcd, sizeof packed);
      EXPECT_EQ(int(codec::nvfp4_quantize_group(x, g, packed)), 0) << "g=" << g << " zero " << desc(z);
      for (int i = 0; i < 8; ++i) EXPECT_EQ(int(packed[i]), 0) << "byte " << i << " g=" << g << " zero " << desc(z);
    }
  }
  // Mixed +0 / -0.
  float x[16];
  for (int i = 0; i < 16; ++i) x[i] = (i % 3) ? 0.0f : -0.0f;
  uint8_t packed[8];
  EXPECT_EQ(codec::nvfp4_quantize_group(x, 1.0f, packed), 0);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(int(packed[i]), 0);
}

TEST(NVFP4, ScaleRoundsToZeroGivesAllZeroCodes) {
  // amax / 6 <= 2^-10 (the E4M3 tie to zero) -> scale 0 -> every code 0,
  // negative elements included (no -0 codes).
  for (float amax : {6.0f * 0x1p-10f, 6.0f * 0x1p-11f, 1e-20f}) {
    float x[16];
    for (int i = 0; i < 16; ++i) x[i] = amax * ((i % 2) ? -1.0f : 1.0f) * float(16 - i) / 16.0f;
    uint8_t packed[8];
    std::memset(packed, 0xcd, sizeof packed);
    EXPECT_EQ(int(codec::nvfp4_quantize_group(x, 1.0f, packed)), 0) << desc(amax);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(int(packed[i]), 0) << "byte " << i << " amax " << desc(amax);
  }
  // Just above the tie the scale is the smallest subnormal 2^-9 (code 0x01).
  float x[16] = {};
  x[5] = -up(6.0f * 0x1p-10f);
  uint8_t packed[8];
  EXPECT_EQ(int(codec::nvfp4_quantize_group(x, 1.0f, packed)), 0x01);
  EXPECT_EQ(int(nibble(packed, 5)), 0xd);  // -(3*2^-9 + ulp) / 2^-9 -> -3 (code 0xd)
}

TEST(NVFP4, PackingOrderAndExactGrid) {
  // amax 6 -> scale exactly 1.0 (0x38); element i carries E2M1 code i.
  float x[16];
  for (int i = 0; i < 16; ++i) x[i] = codec::e2m1_to_float(uint8_t(i));
  uint8_t packed[8];
  EXPECT_EQ(int(codec::nvfp4_quantize_group(x, 1.0f, packed)), 0x38);
  const uint8_t want[8] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(int(packed[i]), int(want[i])) << "byte " << i << " got " << hex(packed[i]);

  // Reversed order -> nibbles swap.
  for (int i = 0; i < 16; ++i) x[i] = codec::e2m1_to_float(uint8_t(15 - i));
  EXPECT_EQ(int(codec::nvfp4_quantize_group(x, 1.0f, packed)), 0x38);
  const uint8_t want_rev[8] = {0xef, 0xcd, 0xab, 0x89, 0x67, 0x45, 0x23, 0x01};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(int(packed[i]), int(want_rev[i])) << "byte " << i << " got " << hex(packed[i]);

  // A single non-zero element at each position lands in exactly its nibble.
  for (int p = 0; p < 16; ++p) {
    float y[16] = {};
    y[p] = -6.0f;
    EXPECT_EQ(int(codec::nvfp4_quantize_group(y, 1.0f, packed)), 0x38);
    for (int i = 0; i < 16; ++i) EXPECT_EQ(int(nibble(packed, i)), i == p ? 0xf : 0x0) << "p=" << p << " i=" << i;
    EXPECT_EQ(int(packed[p / 2]), (p & 1) ? 0xf0 : 0x0f) << "p=" << p;
  }
}

TEST(NVFP4, ScaleIsE4M3OfAmaxOverSix) {
  struct Case {
    float amax;
    int scale;
  } cases[] = {
      {6.0f, 0x38},            // 1.0
      {12.0f, 0x40},           // 2.0
      {9.0f, 0x3c},            // 1.5
      {6.0f * 1.0625f, 0x38},  // t = 1.0625: tie between 1.0 (0x38) and 1.125 (0x39) -> even 0x38
      {6.0f * 1.1875f, 0x3a},  // t = 1.1875: tie between 1.125 (0x39) and 1.25 (0x3a) -> 0x3a
      {6.0f * 448.0f, 0x7e},   // exactly the max scale
      {6.0f * 464.0f, 0x7e},   // tie to nonexistent 480 -> saturate
      {1e6f, 0x7e},            // far past -> saturate
      {FLT_MAX, 0x7e},
      {6.0f * 0x1p-9f, 0x01},  // smallest subnormal scale
      {6.0f * 0x1p-6f, 0x08},  // smallest normal scale
  };
  for (const Case& cs : cases) {
    for (int pos : {0, 7, 15}) {
      float x[16];
      for (int i = 0; i < 16; ++i) x[i] = cs.amax * 0.125f * float(i % 5) * ((i % 2) ? -1.0f : 1.0f);
      x[pos] = (pos % 2) ? -cs.amax : cs.amax;  // amax carried by a negative element at odd positions
      uint8_t packed[8];
      EXPECT_EQ(int(codec::nvfp4_quantize_group(x, 1.0f, packed)), cs.scale) << "amax " << desc(cs.amax) << " pos " << pos;
      FailureBudget fb;
      check_group(x, 1.0f, fb, "scale case");
    }
  }
}

TEST(NVFP4, SaturatedScaleSaturatesElements) {
  // amax / 6 > 448: scale saturates to 448 and the largest elements to +-6.
  float x[16];
  for (int i = 0; i < 16; ++i) x[i] = float(i) * 400.0f * ((i % 2) ? -1.0f : 1.0f);  // amax 6000
  uint8_t packed[8];
  EXPECT_EQ(int(codec::nvfp4_quantize_group(x, 1.0f, packed)), 0x7e);
  EXPECT_EQ(int(nibble(packed, 15)), 0xf);  // -6000/448 = -13.4 -> -6
  EXPECT_EQ(int(nibble(packed, 14)), 0x7);  //  5600/448 = 12.5  -> 6
  EXPECT_EQ(int(nibble(packed, 7)), 0xf);   // -2800/448 = -6.25 -> -6
  EXPECT_EQ(int(nibble(packed, 6)), 0x7);   //  2400/448 = 5.36  -> 6 (past the midpoint 5)
  EXPECT_EQ(int(nibble(packed, 5)), 0xe);   // -2000/448 = -4.46 -> -4
  FailureBudget fb;
  EXPECT_TRUE(check_group(x, 1.0f, fb, "saturated"));
}

TEST(NVFP4, NaNInGroupMakesScaleNaN) {
  for (float g : {1.0f, 0.01f, 3.0f}) {
    for (int pos = 0; pos < 16; ++pos) {
      for (uint32_t nb : {0x7fc00000u, 0xffc00000u, 0x7f800001u}) {
        float x[16];
        for (int i = 0; i < 16; ++i) x[i] = float(i) - 7.5f;
        x[pos] = float_of(nb);
        uint8_t packed[8];
        const uint8_t s = codec::nvfp4_quantize_group(x, g, packed);
        EXPECT_EQ(int(s & 0x7f), 0x7f) << "NaN " << hex(nb, 8) << " at " << pos << " g=" << g << " scale " << hex(s);
        // No finite number is invented: every element dequantizes to NaN.
        for (int i = 0; i < 16; ++i) {
          EXPECT_TRUE(std::isnan(codec::e2m1_to_float(nibble(packed, i)) * codec::e4m3_to_float(s) * g))
              << "element " << i;
        }
      }
    }
  }
  // NaN together with inf (NaN wins) and NaN in an otherwise zero group.
  float x[16] = {};
  x[3] = kInf;
  x[9] = kNaN;
  uint8_t packed[8];
  EXPECT_EQ(int(codec::nvfp4_quantize_group(x, 1.0f, packed) & 0x7f), 0x7f);
  float z[16] = {};
  z[15] = -kNaN;
  EXPECT_EQ(int(codec::nvfp4_quantize_group(z, 1.0f, packed) & 0x7f), 0x7f);
}

TEST(NVFP4, InfInGroupSaturates) {
  for (float g : {1.0f, 0.02f, 7.0f}) {
    for (int pos : {0, 1, 8, 15}) {
      for (float inf : {kInf, -kInf}) {
        float x[16];
        for (int i = 0; i < 16; ++i) x[i] = (float(i) - 7.0f) * 10.0f;  // up to 80
        x[pos] = inf;
        uint8_t packed[8];
        const uint8_t s = codec::nvfp4_quantize_group(x, g, packed);
        EXPECT_EQ(int(s), 0x7e) << "g=" << g << " pos " << pos << " inf " << inf;
        EXPECT_EQ(int(nibble(packed, pos)), inf > 0 ? 0x7 : 0xf) << "g=" << g << " pos " << pos;
        FailureBudget fb;
        EXPECT_TRUE(check_group(x, g, fb, "inf"));
      }
    }
  }
  // Both infinities in one group.
  float x[16] = {};
  x[2] = kInf;
  x[3] = -kInf;
  x[4] = 1.0f;
  uint8_t packed[8];
  EXPECT_EQ(int(codec::nvfp4_quantize_group(x, 1.0f, packed)), 0x7e);
  EXPECT_EQ(int(packed[1]), 0xf7);
  EXPECT_EQ(int(nibble(packed, 4)), 0x0);  // 1/448 -> 0
}

TEST(NVFP4, SignedZeroElements) {
  float x[16] = {};
  x[0] = 6.0f;     // scale 1.0
  x[1] = -0.0f;    // -0 -> 0x8
  x[2] = -0.2f;    // tiny negative -> 0x8
  x[3] = -0.25f;   // tie -> -0 -> 0x8
  x[4] = 0.25f;    // tie -> +0
  x[5] = -0.26f;   // -0.5 -> 0x9
  uint8_t packed[8];
  EXPECT_EQ(int(codec::nvfp4_quantize_group(x, 1.0f, packed)), 0x38);
  EXPECT_EQ(int(packed[0]), 0x87);
  EXPECT_EQ(int(packed[1]), 0x88);
  EXPECT_EQ(int(packed[2]), 0x90);
}

TEST(NVFP4, GlobalScale) {
  // g = 1.5, scale 4 (0x48): x = e2m1_i * 4 * 1.5 = e2m1_i * 6; amax = 36,
  // amax / (6 * g) = 4 exactly.
  {
    float x[16];
    for (int i = 0; i < 16; ++i) x[i] = codec::e2m1_to_float(uint8_t(i)) * 6.0f;
    uint8_t packed[8];
    EXPECT_EQ(int(codec::nvfp4_quantize_group(x, 1.5f, packed)), 0x48);
    for (int i = 0; i < 16; ++i) EXPECT_EQ(int(nibble(packed, i)), i) << "i=" << i;
    // Same data with g = 1: scale 6 (0x4c) and a coarser grid.
    EXPECT_EQ(int(codec::nvfp4_quantize_group(x, 1.0f, packed)), 0x4c);
  }
  // Power-of-two g = 2^-8: x = e2m1 * g, so the scale is exactly 1.0.
  {
    const float g = 0x1p-8f;
    float x[16];
    for (int i = 0; i < 16; ++i) x[i] = codec::e2m1_to_float(uint8_t(15 - i)) * g;
    uint8_t packed[8];
    EXPECT_EQ(int(codec::nvfp4_quantize_group(x, g, packed)), 0x38);
    for (int i = 0; i < 16; ++i) EXPECT_EQ(int(nibble(packed, i)), 15 - i) << "i=" << i;
    // Without g these tiny values get the subnormal scale 2^-8 = 2 * 2^-9.
    EXPECT_EQ(int(codec::nvfp4_quantize_group(x, 1.0f, packed)), 0x02);
  }
  // Calibrated g = absmax / (448 * 6): the tensor's absmax maps to scale 448.
  {
    const float absmax = 1234.5f;
    const float g = absmax / (448.0f * 6.0f);
    float x[16];
    for (int i = 0; i < 16; ++i) x[i] = absmax * float(i + 1) / 16.0f * ((i % 3) ? 1.0f : -1.0f);
    uint8_t packed[8];
    const uint8_t s = codec::nvfp4_quantize_group(x, g, packed);
    EXPECT_EQ(int(s), 0x7e);
    EXPECT_EQ(int(nibble(packed, 15)), 0xf);  // -absmax -> -6
    EXPECT_EQ(int(nibble(packed, 14)), 0x7);  // 15/16 absmax -> 5.63 -> 6
    FailureBudget fb;
    EXPECT_TRUE(check_group(x, g, fb, "calibrated g"));
  }
  // g that would make amax/(6g) overflow the E4M3 range -> saturated scale,
  // elements saturate to +-6.
  {
    float x[16];
    for (int i = 0; i < 16; ++i) x[i] = float(i) + 1.0f;
    uint8_t packed[8];
    EXPECT_EQ(int(codec::nvfp4_quantize_group(x, 1e-4f, packed)), 0x7e);
    EXPECT_EQ(int(nibble(packed, 15)), 0x7);
    FailureBudget fb;
    EXPECT_TRUE(check_group(x, 1e-4f, fb, "tiny g"));
  }
}

// Scales right at every E4M3 rounding boundary, with global scales whose
// 6 * g product rounds in f32: the scale must follow docs/spec.md's f32 formula
// e4m3(amax / (6 * g)) exactly (not, say, amax / 6 / g).
TEST(NVFP4, ScaleAtEveryE4M3BoundaryWithGlobalScale) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed) + " (replay with METRALE_TEST_SEED)");
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  const auto& t = e4m3_pos_table();
  FailureBudget fb;
  std::vector<float> gs = {1.0f, 0.5f, 3.0f, 1.0f + 0x1p-23f, 0.1f, 1.0f / 3.0f, 0.0123f, 77.7f};
  for (int i = 0; i < 24; ++i) gs.push_back(std::exp2(u01(rng) * 12.0f - 8.0f));
  for (float g : gs) {
    for (int k = 0; k < 126; ++k) {
      const double mid = 0.5 * (t[k] + t[k + 1]);
      const float a0 = float(mid * 6.0 * double(g));
      for (int d = -3; d <= 3; ++d) {
        const float amax = float_of(uint32_t(int64_t(bits_of(a0)) + d));
        float x[16];
        for (int i = 0; i < 16; ++i) x[i] = amax * float(i) / 16.0f * ((i % 2) ? -1.0f : 1.0f);
        x[(k + d + 16) % 16] = (d & 1) ? -amax : amax;
        uint8_t packed[8];
        const uint8_t s = codec::nvfp4_quantize_group(x, g, packed);
        const uint8_t want = ref_e4m3_encode(amax / (6.0f * g));
        if (s != want && fb.report())
          ADD_FAILURE() << "amax " << desc(amax) << " g " << desc(g) << ": scale " << hex(s) << " want " << hex(want);
        check_group(x, g, fb, "boundary scale");
      }
    }
  }
  EXPECT_EQ(fb.count, 0);
}

// Thousands of random groups with realistic magnitudes and outlier channels:
// codes and scale equal the independent reference; dequantized values are
// within the E2M1 grid bound of the input.
TEST(NVFP4, RandomGroupsMatchReferenceAndErrorBound) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed) + " (replay with METRALE_TEST_SEED)");
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  std::uniform_int_distribution<int> pos16(0, 15);
  FailureBudget fb, fb_bound;
  int normal_scale_groups = 0, ideal_mismatches = 0;

  for (int iter = 0; iter < 20000; ++iter) {
    // Per-"tensor" magnitude: log-uniform 2^-10 .. 2^10, and a global scale
    // that is 1, calibrated, or arbitrary.
    const float mag = std::exp2(u01(rng) * 20.0f - 10.0f);
    float x[16];
    for (float& v : x) v = normal(rng) * mag;
    const int kind = iter % 4;
    if (kind >= 2) {  // outlier channels: one or two elements 20..200x larger
      const int n = 1 + int(rng() % 2);
      for (int j = 0; j < n; ++j) x[pos16(rng)] *= 20.0f + 180.0f * u01(rng);
    }
    if (iter % 50 == 0) x[pos16(rng)] = -0.0f;
    if (iter % 97 == 0) x[pos16(rng)] = 0.0f;
    // Round inputs through bf16 as the cache writer does (also makes exact
    // ties more likely).
    if (iter % 2) for (float& v : x) v = codec::bf16_to_float(codec::float_to_bf16(v));
    float g;
    switch (iter % 3) {
      case 0: g = 1.0f; break;
      case 1: g = (mag * 4.0f) / (448.0f * 6.0f); break;  // calibrated for ~4 sigma
      default: g = std::exp2(u01(rng) * 16.0f - 8.0f) * mag / 100.0f; break;
    }

    check_group(x, g, fb, "random group");

    uint8_t packed[8];
    const uint8_t s = codec::nvfp4_quantize_group(x, g, packed);
    double amax = 0.0;
    for (float v : x) amax = std::max(amax, std::fabs(double(v)));
    if (s == 0) continue;  // all codes 0, covered by check_group
    const double S = double(codec::e4m3_to_float(s)) * double(g);
    const double t = amax / (6.0 * double(g));
    // |s - t| <= t / 16 holds only where t itself is in the normal range
    // (below 2^-6 the absolute step 2^-9 is coarser).
    const bool normal_unsat = t >= std::ldexp(1.0, -6) && t <= 448.0;
    normal_scale_groups += normal_unsat;
    for (int i = 0; i < 16; ++i) {
      const uint8_t c = nibble(packed, i);
      const double deq = double(codec::e2m1_to_float(c)) * S;
      const double xi = double(x[i]);
      const double err = std::fabs(deq - xi);
      const double v = std::fabs(xi) / S;  // ideal scaled magnitude
      // Per element: within half the local grid spacing, plus the part
      // beyond 6 that saturates; slack for the f32 x * inv rounding.
      const double halfgap = v < 2.0 ? 0.25 : (v < 4.0 ? 0.5 : 1.0);
      const double bound = halfgap * S + std::max(0.0, std::fabs(xi) - 6.0 * S) + 1e-6 * amax;
      // Relative to amax (normal, unsaturated scale): |s - t| <= t / 16, so
      // S <= amax/6 * 17/16 and the error is at most 17/96 of amax (grid
      // spacing 2 at the top -> half 1), saturation at most amax / 16.
      const double rel_bound = 17.0 / 96.0 + 1e-6;
      bool ok = err <= bound && (!normal_unsat || err <= rel_bound * amax);
      // Sign is kept (signed zero included), except when the scale is 0.
      ok &= std::signbit(codec::e2m1_to_float(c)) == std::signbit(x[i]);
      if (!ok && fb_bound.report())
        ADD_FAILURE() << "element " << i << " " << desc(x[i]) << " g=" << desc(g) << " scale " << hex(s)
                      << " code " << hex(c, 1) << " deq " << deq << " err " << err << " bound " << bound
                      << " rel " << err / amax;
      // With a normal scale code (saturated or not) the amax element always
      // lands on +-6: amax / S >= 6 / (1 + 1/16) > 5 for normal t, and the
      // code 0x08 reached from t >= 7.5 * 2^-9 still gives >= 5.625.
      if (s >= 0x08 && std::fabs(xi) == amax && (c & 7) != 7 && fb_bound.report())
        ADD_FAILURE() << "amax element " << i << " " << desc(x[i]) << " code " << hex(c, 1) << " scale " << hex(s);
    }
    // Versus an all-double ideal (x / (s*g) without the f32 inv rounding):
    // codes may differ only next to a midpoint, and only by one step.
    for (int i = 0; i < 16; ++i) {
      const double vi = double(x[i]) / S;
      const int ideal = ref_nearest_even(kE2M1Pos, std::fabs(vi));
      const int got = nibble(packed, i) & 7;
      if (ideal == got) continue;
      ++ideal_mismatches;
      const int lo = std::min(ideal, got);
      const double mid = 0.5 * (kE2M1Pos[lo] + kE2M1Pos[lo + 1]);
      if ((std::abs(ideal - got) != 1 || std::fabs(std::fabs(vi) - mid) > 1e-6 * mid) && fb_bound.report())
        ADD_FAILURE() << "element " << i << " " << desc(x[i]) << " code " << hex(got, 1) << " vs ideal " << hex(ideal, 1)
                      << " (scaled " << vi << ") far from a midpoint";
    }
  }
  EXPECT_EQ(fb.count, 0);
  EXPECT_EQ(fb_bound.count, 0);
  EXPECT_GT(normal_scale_groups, 10000) << "generator drifted: too few groups with a normal scale";
  RecordProperty("ideal_mismatches", ideal_mismatches);
}

// ------------------------------------------- fast cache-write quantizers
// src/kernels/cache/quantize_fast.cuh, host branches: these must equal the
// codec (the definition the CPU reference calls) bit for bit. The device
// branches differ only in single instructions with exact host models
// (IMAD.HI, VIMNMX, PRMT, SHF.R.W, FMUL.SAT) and in the hardware E4M3
// conversions, whose host branch is the codec itself.

namespace fq = metrale::cuda::fastq;

// Every non-negative f32 y up to +inf (2^31 values): the E2M1 magnitude from
// z = min(y / 8, 1) by e2m1_sat8_bits plus the per-word saturation, and the
// older e2m1_magnitude_bits (the extreme-global-scale kernel), against the
// codec.
TEST(FastQuantize, E2M1MagnitudeOfEveryNonNegativeF32) {
  uint64_t bad_sat8 = 0, bad_magic = 0;
  for (uint64_t u = 0; u <= 0x7f800000u; ++u) {
    const float y = float_of(uint32_t(u));
    const uint32_t want = codec::e2m1_rne_satfinite(y) & 7u;
    const uint32_t nib = fq::e2m1_sat8_bits(fq::mul_abs_sat(y, 0.125f)) & 0xfu;
    if (fq::e2m1x8_saturate(nib) != want || nib > 8u) {
      if (++bad_sat8 <= 10) ADD_FAILURE() << "sat8 " << desc(y) << ": nibble " << nib << " want " << want;
    }
    if ((fq::e2m1_magnitude_bits(y) & 0xfu) != want) {
      if (++bad_magic <= 10) ADD_FAILURE() << "magic " << desc(y) << " want " << want;
    }
  }
  EXPECT_EQ(bad_sat8, 0u);
  EXPECT_EQ(bad_magic, 0u);
}

TEST(FastQuantize, SaturateAndSignsOfPackedWords) {
  // Every nibble value 0..8 in every position, with the other nibbles varied.
  for (int pos = 0; pos < 8; ++pos)
    for (uint32_t n = 0; n <= 8; ++n)
      for (uint32_t other = 0; other <= 8; ++other) {
        uint32_t acc = 0, want = 0;
        for (int k = 0; k < 8; ++k) {
          const uint32_t v = k == pos ? n : (other + uint32_t(k)) % 9u;
          acc |= v << (4 * k);
          want |= (v == 8u ? 7u : v) << (4 * k);
        }
        ASSERT_EQ(fq::e2m1x8_saturate(acc), want) << std::hex << acc;
      }
  // Sign bits land on bit 4i+3 of element i.
  for (int i = 0; i < 8; ++i) {
    uint32_t w[4] = {0x7fff7fffu, 0x7fff7fffu, 0x7fff7fffu, 0x7fff7fffu};
    w[i / 2] |= (i & 1) ? 0x80000000u : 0x00008000u;
    ASSERT_EQ(fq::e2m1x8_signs(w), 1u << (4 * i + 3)) << i;
  }
}

TEST(FastQuantize, UnitRouteAcceptsOrdinaryGlobalScalesOnly) {
  for (float g : {1.0f, 30.0f / 2688.0f, 5.0f / 2688.0f, 1e-6f, 1e-20f, 1e20f, 1e30f, 3e-29f})
    EXPECT_TRUE(fq::nvfp4_unit_route_ok(g)) << g;
  for (float g : {kDenormMin, 1e-42f, 1e-38f, 3e38f, std::numeric_limits<float>::max(), 1e37f})
    EXPECT_FALSE(fq::nvfp4_unit_route_ok(g)) << g;
}

// Per element, for global scales at and around the edges of the unit route
// and random ones inside it: for every nonzero finite scale code s (so every
// inv the route can meet) and every bf16 x, the route's code
// (mul_abs_sat(x, inv * 0.125), e2m1_sat8_bits, saturation, x's sign) equals
// codec::e2m1_rne_satfinite(x * inv), NaN x excepted (its group has the NaN
// scale and is zeroed).
TEST(FastQuantize, UnitRouteElementCodesForEveryBf16AndScale) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed) + " (replay with METRALE_TEST_SEED)");
  std::mt19937_64 rng(seed);
  std::vector<float> gs = {1.0f, 30.0f / 2688.0f, 5.0f / 2688.0f, 1.0f / 6.0f, 3.0f, 0.1f};
  // Walk to the smallest and largest g the route accepts, and take both.
  for (float edge : {1e-30f, 1e30f}) {
    float g = edge;
    const float dir = edge < 1.0f ? 0.5f : 2.0f;
    while (fq::nvfp4_unit_route_ok(g * dir)) g *= dir;
    for (int i = 0; i < 64 && fq::nvfp4_unit_route_ok(edge < 1.0f ? down(g) : up(g)); ++i)
      g = edge < 1.0f ? down(g) : up(g);
    ASSERT_TRUE(fq::nvfp4_unit_route_ok(g));
    gs.push_back(g);
  }
  std::uniform_real_distribution<float> ue(-90.0f, 90.0f);
  for (int i = 0; i < 24; ++i) {
    const float g = std::exp2(ue(rng)) * float(1.0 + (rng() % 1000) / 1000.0);
    if (fq::nvfp4_unit_route_ok(g)) gs.push_back(g);
  }
  uint64_t bad = 0;
  for (const float g : gs) {
    for (uint32_t s = 1; s < codec::kE4M3NaN; ++s) {
      const float inv = 1.0f / (codec::e4m3_to_float(uint8_t(s)) * g);
      const float inv8 = inv * 0.125f;
      for (uint32_t b = 0; b < 0x10000u; ++b) {
        if ((b & 0x7fffu) > 0x7f80u) continue;  // NaN
        const float x = float_of(b << 16);
        const uint32_t got = fq::e2m1x8_saturate(fq::e2m1_sat8_bits(fq::mul_abs_sat(x, inv8)) & 0xfu) | ((b >> 12) & 8u);
        const uint32_t want = codec::e2m1_rne_satfinite(x * inv);
        if (got != want && ++bad <= 10)
          ADD_FAILURE() << "g " << desc(g) << " s " << hex(uint8_t(s), 2) << " x " << desc(x) << ": got " << got
                        << " want " << want;
      }
    }
  }
  EXPECT_EQ(bad, 0u);
}

// Whole groups: fq::nvfp4_quantize_2groups_unit (and the older
// nvfp4_quantize_groups<2>) against two codec::nvfp4_quantize_group calls, on
// random groups with NaN, infinities, signed zeros, subnormals and wide
// magnitude spreads.
TEST(FastQuantize, GroupsMatchCodec) {
  const uint64_t seed = test_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed) + " (replay with METRALE_TEST_SEED)");
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> ue(-40.0f, 40.0f);
  int bad = 0, unit_groups = 0;
  for (int iter = 0; iter < 200000; ++iter) {
    float g = iter % 3 == 0 ? 1.0f : std::exp2(ue(rng) * (iter % 7 == 0 ? 3.0f : 0.3f));
    const bool unit = fq::nvfp4_unit_route_ok(g);
    const float center = std::exp2(ue(rng) * 0.5f);
    uint32_t w[16];
    float x[32];
    for (int i = 0; i < 32; ++i) {
      uint16_t bits;
      const uint64_t r = rng();
      switch (r % 41) {
        case 0: bits = 0x7fc0; break;                                  // NaN
        case 1: bits = 0x7f80; break;                                  // +inf
        case 2: bits = 0xff80; break;                                  // -inf
        case 3: bits = 0x8000; break;                                  // -0
        case 4: bits = uint16_t(0x0001 + (r >> 8) % 0x7f); break;      // subnormal
        case 5: bits = uint16_t(r >> 16); break;                       // any pattern
        default: {
          const float v = center * std::exp2(float(int((r >> 8) % 24)) - 16.0f) *
                          float(int((r >> 16) % 2001) - 1000) / 1000.0f;
          bits = codec::float_to_bf16(v).bits;
        }
      }
      if (iter % 5 != 0 && (bits & 0x7fff) >= 0x7f80) bits = uint16_t(bits & 0x8000);  // mostly finite groups
      x[i] = float_of(uint32_t(bits) << 16);
      if (i & 1) w[i / 2] |= uint32_t(bits) << 16;
      else w[i / 2] = bits;
    }
    uint8_t want_packed[16], want_s[2];
    want_s[0] = codec::nvfp4_quantize_group(x, g, want_packed);
    want_s[1] = codec::nvfp4_quantize_group(x + 16, g, want_packed + 8);
    uint32_t packed[4];
    uint8_t s[2];
    auto compare = [&](const char* name) {
      const bool ok = std::memcmp(packed, want_packed, 16) == 0 && s[0] == want_s[0] && s[1] == want_s[1];
      if (!ok && ++bad <= 10) {
        std::string xs;
        for (int i = 0; i < 32; ++i) xs += desc(x[i]) + " ";
        ADD_FAILURE() << name << " g " << desc(g) << " scales " << int(s[0]) << "," << int(s[1]) << " want "
                      << int(want_s[0]) << "," << int(want_s[1]) << " x: " << xs;
      }
    };
    fq::nvfp4_quantize_groups<2>(w, g, packed, s);
    compare("nvfp4_quantize_groups<2>");
    if (unit) {
      ++unit_groups;
      fq::nvfp4_quantize_2groups_unit(w, 6.0f * g, g, packed, s);
      compare("nvfp4_quantize_2groups_unit");
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(unit_groups, 100000);
}

}  // namespace
