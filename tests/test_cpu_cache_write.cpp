// CPU reshape_and_cache (bf16 / fp8 / nvfp4), bf16_absmax and the FP8 /
// NVFP4 calibration flow. Caches are compared byte for byte with an
// independent per-element recomputation from the codecs, so written codes,
// scales and every byte that must stay untouched (unwritten slots, page
// padding, the nvfp4 data/scale gap) are checked at once.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "metrale/cpu.hpp"
#include "metrale/error.hpp"
#include "metrale/format.hpp"
#include "support/problem.hpp"
#include "testing/reference.hpp"

namespace metrale::test {
namespace {

constexpr KvFormat kFormats[] = {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4};

std::vector<uint8_t> garbage(size_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> g(n);
  for (uint8_t& b : g) b = uint8_t(rng());
  return g;
}

// The expected cache after writing `rows` (key or value) into `before`, one
// element at a time straight from docs/spec.md 2-3.
std::vector<uint8_t> expected_cache(const HostProblem& p, const std::vector<bf16>& rows, bool is_k,
                                    const std::vector<uint8_t>& before) {
  std::vector<uint8_t> c = before;
  const KvCacheLayout& l = p.layout;
  const int64_t H = l.num_kv_heads, D = l.head_dim, B = l.block_size;
  for (int64_t j = 0; j < p.num_tokens(); ++j) {
    const int64_t slot = p.slot_mapping[j];
    if (slot < 0 || slot >= l.capacity_slots()) continue;
    uint8_t* page = c.data() + (slot / B) * l.page_stride_bytes;
    const int64_t t = slot % B;
    for (int64_t h = 0; h < H; ++h) {
      const bf16* x = &rows[j * p.kv_row_stride + h * D];
      const int64_t row = t * H + h;
      if (l.format == KvFormat::bf16) {
        for (int64_t d = 0; d < D; ++d) {
          page[(row * D + d) * 2] = uint8_t(x[d].bits & 0xff);
          page[(row * D + d) * 2 + 1] = uint8_t(x[d].bits >> 8);
        }
      } else if (l.format == KvFormat::fp8_e4m3) {
        const float inv = 1.0f / (is_k ? p.scales.k_scale : p.scales.v_scale);
        for (int64_t d = 0; d < D; ++d) page[row * D + d] = codec::e4m3_rne_satfinite(codec::bf16_to_float(x[d]) * inv);
      } else {
        const float g = is_k ? p.scales.k_global_scale : p.scales.v_global_scale;
        for (int64_t grp = 0; grp < D / 16; ++grp) {
          float f[16];
          for (int i = 0; i < 16; ++i) f[i] = codec::bf16_to_float(x[grp * 16 + i]);
          uint8_t packed[8];
          page[l.data_section_bytes + row * (D / 16) + grp] = l.nvfp4_scales == Nvfp4ScaleRule::adaptive
                                                                   ? codec::nvfp4_quantize_group_adaptive(f, g, packed)
                                                                   : codec::nvfp4_quantize_group(f, g, packed);
          for (int i = 0; i < 8; ++i) page[row * D / 2 + grp * 8 + i] = packed[i];
        }
      }
    }
  }
  return c;
}

// Describes the first differing byte: page, offset in page and which section.
std::string first_difference(const HostProblem& p, const std::vector<uint8_t>& got, const std::vector<uint8_t>& want) {
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) {
      const int64_t off = int64_t(i) % p.layout.page_stride_bytes;
      const char* where = off < p.layout.data_section_bytes ? "data" : "scales/padding";
      return "byte " + std::to_string(i) + " (page " + std::to_string(int64_t(i) / p.layout.page_stride_bytes) +
             ", offset " + std::to_string(off) + ", " + where + "): got " + std::to_string(got[i]) + ", want " +
             std::to_string(want[i]);
    }
  return "identical";
}

// Rewrites the problem's caches with fresh garbage, runs the CPU write and
// compares with the expected bytes.
void check_write(HostProblem& p, std::mt19937_64& rng, int64_t expect_skipped = 0) {
  p.k_cache = garbage(p.k_cache.size(), rng);
  p.v_cache = garbage(p.v_cache.size(), rng);
  const std::vector<uint8_t> want_k = expected_cache(p, p.key, true, p.k_cache);
  const std::vector<uint8_t> want_v = expected_cache(p, p.value, false, p.v_cache);
  CacheWriteArgs w = p.write_args();
  int32_t skipped = 5;
  w.skipped = &skipped;
  EXPECT_EQ(cpu::reshape_and_cache(w), expect_skipped);
  EXPECT_EQ(skipped, 5 + expect_skipped);
  EXPECT_TRUE(p.k_cache == want_k) << "K cache: " << first_difference(p, p.k_cache, want_k);
  EXPECT_TRUE(p.v_cache == want_v) << "V cache: " << first_difference(p, p.v_cache, want_v);
}

DecodeCase write_case(KvFormat f, std::mt19937_64& rng) {
  DecodeCase c;
  c.format = f;
  c.head_dim = std::vector<int32_t>{64, 128, 256}[rng() % 3];
  c.block_size = std::vector<int32_t>{16, 32}[rng() % 2];
  c.num_kv_heads = 1 + int32_t(rng() % 3);
  c.seq_lens = interesting_lengths(c.block_size, 150, 6, rng());
  c.kv_row_pad = 8 * int64_t(rng() % 4);  // strided key/value rows (padding holds NaN)
  c.page_pad_bytes = 16 * int64_t(rng() % 4);
  c.extra_blocks = 4;                     // pages nobody writes: must stay garbage
  if (f == KvFormat::nvfp4) {
    c.k_global_scale = 0.0f;  // calibrated
    c.v_global_scale = 0.73f;
  }
  return c;
}

TEST(CpuCacheWrite, EveryFormatMatchesCodecRecomputation) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (KvFormat f : kFormats)
    for (int rep = 0; rep < 3; ++rep) {
      const DecodeCase c = write_case(f, rng);
      SCOPED_TRACE(c.describe());
      HostProblem p = make_problem(c, rng());
      check_write(p, rng);
    }
}

// The adaptive NVFP4 scale rule (layout.nvfp4_scales): the same write,
// every group by codec::nvfp4_quantize_group_adaptive; with g = 1 and with
// g calibrated by the adaptive rule; special values included.
TEST(CpuCacheWrite, AdaptiveNvfp4MatchesCodecRecomputation) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  int64_t differs_from_max6 = 0;
  for (int rep = 0; rep < 6; ++rep) {
    DecodeCase c = write_case(KvFormat::nvfp4, rng);
    if (rep % 2) c.k_global_scale = c.v_global_scale = 1.0f;
    SCOPED_TRACE(c.describe());
    HostProblem p = make_problem(c, rng());
    if (rep == 5) {  // special values in K: NaN, +-inf, huge, tiny negative, -0
      const bf16 specials[] = {bf16{0x7fc0}, bf16{0x7f80}, bf16{0xff80}, codec::float_to_bf16(1e30f),
                               codec::float_to_bf16(-1e-30f), bf16{0x8000}};
      for (size_t i = 0; i < p.key.size(); i += 97) p.key[i] = specials[(i / 97) % 6];
    }
    p.layout = p.layout.with_nvfp4_scales(Nvfp4ScaleRule::adaptive);
    if (c.k_global_scale <= 0.0f) p.scales = kv_scales_from_absmax(KvFormat::nvfp4, 3.0f, 2.0f);
    check_write(p, rng);
    p.layout.nvfp4_scales = Nvfp4ScaleRule::max6;
    const std::vector<uint8_t> max6_again = expected_cache(p, p.key, true, p.k_cache);
    for (size_t i = 0; i < max6_again.size(); ++i) differs_from_max6 += max6_again[i] != p.k_cache[i];
  }
  EXPECT_GT(differs_from_max6, 0) << "the adaptive rule changed no byte";
}

TEST(CpuCacheWrite, Bf16IsAnExactCopy) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  DecodeCase c = write_case(KvFormat::bf16, rng);
  c.kv_row_pad = 24;
  HostProblem p = make_problem(c, rng());
  const KvCacheLayout& l = p.layout;
  const int64_t HD = int64_t(l.num_kv_heads) * l.head_dim;
  for (int64_t j = 0; j < p.num_tokens(); ++j) {
    const int64_t slot = p.slot_mapping[j];
    if (slot < 0) continue;
    const uint8_t* page = p.k_cache.data() + (slot / l.block_size) * l.page_stride_bytes;
    const uint8_t* vpage = p.v_cache.data() + (slot / l.block_size) * l.page_stride_bytes;
    ASSERT_EQ(0, std::memcmp(page + (slot % l.block_size) * HD * 2, &p.key[j * p.kv_row_stride], HD * 2)) << j;
    ASSERT_EQ(0, std::memcmp(vpage + (slot % l.block_size) * HD * 2, &p.value[j * p.kv_row_stride], HD * 2)) << j;
  }
}

TEST(CpuCacheWrite, SpecialValues) {
  // NaN -> E4M3 NaN code / NaN NVFP4 group scale; +-inf and huge values
  // saturate; tiny negatives keep their sign.
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (KvFormat f : {KvFormat::fp8_e4m3, KvFormat::nvfp4}) {
    DecodeCase c;
    c.format = f;
    c.head_dim = 64;
    c.num_kv_heads = 1;
    c.seq_lens = {16};
    HostProblem p = make_problem(c, rng());
    const bf16 specials[] = {bf16{0x7fc0}, bf16{0x7f80}, bf16{0xff80}, codec::float_to_bf16(1e30f),
                             codec::float_to_bf16(-1e-30f)};
    int64_t j0 = 0;
    while (p.slot_mapping[j0] < 0) ++j0;
    for (int i = 0; i < 5; ++i) p.key[j0 * p.kv_row_stride + 16 * (i % 4) + i] = specials[i];
    check_write(p, rng);
    const int64_t slot = p.slot_mapping[j0];
    const uint8_t* page = p.k_cache.data() + (slot / 16) * p.layout.page_stride_bytes;
    if (f == KvFormat::fp8_e4m3) {
      const uint8_t* row = page + (slot % 16) * 64;
      EXPECT_EQ(row[0], codec::kE4M3NaN);
      EXPECT_EQ(row[16 + 1], 0x7e);  // +inf -> 448
      EXPECT_EQ(row[32 + 2], 0xfe);  // -inf -> -448
      EXPECT_EQ(row[48 + 3], 0x7e);  // 1e30 -> 448
      EXPECT_EQ(row[0 + 4], 0x80);   // -1e-30 -> -0
    } else {
      const uint8_t* sc = page + p.layout.data_section_bytes + (slot % 16) * 4;
      EXPECT_EQ(sc[0] & 0x7f, 0x7f) << "NaN group scale";
      EXPECT_EQ(sc[1], 0x7e) << "inf saturates the group scale to 448";
    }
  }
}

TEST(CpuCacheWrite, OutOfCapacitySlotsAreSkippedAndCounted) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (KvFormat f : kFormats) {
    DecodeCase c = write_case(f, rng);
    SCOPED_TRACE(c.describe());
    HostProblem p = make_problem(c, rng());
    const int64_t cap = p.layout.capacity_slots();
    // Replace a few valid slots by out-of-capacity ones and add negative ones.
    int64_t bad = 0;
    for (int64_t j = 0; j < p.num_tokens(); j += 5)
      if (p.slot_mapping[j] >= 0) {
        p.slot_mapping[j] = (bad % 2 == 0) ? cap : cap + 1000 + bad;
        ++bad;
      }
    for (int64_t j = 1; j < p.num_tokens(); j += 7)
      if (p.slot_mapping[j] >= 0 && p.slot_mapping[j] < cap) p.slot_mapping[j] = -3 - j;
    ASSERT_GT(bad, 0);
    check_write(p, rng, bad);
    // Without a counter the return value still reports them.
    CacheWriteArgs w = p.write_args();
    w.skipped = nullptr;
    EXPECT_EQ(cpu::reshape_and_cache(w), bad);
  }
}

TEST(CpuCacheWrite, NegativeSlotsLeaveTheCacheUntouched) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (KvFormat f : kFormats) {
    HostProblem p = make_problem(write_case(f, rng), rng());
    for (int64_t& s : p.slot_mapping) s = -1 - int64_t(rng() % 100);
    const std::vector<uint8_t> k = p.k_cache, v = p.v_cache;
    EXPECT_EQ(cpu::reshape_and_cache(p.write_args()), 0);
    EXPECT_TRUE(p.k_cache == k);
    EXPECT_TRUE(p.v_cache == v);
  }
}

TEST(CpuCacheWrite, PagePaddingAndSectionGapUntouched) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (KvFormat f : kFormats) {
    DecodeCase c = write_case(f, rng);
    c.page_pad_bytes = 48;  // nvfp4 also gets a 16-byte gap between the data and scale sections
    c.extra_blocks = 0;
    SCOPED_TRACE(c.describe());
    HostProblem p = make_problem(c, rng());
    p.k_cache = garbage(p.k_cache.size(), rng);
    const std::vector<uint8_t> before = p.k_cache;
    cpu::reshape_and_cache(p.write_args());
    const KvCacheLayout& l = p.layout;
    const int64_t rows = int64_t(l.block_size) * l.num_kv_heads;
    const int64_t data = f == KvFormat::bf16 ? rows * l.head_dim * 2 : f == KvFormat::fp8_e4m3 ? rows * l.head_dim
                                                                                               : rows * l.head_dim / 2;
    const int64_t scales = f == KvFormat::nvfp4 ? rows * l.head_dim / 16 : 0;
    int64_t checked = 0;
    for (int64_t pg = 0; pg < l.num_blocks; ++pg)
      for (int64_t off = 0; off < l.page_stride_bytes; ++off) {
        const bool gap = off >= data && off < l.data_section_bytes;
        const bool pad = off >= l.data_section_bytes + scales;
        if (!gap && !pad) continue;
        ++checked;
        const size_t i = size_t(pg * l.page_stride_bytes + off);
        ASSERT_EQ(p.k_cache[i], before[i]) << "page " << pg << " offset " << off << (gap ? " (gap)" : " (padding)");
      }
    EXPECT_GE(checked, l.num_blocks * 48);
  }
}

TEST(CpuCacheWrite, EmptyBatchWritesNothing) {
  HostProblem p = make_problem(DecodeCase{KvFormat::nvfp4, 64, 16, 1, 1, {5}}, 3);
  CacheWriteArgs w = p.write_args();
  w.num_tokens = 0;
  w.key = nullptr;
  w.value = nullptr;
  w.slot_mapping = nullptr;
  const std::vector<uint8_t> k = p.k_cache;
  EXPECT_EQ(cpu::reshape_and_cache(w), 0);
  EXPECT_TRUE(p.k_cache == k);
}

// ---- head-strided inputs ----

// p's K or V rows re-laid with token stride ts and head stride hs in a buffer
// of `elems` elements whose other elements are NaN (they must not be read).
std::vector<bf16> relaid(const HostProblem& p, const std::vector<bf16>& rows, int64_t ts, int64_t hs, int64_t elems,
                         int64_t base) {
  std::vector<bf16> out(size_t(elems), bf16{0x7fc0});
  const int64_t H = p.layout.num_kv_heads, D = p.layout.head_dim;
  for (int64_t j = 0; j < p.num_tokens(); ++j)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < D; ++d) out[size_t(base + j * ts + h * hs + d)] = rows[size_t(j * p.kv_row_stride + h * D + d)];
  return out;
}

TEST(CpuCacheWrite, HeadStridedInputsWriteLikePackedRows) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (KvFormat f : kFormats)
    for (int layout_kind = 0; layout_kind < 3; ++layout_kind) {
      DecodeCase c = write_case(f, rng);
      c.num_kv_heads = 1 + int32_t(rng() % 4);
      SCOPED_TRACE(c.describe());
      HostProblem p = make_problem(c, rng());
      const int64_t T = p.num_tokens(), H = c.num_kv_heads, D = c.head_dim;
      // 0: transformers' (T, H, S, D) cache tensor sliced at position s0, key[:, :, s0];
      // 1: one sequence's tokens of it, key[0] read as (S = T, H, D), heads padded apart;
      // 2: token-major with heads padded apart (a head stride > D).
      int64_t ts = 0, hs = 0, base = 0, elems = 0;
      if (layout_kind == 0) {
        const int64_t S = 1 + int64_t(rng() % 4), s0 = int64_t(rng() % uint64_t(S));
        ts = H * S * D, hs = S * D, base = s0 * D, elems = T * H * S * D;
      } else if (layout_kind == 1) {
        ts = D, hs = T * D + 8 * int64_t(rng() % 3), elems = H * hs;
      } else {
        hs = D + 8 * int64_t(1 + rng() % 3), ts = H * hs + 8 * int64_t(rng() % 2), elems = T * ts;
      }
      SCOPED_TRACE("token stride " + std::to_string(ts) + ", head stride " + std::to_string(hs));
      const std::vector<bf16> key = relaid(p, p.key, ts, hs, elems + 8, base);
      const std::vector<bf16> value = relaid(p, p.value, ts, hs, elems + 8, base);
      p.k_cache = garbage(p.k_cache.size(), rng);
      p.v_cache = garbage(p.v_cache.size(), rng);
      const std::vector<uint8_t> want_k = expected_cache(p, p.key, true, p.k_cache);
      const std::vector<uint8_t> want_v = expected_cache(p, p.value, false, p.v_cache);
      // The packed rows' saturation counts: the strided write must count the same.
      std::vector<uint8_t> k_copy = p.k_cache, v_copy = p.v_cache;
      CacheWriteArgs packed = p.write_args();
      packed.cache.k = k_copy.data();
      packed.cache.v = v_copy.data();
      int64_t packed_sat[2] = {0, 0};
      packed.saturated = packed_sat;
      cpu::reshape_and_cache(packed);

      CacheWriteArgs w = p.write_args();
      w.key = key.data() + base;
      w.value = value.data() + base;
      w.key_stride = w.value_stride = ts;
      w.key_head_stride = w.value_head_stride = hs;
      int64_t sat[2] = {0, 0};
      w.saturated = sat;
      EXPECT_EQ(cpu::reshape_and_cache(w), 0);
      EXPECT_TRUE(p.k_cache == want_k) << "K cache: " << first_difference(p, p.k_cache, want_k);
      EXPECT_TRUE(p.v_cache == want_v) << "V cache: " << first_difference(p, p.v_cache, want_v);
      EXPECT_EQ(sat[0], packed_sat[0]);
      EXPECT_EQ(sat[1], packed_sat[1]);
    }
}

TEST(CpuCacheWrite, OverlappingOrMisalignedStridesAreRejected) {
  DecodeCase c;
  c.format = KvFormat::fp8_e4m3;
  c.head_dim = 64;
  c.num_kv_heads = 4;
  c.seq_lens = {9};
  HostProblem p = make_problem(c, 11);
  const std::vector<uint8_t> k_before = p.k_cache;
  const int64_t T = p.num_tokens(), H = 4, D = 64;
  auto expect_rejected = [&](int64_t ts, int64_t hs, const char* arg) {
    CacheWriteArgs w = p.write_args();
    w.key_stride = ts;
    w.key_head_stride = hs;
    try {
      cpu::reshape_and_cache(w);
      ADD_FAILURE() << "token stride " << ts << ", head stride " << hs << " accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("'") + arg + "'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::to_string(arg[4] == 'h' ? hs : ts)), std::string::npos) << e.what();
    }
  };
  expect_rejected(H * D, D + 4, "key_head_stride");       // not a multiple of 8
  expect_rejected(H * D, -64, "key_head_stride");         // negative
  expect_rejected((H - 1) * 72 + D - 8, 72, "key_stride"); // the last head runs into the next token
  expect_rejected(D, (T - 1) * D, "key_stride");          // head-major, heads overlap
  expect_rejected(0, T * D, "key_stride");                // every token the same row
  expect_rejected(H * D - 8, 0, "key_stride");            // packed heads: the plain row rule
  EXPECT_TRUE(p.k_cache == k_before);
  // Accepted: both nestings at their tightest.
  CacheWriteArgs w = p.write_args();
  w.key_stride = (H - 1) * 72 + D;
  w.key_head_stride = 72;
  std::vector<bf16> big(size_t(T * H * 80 + T * D * H + 64));
  w.key = big.data();
  EXPECT_NO_THROW(cpu::reshape_and_cache(w));
  w.key_stride = D;
  w.key_head_stride = T * D;
  EXPECT_NO_THROW(cpu::reshape_and_cache(w));
}

// ---- saturation counts ----

// Independent count of the saturated elements of p's written tokens: |x| in
// E4M3 units (FP8 x / scale as the quantizer's x * (1/scale); NVFP4 x / (6 g))
// past 464 (where rounding to 448 ends), infinities included, NaN never.
std::pair<int64_t, int64_t> naive_saturated(const HostProblem& p) {
  const KvCacheLayout& l = p.layout;
  int64_t n[2] = {0, 0};
  if (l.format == KvFormat::bf16) return {0, 0};
  for (int64_t j = 0; j < p.num_tokens(); ++j) {
    if (p.slot_mapping[j] < 0 || p.slot_mapping[j] >= l.capacity_slots()) continue;
    for (int kv = 0; kv < 2; ++kv) {
      const std::vector<bf16>& rows = kv ? p.value : p.key;
      const float t = l.format == KvFormat::fp8_e4m3 ? 1.0f / (kv ? p.scales.v_scale : p.scales.k_scale)
                                                     : 6.0f * (kv ? p.scales.v_global_scale : p.scales.k_global_scale);
      for (int64_t i = 0; i < int64_t(l.num_kv_heads) * l.head_dim; ++i) {
        const float x = codec::bf16_to_float(rows[size_t(j * p.kv_row_stride + i)]);
        const float q = l.format == KvFormat::fp8_e4m3 ? x * t : x / t;
        n[kv] += !std::isnan(q) && std::fabs(q) > 464.0f;
      }
    }
  }
  return {n[0], n[1]};
}

TEST(CpuCacheWrite, SaturatedElementsAreCountedPerWrite) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (KvFormat f : kFormats)
    for (int rep = 0; rep < 3; ++rep) {
      DecodeCase c = write_case(f, rng);
      SCOPED_TRACE(c.describe());
      HostProblem p = make_problem(c, rng());
      // Scales calibrated on a smaller range than the data (a prompt's absmax
      // exceeded at decode time): some values saturate.
      const float shrink = std::vector<float>{1.0f, 0.8f, 0.3f}[size_t(rep)];
      p.scales.k_scale *= shrink;
      p.scales.v_scale *= shrink * 0.9f;
      p.scales.k_global_scale *= shrink;
      p.scales.v_global_scale *= shrink * 0.9f;
      // A few out-of-capacity tokens: not written, not counted.
      for (int64_t j = 0; j < p.num_tokens(); j += 9)
        if (p.slot_mapping[j] >= 0) p.slot_mapping[j] = p.layout.capacity_slots() + j;
      const auto [want_k, want_v] = naive_saturated(p);
      if (f != KvFormat::bf16 && rep == 2) EXPECT_GT(want_k + want_v, 0) << "the test should saturate";
      CacheWriteArgs w = p.write_args();
      int64_t sat[2] = {7, 11};  // accumulates
      w.saturated = sat;
      cpu::reshape_and_cache(w);
      EXPECT_EQ(sat[0], 7 + want_k);
      EXPECT_EQ(sat[1], 11 + want_v);
      // The codes are those of the same write without a counter.
      const std::vector<uint8_t> k = p.k_cache, v = p.v_cache;
      w.saturated = nullptr;
      cpu::reshape_and_cache(w);
      EXPECT_TRUE(p.k_cache == k && p.v_cache == v);
    }
}

TEST(CpuCacheWrite, SaturationBoundary) {
  // One token, one head of 64: values at and past the calibrated range.
  for (KvFormat f : {KvFormat::fp8_e4m3, KvFormat::nvfp4}) {
    SCOPED_TRACE(to_string(f));
    HostProblem p = make_problem(DecodeCase{f, 64, 16, 1, 1, {1}}, 5);
    p.scales = KvScales{};  // all 1: the bound is 464 (fp8) or 6 * 464 = 2784 (nvfp4)
    const float lim = f == KvFormat::fp8_e4m3 ? 464.0f : 2784.0f;
    const float step = f == KvFormat::fp8_e4m3 ? 2.0f : 16.0f;  // the bf16 spacing there
    const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
    // Per 16-element group: {values}, and how many saturate.
    const std::vector<std::pair<std::vector<float>, int>> groups = {
        {{lim, -lim, 1.0f, lim * (448.0f / 464.0f)}, 0},  // at the bound (rounds to 448): not saturated
        {{lim + step, 3.0f, -(lim + step)}, 2},           // just past it
        {{inf, -inf, nan, lim * 4}, 3},              // infinities count, NaN never
        {{nan, lim * 2, 0.5f}, 1},                   // beside a NaN (an NVFP4 group scale NaN)
    };
    std::vector<bf16> row(64, codec::float_to_bf16(0.25f));
    int want = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      for (size_t i = 0; i < groups[g].first.size(); ++i) row[g * 16 + i * 3] = codec::float_to_bf16(groups[g].first[i]);
      want += groups[g].second;
    }
    p.key = row;
    p.value = row;
    p.kv_row_stride = 64;
    p.slot_mapping = {3};
    int64_t sat[2] = {0, 0};
    CacheWriteArgs w = p.write_args();
    w.saturated = sat;
    cpu::reshape_and_cache(w);
    EXPECT_EQ(sat[0], want);
    EXPECT_EQ(sat[1], want);
    const auto [nk, nv] = naive_saturated(p);
    EXPECT_EQ(nk, want);
    EXPECT_EQ(nv, want);
  }
}

TEST(CpuCacheWrite, Bf16NeverSaturates) {
  HostProblem p = make_problem(DecodeCase{KvFormat::bf16, 64, 16, 2, 1, {20}}, 9);
  for (bf16& x : p.key) x = codec::float_to_bf16(1e30f);
  int64_t sat[2] = {0, 0};
  CacheWriteArgs w = p.write_args();
  w.saturated = sat;
  cpu::reshape_and_cache(w);
  EXPECT_EQ(sat[0], 0);
  EXPECT_EQ(sat[1], 0);
}

TEST(CpuCacheWrite, MisalignedSaturatedCounterIsRejected) {
  HostProblem p = make_problem(DecodeCase{KvFormat::fp8_e4m3, 64, 16, 2, 1, {4}}, 9);
  alignas(8) int64_t sat[3] = {0, 0, 0};
  CacheWriteArgs w = p.write_args();
  w.saturated = reinterpret_cast<int64_t*>(reinterpret_cast<char*>(sat) + 4);
  EXPECT_THROW(cpu::reshape_and_cache(w), InvalidArgument);
}

// ---- bf16_absmax and calibration ----

TEST(CpuAbsmax, StridedRowsIgnoreNaNAndFold) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t rows : {int64_t(1), int64_t(7), int64_t(3000)}) {
    const int64_t len = 200, stride = 264;
    std::vector<bf16> x(size_t(rows * stride));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < stride; ++i)  // past row_len: outside the rows, must be ignored
        x[r * stride + i] = i < len ? codec::float_to_bf16(normal(rng)) : codec::float_to_bf16(1e6f);
    x[size_t(rows / 2) * stride + 3] = bf16{0x7fc0};  // NaNs are ignored
    x[size_t(rows - 1) * stride + 5] = bf16{0xffc1};
    float want = 0.0f;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < len; ++i) {
        const float v = std::fabs(codec::bf16_to_float(x[r * stride + i]));
        if (!std::isnan(v)) want = std::max(want, v);
      }
    float absmax = 0.0f;
    cpu::bf16_absmax(x.data(), rows, len, stride, &absmax);
    EXPECT_EQ(absmax, want) << rows << " rows";
    // Folding: a larger running value stays, a smaller one is replaced.
    float big = 1e5f;
    cpu::bf16_absmax(x.data(), rows, len, stride, &big);
    EXPECT_EQ(big, 1e5f);
    float small = want / 2;
    cpu::bf16_absmax(x.data(), rows, len, stride, &small);
    EXPECT_EQ(small, want);
    // No rows: unchanged.
    float keep = 1.5f;
    cpu::bf16_absmax(x.data(), 0, len, stride, &keep);
    EXPECT_EQ(keep, 1.5f);
  }
}

TEST(CpuAbsmax, CalibrationFlowOverTwoBatches) {
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const int64_t H = 4, D = 128, stride = 3 * H * D;  // K rows of a fused QKV projection
  float k_absmax = 0.0f, want = 0.0f;
  for (int batch = 0; batch < 2; ++batch) {
    const int64_t tokens = 50 + batch * 30;
    std::vector<bf16> qkv(size_t(tokens * stride));
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = 0; i < stride; ++i) {
        const bf16 v = codec::float_to_bf16(normal(rng) * (batch + 1));
        qkv[t * stride + i] = v;
        if (i >= H * D && i < 2 * H * D) want = std::max(want, std::fabs(codec::bf16_to_float(v)));
      }
    cpu::bf16_absmax(qkv.data() + H * D, tokens, H * D, stride, &k_absmax);
  }
  EXPECT_EQ(k_absmax, want);
  EXPECT_EQ(fp8_scale_from_absmax(k_absmax), k_absmax / 448.0f);
  EXPECT_EQ(nvfp4_global_scale_from_absmax(k_absmax), k_absmax / 2688.0f);
  EXPECT_EQ(fp8_scale_from_absmax(0.0f), 1.0f);
  EXPECT_EQ(nvfp4_global_scale_from_absmax(0.0f), 1.0f);
  // Tiny absmaxes: FP8's scale floors at the smallest normal f32 (1 / scale
  // finite), NVFP4's g at the smallest positive one.
  for (float a : {1e-36f, 1e-38f, 1e-41f, std::numeric_limits<float>::denorm_min()}) {
    EXPECT_EQ(fp8_scale_from_absmax(a), std::max(a / 448.0f, 0x1p-126f)) << a;
    EXPECT_EQ(nvfp4_global_scale_from_absmax(a), std::max(a / 2688.0f, 0x1p-149f)) << a;
  }
}

// K/V whose absmax is far below 448 * 2^-126 (bf16 keeps such values; f32
// scales of absmax / 448 would be subnormal, and 1 / scale inf): calibrated
// and written, they decode to finite values within the format's error.
TEST(CpuAbsmax, TinyValuesCalibrateToFiniteCodes) {
  const int64_t T = 16, H = 1, D = 64;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (KvFormat f : {KvFormat::fp8_e4m3, KvFormat::nvfp4})
    for (float mag : {1e-37f, 1e-39f}) {
      std::vector<bf16> k(T * H * D), v(T * H * D);
      float k_absmax = 0.0f, v_absmax = 0.0f;
      for (size_t i = 0; i < k.size(); ++i) {
        k[i] = codec::float_to_bf16(normal(rng) * mag);
        v[i] = codec::float_to_bf16(normal(rng) * mag);
      }
      cpu::bf16_absmax(k.data(), T, H * D, H * D, &k_absmax);
      cpu::bf16_absmax(v.data(), T, H * D, H * D, &v_absmax);
      const KvCacheLayout L = KvCacheLayout::make(f, 1, 16, H, D);
      std::vector<uint8_t> kc(L.cache_bytes()), vc(L.cache_bytes());
      CacheWriteArgs w;
      w.key = k.data();
      w.value = v.data();
      w.key_stride = w.value_stride = H * D;
      std::vector<int64_t> slots(T);
      for (int64_t t = 0; t < T; ++t) slots[t] = t;
      w.slot_mapping = slots.data();
      w.num_tokens = T;
      w.cache = KvCacheView{L, kc.data(), vc.data(), kv_scales_from_absmax(f, k_absmax, v_absmax)};
      cpu::reshape_and_cache(w);
      const KvFormatDesc& d = kv_format_desc(f);
      AttnArgs a;  // the reference's dequantisation reads the cache through one sequence's table
      const int32_t table = 0, len = int32_t(T);
      a.cache = w.cache;
      a.num_seqs = 1;
      a.block_tables = &table;
      a.max_blocks_per_seq = 1;
      a.seq_lens = &len;
      const test::KvRows rows = test::cache_rows(a);
      std::vector<double> kr(D), vr(D);
      for (int32_t t = 0; t < len; ++t) {
        rows(0, t, 0, kr.data(), vr.data());
        for (int64_t i = 0; i < D; ++i) {
          ASSERT_TRUE(std::isfinite(kr[i]) && std::isfinite(vr[i])) << d.name << " " << mag << " token " << t;
          // FP8 keeps 3 mantissa bits down to 2^-9 of its scale; NVFP4's g is then an f32
          // subnormal of few bits (finite codes, coarse values: only no blow-up is asked).
          const double tol = f == KvFormat::fp8_e4m3 ? 0.07 : 1.0;
          EXPECT_LE(std::fabs(kr[i] - codec::bf16_to_float(k[t * D + i])), tol * k_absmax) << d.name << " " << mag;
          EXPECT_LE(std::fabs(vr[i] - codec::bf16_to_float(v[t * D + i])), tol * v_absmax) << d.name << " " << mag;
        }
      }
    }
}

TEST(CpuAbsmax, CalibratedFp8ScaleMapsAbsmaxTo448) {
  // Written with its own calibrated scale, the largest value maps to code +-448.
  const uint64_t seed = random_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  DecodeCase c;
  c.format = KvFormat::fp8_e4m3;
  c.seq_lens = {40, 17};
  HostProblem p = make_problem(c, seed);
  float absmax = 0.0f;
  cpu::bf16_absmax(p.key.data(), p.num_tokens(), c.num_kv_heads * c.head_dim, p.kv_row_stride, &absmax);
  // Padding tokens (slot < 0) are rows too; make_problem calibrates on written rows only.
  EXPECT_GE(absmax, p.scales.k_scale * 448.0f * 0.999f);
  int max_codes = 0;
  for (int64_t j = 0; j < p.num_tokens(); ++j) {
    const int64_t slot = p.slot_mapping[j];
    if (slot < 0) continue;
    const uint8_t* row = p.k_cache.data() + (slot / 16) * p.layout.page_stride_bytes + (slot % 16) * 256;
    for (int i = 0; i < 256; ++i) max_codes += (row[i] & 0x7f) == 0x7e;
  }
  EXPECT_GE(max_codes, 1);
}

}  // namespace
}  // namespace metrale::test
