// GPU cache writes against the CPU reference (docs/spec.md 1-3, 6):
// cuda::reshape_and_cache must leave the device K and V caches byte-identical
// to what cpu::reshape_and_cache leaves in host caches that started with the
// same random garbage (codes, scales, skipped slots and page padding alike),
// never touch memory outside the caches, and count the same skipped tokens
// and saturated elements; inputs are fused QKV rows, separate rows, or
// head-strided views (transformers' head-major cache tensors).
// cuda::bf16_absmax must give exactly cpu::bf16_absmax.
//
// Randomized tests draw their seed from std::random_device; it is printed via
// SCOPED_TRACE on any failure, and METRALE_TEST_SEED=<n> replays it.
// Every GPU test starts with METRALE_SKIP_WITHOUT_GPU(), so it is reported
// SKIPPED on a machine without an sm_90 GPU; the argument-validation tests
// need no GPU (validation precedes any CUDA runtime call).

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <metrale/cache.hpp>
#include <metrale/codec.hpp>
#include <metrale/cpu.hpp>
#include <metrale/cuda.hpp>
#include <metrale/error.hpp>
#include <metrale/format.hpp>
#include <metrale/ops.hpp>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "support/device_problem.hpp"

// Readable test parameters in CTest's names ("fp8" rather than a byte dump).
namespace metrale {
void PrintTo(KvFormat f, std::ostream* os) { *os << to_string(f); }
}  // namespace metrale

namespace {

using metrale::bf16;
using metrale::CacheWriteArgs;
using metrale::KvCacheLayout;
using metrale::KvFormat;
using metrale::test::DeviceBuffer;
namespace codec = metrale::codec;
namespace cpu = metrale::cpu;
namespace mcuda = metrale::cuda;

// ----------------------------------------------------------------- helpers

uint64_t test_seed() {
  if (const char* s = std::getenv("METRALE_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ rd();
}

std::string seed_trace(uint64_t seed) { return "seed " + std::to_string(seed) + " (METRALE_TEST_SEED replays)"; }

bf16 bf16_bits(uint16_t b) { return bf16{b}; }
bf16 to_bf16(float x) { return codec::float_to_bf16(x); }

// Values every quantizer must handle: NaNs (quiet, "signalling" payloads,
// both signs), infinities, signed zeros, bf16 subnormals, tiny normals,
// the largest finite bf16, and magnitudes around the fp8 / e2m1 limits.
const std::vector<uint16_t>& special_bits() {
  static const std::vector<uint16_t> v = [] {
    std::vector<uint16_t> s = {0x7fc0, 0xffc0, 0x7f81, 0xff81, 0x7fff,  // NaNs
                               0x7f80, 0xff80,                          // +-inf
                               0x0000, 0x8000,                          // +-0
                               0x0001, 0x8001, 0x007f, 0x807f,          // subnormals
                               0x0080, 0x8080,                          // smallest normals
                               0x7f7f, 0xff7f};                         // +-max finite
    for (float f : {1e-30f, -1e-30f, 1e-10f, -3e-9f, 448.0f, -448.0f, 464.0f, 480.0f, -500.0f, 6.0f, -5.0f,
                    0.25f, -0.75f, 3.5f, 1e20f, -1e30f, 65504.0f})
      s.push_back(to_bf16(f).bits);
    return s;
  }();
  return v;
}

// Fills n values of a (token, kv head) row-major bf16 buffer: mostly normal
// values with a few large-magnitude channels (as real K has), plus special
// values and special 16-element groups (all zero, all tiny, a NaN, an inf).
void fill_rows(std::mt19937_64& rng, bf16* dst, int64_t num_rows, int64_t row_len, int64_t row_stride,
               int32_t head_dim, double special_rate) {
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  const auto& specials = special_bits();
  std::vector<float> channel_scale(size_t(head_dim), 1.0f);
  for (auto& c : channel_scale)
    if (u01(rng) < 0.06) c = float(10.0 + 40.0 * u01(rng));
  // One 64-bit draw per element: 16 bits decide "special", 48 bits make an
  // approximately normal value (sum of three uniforms, unit variance).
  const uint64_t special_threshold = uint64_t(special_rate * 65536.0);
  for (int64_t r = 0; r < num_rows; ++r) {
    bf16* row = dst + r * row_stride;
    for (int64_t i = 0; i < row_len; ++i) {
      const uint64_t bits = rng();
      if ((bits & 0xffffu) < special_threshold) {
        row[i] = bf16_bits(specials[size_t((bits >> 16) % specials.size())]);
      } else {
        const float sum = float((bits >> 16) & 0xffffu) + float((bits >> 32) & 0xffffu) + float(bits >> 48);
        const float normal = (sum * (1.0f / 65536.0f) - 1.5f) * 2.0f;  // variance 3/12 * 4 = 1
        row[i] = to_bf16(normal * channel_scale[size_t(i % head_dim)]);
      }
    }
    for (int64_t g = 0; g + 16 <= row_len; g += 16) {
      const double u = u01(rng);
      if (u < special_rate) {
        for (int j = 0; j < 16; ++j) row[g + j] = bf16_bits((rng() & 1) ? 0x8000 : 0x0000);
      } else if (u < 2 * special_rate) {
        for (int j = 0; j < 16; ++j) row[g + j] = to_bf16(float((u01(rng) - 0.5) * 1e-12));
      } else if (u < 3 * special_rate) {
        row[g + (rng() % 16)] = bf16_bits(0x7fc0);
      } else if (u < 4 * special_rate) {
        row[g + (rng() % 16)] = bf16_bits((rng() & 1) ? 0xff80 : 0x7f80);
      }
    }
  }
}

template <class T>
std::vector<T> download_range(const T* dev, size_t count) {
  std::vector<T> host(count);
  METRALE_CUDA_OK(cudaDeviceSynchronize());
  if (count) METRALE_CUDA_OK(cudaMemcpy(host.data(), dev, count * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

// Describes where byte `off` of a cache lies (page, section, row, element).
std::string where(const KvCacheLayout& l, int64_t off) {
  std::ostringstream os;
  const int64_t page = off / l.page_stride_bytes, in = off % l.page_stride_bytes;
  const int64_t H = l.num_kv_heads, D = l.head_dim;
  os << "byte " << off << " = page " << page << " +" << in;
  const int64_t rows = int64_t(l.block_size) * H;
  switch (l.format) {
    case KvFormat::bf16:
    case KvFormat::fp8_e4m3: {
      const int64_t esz = l.format == KvFormat::bf16 ? 2 : 1;
      if (in < l.data_section_bytes) {
        const int64_t e = in / esz;
        os << " (slot offset " << e / D / H << ", head " << (e / D) % H << ", d " << e % D << ")";
      } else {
        os << " (page padding)";
      }
      break;
    }
    case KvFormat::nvfp4:
      if (in < rows * D / 2) {
        os << " (codes: slot offset " << in / (D / 2) / H << ", head " << (in / (D / 2)) % H << ", d "
           << 2 * (in % (D / 2)) << ")";
      } else if (in < l.data_section_bytes) {
        os << " (data-section padding)";
      } else if (in < l.data_section_bytes + rows * D / 16) {
        const int64_t s = in - l.data_section_bytes;
        os << " (scales: slot offset " << s / (D / 16) / H << ", head " << (s / (D / 16)) % H << ", group "
           << s % (D / 16) << ")";
      } else {
        os << " (page padding)";
      }
      break;
  }
  return os.str();
}

// Byte-for-byte comparison with a readable first mismatch.
::testing::AssertionResult same_bytes(const std::vector<uint8_t>& want, const std::vector<uint8_t>& got,
                                      const KvCacheLayout& l, const char* which) {
  if (want.size() != got.size()) return ::testing::AssertionFailure() << which << ": size mismatch";
  int64_t first = -1, count = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] != got[i]) {
      if (first < 0) first = int64_t(i);
      ++count;
    }
  }
  if (count == 0) return ::testing::AssertionSuccess();
  char buf[64];
  std::snprintf(buf, sizeof buf, "cpu 0x%02x, gpu 0x%02x", want[size_t(first)], got[size_t(first)]);
  return ::testing::AssertionFailure() << which << " cache: " << count << " bytes differ; first at "
                                       << where(l, first) << ": " << buf;
}

KvCacheLayout make_layout(KvFormat f, int64_t num_blocks, int32_t bs, int32_t H, int32_t D, bool pad,
                          std::mt19937_64& rng) {
  switch (f) {
    case KvFormat::bf16: {
      KvCacheLayout l = KvCacheLayout::bf16(num_blocks, bs, H, D);
      if (pad) {  // bf16 pages may sit page_stride_bytes apart too
        l.page_stride_bytes += 16 * int64_t(1 + rng() % 8);
        l.validate();
      }
      return l;
    }
    case KvFormat::fp8_e4m3: {
      const int64_t payload = int64_t(bs) * H * D;
      return KvCacheLayout::fp8(num_blocks, bs, H, D, pad ? payload + 16 * int64_t(1 + rng() % 8) : 0);
    }
    case KvFormat::nvfp4: {
      if (!pad) return KvCacheLayout::nvfp4(num_blocks, bs, H, D);
      const int64_t rows = int64_t(bs) * H;
      const int64_t data = rows * D / 2 + 16 * int64_t(rng() % 4);
      const int64_t stride = data + rows * D / 16 + 16 * int64_t(1 + rng() % 4);
      return KvCacheLayout::nvfp4(num_blocks, bs, H, D, (stride + 15) / 16 * 16, data);
    }
  }
  return {};
}

// Slot mapping: unique valid slots (a permutation of part of the capacity,
// so the result cannot depend on write order), padding tokens (negative),
// and slots past the capacity. Returns the number of the latter.
int64_t make_slots(std::mt19937_64& rng, int64_t num_tokens, int64_t capacity, std::vector<int64_t>& slots,
                   double neg_rate = 0.1, double oob_rate = 0.1) {
  std::vector<int64_t> perm(static_cast<size_t>(capacity));
  std::iota(perm.begin(), perm.end(), int64_t(0));
  std::shuffle(perm.begin(), perm.end(), rng);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  slots.resize(size_t(num_tokens));
  size_t next = 0;
  int64_t oob = 0;
  for (int64_t j = 0; j < num_tokens; ++j) {
    const double u = u01(rng);
    if (u < neg_rate || (u >= neg_rate + oob_rate && next == perm.size())) {
      const int64_t negs[] = {-1, -2, -int64_t(rng() % 1000000) - 1, std::numeric_limits<int64_t>::min()};
      slots[size_t(j)] = negs[rng() % 4];
    } else if (u < neg_rate + oob_rate) {
      const int64_t bad[] = {capacity, capacity + 1 + int64_t(rng() % 100000), int64_t(1) << 40,
                             std::numeric_limits<int64_t>::max()};
      slots[size_t(j)] = bad[rng() % 4];
      ++oob;
    } else {
      slots[size_t(j)] = perm[next++];
    }
  }
  return oob;
}

std::vector<uint8_t> random_bytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> v(n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t r = rng();
    std::memcpy(v.data() + i, &r, 8);
  }
  for (; i < n; ++i) v[i] = uint8_t(rng());
  return v;
}

// One cache-write problem: inputs on host and device, caches pre-filled with
// the same garbage on both sides.
struct Problem {
  KvCacheLayout layout;
  metrale::KvScales scales;
  int64_t num_tokens = 0;
  int64_t expected_skipped = 0;
  // Inputs: one host buffer holds K and V rows (fused QKV when `fused`).
  std::vector<bf16> kv_host;
  int64_t key_offset = 0, value_offset = 0, key_stride = 0, value_stride = 0;
  int64_t key_head_stride = 0, value_head_stride = 0;  // 0: packed heads
  std::vector<int64_t> slots;
  std::vector<uint8_t> k_garbage, v_garbage;
};

struct Variant {
  bool fused = false;      // K and V are strided rows of one fused QKV buffer
  bool pad = false;        // page padding / larger sections
  bool unit_gscale = true; // nvfp4 global scales of 1.0
};

Problem make_problem(std::mt19937_64& rng, KvFormat f, int32_t D, int32_t bs, int32_t H, const Variant& var,
                     int64_t num_blocks, int64_t num_tokens, double special_rate = 0.02) {
  Problem pb;
  pb.layout = make_layout(f, num_blocks, bs, H, D, var.pad, rng);
  pb.num_tokens = num_tokens;
  pb.expected_skipped = make_slots(rng, num_tokens, pb.layout.capacity_slots(), pb.slots);
  const int64_t row = int64_t(H) * D;
  if (var.fused) {
    // [q (Hq*D) | k (H*D) | v (H*D) | pad], Hq a multiple of H.
    const int64_t hq = int64_t(H) * (1 + int64_t(rng() % 4));
    const int64_t stride = (hq + 2 * H) * D + 8 * int64_t(rng() % 5);
    pb.key_offset = hq * D;
    pb.value_offset = hq * D + row;
    pb.key_stride = pb.value_stride = stride;
    pb.kv_host.resize(size_t(num_tokens * stride + 8));
    fill_rows(rng, pb.kv_host.data(), num_tokens, stride, stride, D, special_rate);
  } else {
    // Separate K and V blocks with their own strides.
    pb.key_stride = row + (rng() % 2 ? 8 * int64_t(rng() % 4) : 0);
    pb.value_stride = row + (rng() % 2 ? 8 * int64_t(rng() % 4) : 0);
    pb.key_offset = 0;
    pb.value_offset = (num_tokens * pb.key_stride + 7) / 8 * 8 + 8;
    pb.kv_host.resize(size_t(pb.value_offset + num_tokens * pb.value_stride + 8));
    fill_rows(rng, pb.kv_host.data(), num_tokens, pb.key_stride, pb.key_stride, D, special_rate);
    fill_rows(rng, pb.kv_host.data() + pb.value_offset, num_tokens, pb.value_stride, pb.value_stride, D,
              special_rate);
  }
  // Scales: fp8 around absmax/448 (times a factor, so some values saturate);
  // nvfp4 global scales 1.0 or calibrated-like values.
  std::uniform_real_distribution<float> factor(0.25f, 3.0f);
  pb.scales.k_scale = 8.0f / 448.0f * factor(rng);
  pb.scales.v_scale = 6.0f / 448.0f * factor(rng);
  if (!var.unit_gscale) {
    pb.scales.k_global_scale = 30.0f / (448.0f * 6.0f) * factor(rng);
    pb.scales.v_global_scale = 5.0f / (448.0f * 6.0f) * factor(rng);
  }
  pb.k_garbage = random_bytes(rng, size_t(pb.layout.cache_bytes()));
  pb.v_garbage = random_bytes(rng, size_t(pb.layout.cache_bytes()));
  return pb;
}

CacheWriteArgs args_for(const Problem& pb, const bf16* kv, const int64_t* slots, void* k, void* v,
                        int32_t* skipped, int64_t* saturated = nullptr) {
  CacheWriteArgs a;
  a.key = kv + pb.key_offset;
  a.key_stride = pb.key_stride;
  a.key_head_stride = pb.key_head_stride;
  a.value = kv + pb.value_offset;
  a.value_stride = pb.value_stride;
  a.value_head_stride = pb.value_head_stride;
  a.saturated = saturated;
  a.slot_mapping = slots;
  a.num_tokens = pb.num_tokens;
  a.cache.layout = pb.layout;
  a.cache.k = k;
  a.cache.v = v;
  a.cache.scales = pb.scales;
  a.skipped = skipped;
  return a;
}

// Runs both backends on one problem and compares everything.
void run_and_compare(const Problem& pb) {
  // CPU reference. The host cache buffers are over-allocated by 16 bytes so
  // their base can be 16-byte aligned like a device allocation.
  std::vector<uint8_t> k_store(pb.k_garbage.size() + 16), v_store(pb.v_garbage.size() + 16);
  auto align16 = [](std::vector<uint8_t>& s) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(s.data());
    return reinterpret_cast<uint8_t*>((p + 15) & ~uintptr_t(15));
  };
  uint8_t* hk = align16(k_store);
  uint8_t* hv = align16(v_store);
  std::memcpy(hk, pb.k_garbage.data(), pb.k_garbage.size());
  std::memcpy(hv, pb.v_garbage.data(), pb.v_garbage.size());
  std::vector<bf16> kv_aligned_store(pb.kv_host.size() + 8);
  bf16* hkv = reinterpret_cast<bf16*>((reinterpret_cast<uintptr_t>(kv_aligned_store.data()) + 15) & ~uintptr_t(15));
  std::copy(pb.kv_host.begin(), pb.kv_host.end(), hkv);
  int32_t cpu_skipped = 5;  // a non-zero start: the counter accumulates
  std::vector<int64_t> cpu_saturated = {3, int64_t(1) << 40};  // the same, past 32 bits
  const int64_t cpu_ret =
      cpu::reshape_and_cache(args_for(pb, hkv, pb.slots.data(), hk, hv, &cpu_skipped, cpu_saturated.data()));
  EXPECT_EQ(cpu_ret, pb.expected_skipped) << "CPU reference skipped count";
  EXPECT_EQ(cpu_skipped, 5 + pb.expected_skipped) << "CPU reference *skipped";
  if (pb.layout.format == KvFormat::bf16)
    EXPECT_EQ(cpu_saturated, (std::vector<int64_t>{3, int64_t(1) << 40})) << "BF16 never saturates";

  // GPU.
  DeviceBuffer<bf16> dkv(pb.kv_host);
  DeviceBuffer<int64_t> dslots(pb.slots);
  DeviceBuffer<uint8_t> dk(pb.k_garbage), dv(pb.v_garbage);
  DeviceBuffer<int32_t> dskipped(std::vector<int32_t>{5});
  DeviceBuffer<int64_t> dsaturated(std::vector<int64_t>{3, int64_t(1) << 40});
  mcuda::reshape_and_cache(
      args_for(pb, dkv.get(), dslots.get(), dk.get(), dv.get(), dskipped.get(), dsaturated.get()));
  METRALE_CUDA_OK(cudaDeviceSynchronize());

  const std::vector<uint8_t> want_k(hk, hk + pb.k_garbage.size()), want_v(hv, hv + pb.v_garbage.size());
  EXPECT_TRUE(same_bytes(want_k, dk.download(), pb.layout, "K"));
  EXPECT_TRUE(same_bytes(want_v, dv.download(), pb.layout, "V"));
  EXPECT_EQ(dskipped.download()[0], cpu_skipped) << "GPU *skipped";
  const std::vector<int64_t> gpu_saturated = dsaturated.download();
  EXPECT_EQ(gpu_saturated[0], cpu_saturated[0]) << "GPU saturated K elements";
  EXPECT_EQ(gpu_saturated[1], cpu_saturated[1]) << "GPU saturated V elements";
  EXPECT_TRUE(dsaturated.guards_intact()) << "write outside the saturation counters";
  EXPECT_TRUE(dk.guards_intact()) << "write outside the K cache";
  EXPECT_TRUE(dv.guards_intact()) << "write outside the V cache";
  EXPECT_TRUE(dkv.guards_intact() && dslots.guards_intact() && dskipped.guards_intact());
  // Inputs are read-only.
  const std::vector<bf16> kv_after = dkv.download();
  EXPECT_EQ(0, std::memcmp(kv_after.data(), pb.kv_host.data(), pb.kv_host.size() * sizeof(bf16)))
      << "the kernel modified its input";
}

std::string variant_name(const Variant& v, KvFormat f) {
  std::string s = std::string(v.fused ? "fused-qkv" : "separate-kv") + (v.pad ? ", padded pages" : ", dense pages");
  if (f == KvFormat::nvfp4) s += v.unit_gscale ? ", global scale 1" : ", global scale != 1";
  return s;
}

// ------------------------------------------------ randomized shape sweep

using ShapeParam = std::tuple<KvFormat, int32_t /*D*/, int32_t /*block_size*/, int32_t /*H*/>;

class GpuCacheWrite : public ::testing::TestWithParam<ShapeParam> {};

TEST_P(GpuCacheWrite, MatchesCpuReferenceByteForByte) {
  METRALE_SKIP_WITHOUT_GPU();
  const auto [f, D, bs, H] = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  std::vector<Variant> variants;
  for (bool fused : {false, true})
    for (bool pad : {false, true})
      for (bool unit : {true, false}) {
        if (f != KvFormat::nvfp4 && !unit) continue;
        variants.push_back(Variant{fused, pad, unit});
      }
  for (const Variant& var : variants) {
    SCOPED_TRACE(variant_name(var, f));
    const int64_t num_blocks = 2 + int64_t(rng() % 9);
    const int64_t capacity = num_blocks * bs;
    const int64_t num_tokens = 1 + int64_t(rng() % uint64_t(capacity + 24));
    SCOPED_TRACE("num_blocks " + std::to_string(num_blocks) + ", num_tokens " + std::to_string(num_tokens));
    const Problem pb = make_problem(rng, f, D, bs, H, var, num_blocks, num_tokens);
    run_and_compare(pb);
    if (HasFailure()) return;
  }
}

std::string shape_name(const ::testing::TestParamInfo<ShapeParam>& info) {
  const auto [f, D, bs, H] = info.param;
  return std::string(metrale::to_string(f)) + "_d" + std::to_string(D) + "_bs" + std::to_string(bs) + "_h" +
         std::to_string(H);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuCacheWrite,
                         ::testing::Combine(::testing::Values(KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4),
                                            ::testing::Values(64, 128, 256), ::testing::Values(16, 32),
                                            ::testing::Values(1, 2, 8)),
                         shape_name);

// --------------------------------------------- special inputs, all formats

class GpuCacheWriteFormat : public ::testing::TestWithParam<KvFormat> {};

// Inputs made mostly of special values: NaN, +-inf, -0, subnormals, huge.
TEST_P(GpuCacheWriteFormat, SpecialValuesMatchCpu) {
  METRALE_SKIP_WITHOUT_GPU();
  const KvFormat f = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  for (bool unit : {true, false}) {
    SCOPED_TRACE(unit ? "global scale 1" : "global scale != 1");
    const Problem pb = make_problem(rng, f, 128, 16, 2, Variant{true, true, unit}, 6, 90, /*special_rate=*/0.2);
    run_and_compare(pb);
  }
}

// K and V as head-strided views, each in its own region of kv_host (filled
// whole, so the elements between the rows are there to be misread):
//  kind 0: transformers' (T, H, S, D) cache tensor sliced at s0, key[:, :, s0]
//          (token stride H*S*D, head stride S*D);
//  kind 1: one sequence's T new tokens of a (1, H, S >= T, D) tensor, key[0]
//          read as (T, H, D) (token stride D, head stride S*D);
//  kind 2: token-major rows whose heads are padded apart (head stride > D).
Problem make_head_strided_problem(std::mt19937_64& rng, KvFormat f, int32_t D, int32_t bs, int32_t H, int kind,
                                  int64_t num_blocks, int64_t num_tokens, bool unit_gscale) {
  Problem pb = make_problem(rng, f, D, bs, H, Variant{false, false, unit_gscale}, num_blocks, num_tokens);
  const int64_t T = num_tokens;
  int64_t ts = 0, hs = 0, start = 0, region = 0;
  if (kind == 0) {
    const int64_t S = 2 + int64_t(rng() % 3);
    ts = H * S * D, hs = S * D, start = int64_t(rng() % uint64_t(S)) * D, region = T * H * S * D;
  } else if (kind == 1) {
    ts = D, hs = (T + int64_t(rng() % 3)) * D, region = H * hs;
  } else {
    hs = D + 8 * int64_t(1 + rng() % 4), ts = H * hs + 8 * int64_t(rng() % 3), region = T * ts;
  }
  pb.key_stride = pb.value_stride = ts;
  pb.key_head_stride = pb.value_head_stride = hs;
  pb.key_offset = start;
  pb.value_offset = region + 8 + start;
  pb.kv_host.assign(size_t(2 * (region + 8)), bf16{0});
  fill_rows(rng, pb.kv_host.data(), 1, int64_t(pb.kv_host.size()), int64_t(pb.kv_host.size()), D, 0.02);
  return pb;
}

class GpuCacheWriteHeadStrided : public ::testing::TestWithParam<std::tuple<KvFormat, int32_t /*D*/>> {};

TEST_P(GpuCacheWriteHeadStrided, MatchesCpuReferenceByteForByte) {
  METRALE_SKIP_WITHOUT_GPU();
  const auto [f, D] = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  for (int kind = 0; kind < 3; ++kind)
    for (int32_t H : {1, 3, 8})
      for (bool unit : {true, false}) {
        if (f != KvFormat::nvfp4 && !unit) continue;
        const int32_t bs = rng() % 2 ? 16 : 32;
        const int64_t num_blocks = 2 + int64_t(rng() % 6);
        const int64_t num_tokens = 1 + int64_t(rng() % uint64_t(num_blocks * bs + 16));
        const Problem pb = make_head_strided_problem(rng, f, D, bs, H, kind, num_blocks, num_tokens, unit);
        SCOPED_TRACE("kind " + std::to_string(kind) + ", H " + std::to_string(H) + ", block_size " +
                     std::to_string(bs) + ", tokens " + std::to_string(num_tokens) + ", token stride " +
                     std::to_string(pb.key_stride) + ", head stride " + std::to_string(pb.key_head_stride) +
                     (unit ? "" : ", global scale != 1"));
        run_and_compare(pb);
        if (HasFailure()) return;
      }
}

INSTANTIATE_TEST_SUITE_P(Formats, GpuCacheWriteHeadStrided,
                         ::testing::Combine(::testing::Values(KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4),
                                            ::testing::Values(64, 256)),
                         [](const ::testing::TestParamInfo<std::tuple<KvFormat, int32_t>>& i) {
                           return std::string(metrale::to_string(std::get<0>(i.param))) + "_d" +
                                  std::to_string(std::get<1>(i.param));
                         });

// Scales calibrated on a fraction of the data's range (a prompt's absmax
// exceeded at decode time): many elements saturate, K and V differently;
// the GPU counts exactly the CPU's (run_and_compare), which the CPU tests
// check against an independent count.
TEST_P(GpuCacheWriteFormat, SaturationCountsMatchCpu) {
  METRALE_SKIP_WITHOUT_GPU();
  const KvFormat f = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  for (float shrink : {1.0f, 0.5f, 0.05f})
    for (bool unit : {true, false}) {
      if (f != KvFormat::nvfp4 && !unit) continue;
      SCOPED_TRACE("scales x " + std::to_string(shrink) + (unit ? "" : ", global scale != 1"));
      Problem pb = make_problem(rng, f, 128, 16, 4, Variant{true, false, unit}, 8, 100);
      pb.scales.k_scale *= shrink;
      pb.scales.v_scale *= shrink * 0.7f;
      pb.scales.k_global_scale *= shrink;
      pb.scales.v_global_scale *= shrink * 0.7f;
      if (!unit && shrink < 0.1f) pb.scales.k_global_scale = 1e-30f;  // the extreme-scale route
      run_and_compare(pb);
    }
}

// Many tokens: the tile loop strides over a capped grid.
TEST_P(GpuCacheWriteFormat, ManyTokensGridStride) {
  METRALE_SKIP_WITHOUT_GPU();
  const KvFormat f = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  // H=1, D=64: tiny rows, so a block packs many tokens and the grid caps early.
  const int64_t num_tokens = (int64_t(1) << 19) + 37;
  const int64_t num_blocks = num_tokens / 16 - 1000;  // a few percent of tokens out of capacity
  const Problem pb = make_problem(rng, f, 64, 16, 1, Variant{false, false, false}, num_blocks, num_tokens, 0.01);
  run_and_compare(pb);
}

INSTANTIATE_TEST_SUITE_P(Formats, GpuCacheWriteFormat,
                         ::testing::Values(KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4),
                         [](const ::testing::TestParamInfo<KvFormat>& i) { return std::string(metrale::to_string(i.param)); });

// ------------------------------------- NVFP4 adaptive group scales

// The layout's Nvfp4ScaleRule::adaptive: the GPU write (the unit route's
// adaptive kernel, or the codec route for extreme global scales) leaves the
// caches byte-identical to the CPU's codec::nvfp4_quantize_group_adaptive,
// counts alike, writes nothing else.
Problem adaptive(Problem pb) {
  pb.layout = pb.layout.with_nvfp4_scales(metrale::Nvfp4ScaleRule::adaptive);
  return pb;
}

using AdaptiveParam = std::tuple<int32_t /*D*/, int32_t /*H*/>;
class GpuCacheWriteAdaptive : public ::testing::TestWithParam<AdaptiveParam> {};

TEST_P(GpuCacheWriteAdaptive, MatchesCpuReferenceByteForByte) {
  METRALE_SKIP_WITHOUT_GPU();
  const auto [D, H] = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  for (bool fused : {false, true})
    for (bool pad : {false, true})
      for (bool unit : {true, false}) {
        const Variant var{fused, pad, unit};
        SCOPED_TRACE(variant_name(var, KvFormat::nvfp4));
        const int32_t bs = rng() % 2 ? 16 : 32;
        const int64_t num_blocks = 2 + int64_t(rng() % 9);
        const int64_t num_tokens = 1 + int64_t(rng() % uint64_t(num_blocks * bs + 24));
        run_and_compare(adaptive(make_problem(rng, KvFormat::nvfp4, D, bs, H, var, num_blocks, num_tokens)));
        if (HasFailure()) return;
      }
}

// Mostly special values (NaN, +-inf, -0, subnormals, huge; zero, tiny, NaN
// and inf groups), g = 1 and calibrated-like.
TEST_P(GpuCacheWriteAdaptive, SpecialValuesMatchCpu) {
  METRALE_SKIP_WITHOUT_GPU();
  const auto [D, H] = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  for (bool unit : {true, false})
    for (double rate : {0.05, 0.2}) {
      SCOPED_TRACE(std::string(unit ? "global scale 1" : "global scale != 1") + ", special rate " +
                   std::to_string(rate));
      run_and_compare(adaptive(make_problem(rng, KvFormat::nvfp4, D, 16, H, Variant{true, true, unit}, 6, 90, rate)));
    }
}

// Global scales calibrated on the batch (kv_scales_from_absmax), shrunk so
// that groups saturate, grown so that group scales fall on the E4M3
// subnormal grid (tiny groups), and extreme ones that take the codec route
// (a subnormal g; a g so large that inv underflows).
TEST_P(GpuCacheWriteAdaptive, CalibratedTinySaturatedAndExtremeGlobalScales) {
  METRALE_SKIP_WITHOUT_GPU();
  const auto [D, H] = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  for (float factor : {1.0f, 0.3f, 0.02f, 300.0f, 3e4f, 0.0f, -1.0f}) {
    Problem pb = adaptive(make_problem(rng, KvFormat::nvfp4, D, 16, H, Variant{false, false, true}, 8, 100, 0.01));
    float k_absmax = 0, v_absmax = 0;
    for (size_t i = 0; i < pb.kv_host.size(); ++i) {
      const float a = std::fabs(codec::bf16_to_float(pb.kv_host[i]));
      if (!(a <= 1e30f)) continue;  // NaN, inf, huge
      float& m = int64_t(i) < pb.value_offset ? k_absmax : v_absmax;
      m = std::max(m, a);
    }
    pb.scales = metrale::kv_scales_from_absmax(KvFormat::nvfp4, k_absmax, v_absmax);
    if (factor > 0.0f) {
      pb.scales.k_global_scale *= factor;
      pb.scales.v_global_scale *= factor * 0.7f;
    } else if (factor == 0.0f) {
      pb.scales.k_global_scale = 1e-42f;  // subnormal g: the codec route
    } else {
      pb.scales.v_global_scale = 1e37f;  // inv underflows for large scales: the codec route
    }
    SCOPED_TRACE("k_global_scale " + std::to_string(pb.scales.k_global_scale) + ", v_global_scale " +
                 std::to_string(pb.scales.v_global_scale));
    run_and_compare(pb);
    if (HasFailure()) return;
  }
}

TEST_P(GpuCacheWriteAdaptive, HeadStridedMatchesCpu) {
  METRALE_SKIP_WITHOUT_GPU();
  const auto [D, H] = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  for (int kind = 0; kind < 3; ++kind)
    for (bool unit : {true, false}) {
      const int64_t num_blocks = 2 + int64_t(rng() % 6);
      const int64_t num_tokens = 1 + int64_t(rng() % uint64_t(num_blocks * 16 + 16));
      SCOPED_TRACE("kind " + std::to_string(kind) + (unit ? "" : ", global scale != 1"));
      run_and_compare(
          adaptive(make_head_strided_problem(rng, KvFormat::nvfp4, D, 16, H, kind, num_blocks, num_tokens, unit)));
      if (HasFailure()) return;
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuCacheWriteAdaptive,
                         ::testing::Combine(::testing::Values(64, 128, 256), ::testing::Values(1, 3, 8)),
                         [](const ::testing::TestParamInfo<AdaptiveParam>& i) {
                           return "d" + std::to_string(std::get<0>(i.param)) + "_h" +
                                  std::to_string(std::get<1>(i.param));
                         });

TEST(GpuCacheWriteAdaptiveLarge, ManyTokensGridStride) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  const int64_t num_tokens = (int64_t(1) << 19) + 37;
  const int64_t num_blocks = num_tokens / 16 - 1000;
  run_and_compare(adaptive(
      make_problem(rng, KvFormat::nvfp4, 64, 16, 1, Variant{false, false, false}, num_blocks, num_tokens, 0.01)));
}

// The rule is the layout's: a bf16 or fp8 layout refuses it before anything runs.
TEST(GpuCacheWriteAdaptiveArgs, OnlyNvfp4LayoutsTakeTheAdaptiveRule) {
  for (KvFormat f : {KvFormat::bf16, KvFormat::fp8_e4m3}) {
    std::mt19937_64 rng(1);
    Problem pb = make_problem(rng, f, 64, 16, 1, Variant{}, 2, 4);
    pb.layout.nvfp4_scales = metrale::Nvfp4ScaleRule::adaptive;
    int32_t skipped = 0;
    EXPECT_THROW(mcuda::reshape_and_cache(args_for(pb, pb.kv_host.data(), pb.slots.data(), nullptr, nullptr, &skipped)),
                 metrale::InvalidArgument)
        << metrale::to_string(f);
  }
}

// A cache of more than 4 GiB: pages past the 32-bit byte range are written
// exactly like pages at its start (64-bit address math). The device cache is
// compared page by page with a small host cache holding the same pages.
TEST(GpuCacheWriteLarge, PagesBeyond4GiB) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  const int32_t bs = 16, H = 8, D = 128;
  for (KvFormat f : {KvFormat::fp8_e4m3, KvFormat::nvfp4}) {
    SCOPED_TRACE(metrale::to_string(f));
    const KvCacheLayout small = make_layout(f, 4, bs, H, D, true, rng);
    KvCacheLayout big = small;
    big.num_blocks = ((int64_t(9) << 29) + small.page_stride_bytes - 1) / small.page_stride_bytes;  // 4.5 GiB
    big.validate();
    size_t free_b = 0, total_b = 0;
    METRALE_CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
    if (free_b < size_t(2 * big.cache_bytes() + (int64_t(1) << 30)))
      GTEST_SKIP() << "needs " << 2 * big.cache_bytes() << " bytes of free device memory";
    // Small page p (0..3) <-> big page map[p]; page 0 stays at offset 0.
    const int64_t map[4] = {0, big.num_blocks / 2, big.num_blocks - 2, big.num_blocks - 1};
    const int64_t num_tokens = 3 * bs + 5;
    Problem pb = make_problem(rng, f, D, bs, H, Variant{true, false, false}, 4, num_tokens);
    pb.layout = small;
    std::vector<int64_t> small_slots(static_cast<size_t>(num_tokens)), big_slots(static_cast<size_t>(num_tokens));
    std::vector<int64_t> perm(size_t(4 * bs));
    std::iota(perm.begin(), perm.end(), int64_t(0));
    std::shuffle(perm.begin(), perm.end(), rng);
    int64_t oob = 0;
    for (int64_t j = 0; j < num_tokens; ++j) {
      if (j % 11 == 3) {
        small_slots[size_t(j)] = -1;
        big_slots[size_t(j)] = -1;
      } else if (j % 11 == 7) {  // past the big capacity
        small_slots[size_t(j)] = small.capacity_slots() + j;
        big_slots[size_t(j)] = big.capacity_slots() + j;
        ++oob;
      } else {
        const int64_t s = perm[size_t(j)];
        small_slots[size_t(j)] = s;
        big_slots[size_t(j)] = map[s / bs] * bs + s % bs;
      }
    }
    pb.slots = small_slots;
    pb.expected_skipped = oob;
    const uint8_t fill = 0x5C;
    pb.k_garbage.assign(size_t(small.cache_bytes()), fill);
    pb.v_garbage.assign(size_t(small.cache_bytes()), fill);

    // CPU on the small cache.
    std::vector<uint8_t> hk = pb.k_garbage, hv = pb.v_garbage;
    int32_t cpu_skipped = 0;
    std::vector<bf16> hkv_store(pb.kv_host.size() + 8);
    bf16* hkv = reinterpret_cast<bf16*>((reinterpret_cast<uintptr_t>(hkv_store.data()) + 15) & ~uintptr_t(15));
    std::copy(pb.kv_host.begin(), pb.kv_host.end(), hkv);
    std::vector<uint8_t> hk_al(hk.size() + 16), hv_al(hv.size() + 16);
    uint8_t* hkp = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(hk_al.data()) + 15) & ~uintptr_t(15));
    uint8_t* hvp = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(hv_al.data()) + 15) & ~uintptr_t(15));
    std::memcpy(hkp, hk.data(), hk.size());
    std::memcpy(hvp, hv.data(), hv.size());
    cpu::reshape_and_cache(args_for(pb, hkv, small_slots.data(), hkp, hvp, &cpu_skipped));
    ASSERT_EQ(cpu_skipped, oob);

    // GPU on the big cache.
    Problem pbig = pb;
    pbig.layout = big;
    DeviceBuffer<bf16> dkv(pb.kv_host);
    DeviceBuffer<int64_t> dslots(big_slots);
    DeviceBuffer<uint8_t> dk(size_t(big.cache_bytes()), fill), dv(size_t(big.cache_bytes()), fill);
    DeviceBuffer<int32_t> dskipped(std::vector<int32_t>{0});
    mcuda::reshape_and_cache(args_for(pbig, dkv.get(), dslots.get(), dk.get(), dv.get(), dskipped.get()));
    METRALE_CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(dskipped.download()[0], cpu_skipped);
    const size_t ps = size_t(small.page_stride_bytes);
    for (int p = 0; p < 4; ++p) {
      SCOPED_TRACE("page " + std::to_string(map[p]) + " at byte " + std::to_string(map[p] * int64_t(ps)));
      const auto gk = download_range(dk.get() + size_t(map[p]) * ps, ps);
      const auto gv = download_range(dv.get() + size_t(map[p]) * ps, ps);
      const std::vector<uint8_t> wk(hkp + p * ps, hkp + (p + 1) * ps), wv(hvp + p * ps, hvp + (p + 1) * ps);
      EXPECT_TRUE(same_bytes(wk, gk, small, "K"));
      EXPECT_TRUE(same_bytes(wv, gv, small, "V"));
    }
    // Untouched pages right after the written ones stay as they were.
    const auto after = download_range(dk.get() + size_t(map[1] + 1) * ps, ps);
    EXPECT_TRUE(std::all_of(after.begin(), after.end(), [&](uint8_t b) { return b == fill; }));
    EXPECT_TRUE(dk.guards_intact());
    EXPECT_TRUE(dv.guards_intact());
  }
}

// No tokens: nothing is launched and nothing changes (needs no GPU).
TEST(GpuCacheWriteArgs, ZeroTokensIsANoOp) {
  CacheWriteArgs a;
  a.cache.layout = KvCacheLayout::fp8(4, 16, 2, 128);
  alignas(16) static uint8_t k[16], v[16];
  a.cache.k = k;  // never dereferenced: no launch
  a.cache.v = v;
  a.num_tokens = 0;
  EXPECT_NO_THROW(mcuda::reshape_and_cache(a));
}

// ------------------------------------------------ argument validation
// These need no GPU: the launcher validates before any CUDA runtime call.
// The pointers are fake device addresses that are never dereferenced.

CacheWriteArgs valid_args() {
  CacheWriteArgs a;
  a.cache.layout = KvCacheLayout::nvfp4(8, 16, 2, 128);
  a.cache.k = reinterpret_cast<void*>(uintptr_t(0x7f0000000000));
  a.cache.v = reinterpret_cast<void*>(uintptr_t(0x7f0010000000));
  a.key = reinterpret_cast<const bf16*>(uintptr_t(0x7f0020000000));
  a.value = reinterpret_cast<const bf16*>(uintptr_t(0x7f0030000000));
  a.key_stride = a.value_stride = 2 * 128;
  a.slot_mapping = reinterpret_cast<const int64_t*>(uintptr_t(0x7f0040000000));
  a.num_tokens = 7;
  return a;
}

template <class Fn>
void expect_invalid(Fn fn, const std::string& arg_name) {
  try {
    fn();
    ADD_FAILURE() << "expected metrale::InvalidArgument naming '" << arg_name << "'";
  } catch (const metrale::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'" + arg_name + "'"), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected metrale::InvalidArgument, got: " << e.what();
  }
}

TEST(GpuCacheWriteArgs, BadArgumentsThrowBeforeLaunch) {
  {
    auto a = valid_args();
    a.key = reinterpret_cast<const bf16*>(reinterpret_cast<uintptr_t>(a.key) + 2);  // misaligned by one element
    expect_invalid([&] { mcuda::reshape_and_cache(a); }, "key");
  }
  {
    auto a = valid_args();
    a.value = nullptr;
    expect_invalid([&] { mcuda::reshape_and_cache(a); }, "value");
  }
  {
    auto a = valid_args();
    a.key_stride = 2 * 128 + 4;  // not a multiple of 8
    expect_invalid([&] { mcuda::reshape_and_cache(a); }, "key_stride");
  }
  {
    auto a = valid_args();
    a.value_stride = 128;  // shorter than H*D
    expect_invalid([&] { mcuda::reshape_and_cache(a); }, "value_stride");
  }
  {
    auto a = valid_args();
    a.slot_mapping = nullptr;
    expect_invalid([&] { mcuda::reshape_and_cache(a); }, "slot_mapping");
  }
  {
    auto a = valid_args();
    a.cache.k = reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(a.cache.k) + 8);
    expect_invalid([&] { mcuda::reshape_and_cache(a); }, "cache.k");
  }
  {
    auto a = valid_args();
    a.cache.scales.v_global_scale = std::numeric_limits<float>::infinity();
    expect_invalid([&] { mcuda::reshape_and_cache(a); }, "cache.scales.v_global_scale");
  }
  {
    auto a = valid_args();
    a.cache.layout = KvCacheLayout::fp8(8, 16, 2, 128);
    a.cache.scales.k_scale = 0.0f;
    expect_invalid([&] { mcuda::reshape_and_cache(a); }, "cache.scales.k_scale");
  }
  {
    auto a = valid_args();
    a.cache.layout.head_dim = 96;
    EXPECT_THROW(mcuda::reshape_and_cache(a), metrale::Unsupported);
  }
  {
    auto a = valid_args();
    a.num_tokens = -1;
    expect_invalid([&] { mcuda::reshape_and_cache(a); }, "num_tokens");
  }
  {
    auto a = valid_args();
    a.cache.layout.page_stride_bytes -= 16;  // too small for codes + scales
    expect_invalid([&] { mcuda::reshape_and_cache(a); }, "layout.page_stride_bytes");
  }
  {
    auto a = valid_args();
    a.key_head_stride = 132;  // not a multiple of 8
    expect_invalid([&] { mcuda::reshape_and_cache(a); }, "key_head_stride");
  }
  {
    auto a = valid_args();
    a.value_head_stride = 256;  // heads 256 apart need a token stride >= 384
    expect_invalid([&] { mcuda::reshape_and_cache(a); }, "value_stride");
  }
  {
    auto a = valid_args();
    a.saturated = reinterpret_cast<int64_t*>(uintptr_t(0x7f0050000004));
    expect_invalid([&] { mcuda::reshape_and_cache(a); }, "saturated");
  }
}

TEST(GpuAbsmaxArgs, BadArgumentsThrowBeforeLaunch) {
  const bf16* x = reinterpret_cast<const bf16*>(uintptr_t(0x7f0000000000));
  float* out = reinterpret_cast<float*>(uintptr_t(0x7f0010000000));
  expect_invalid([&] { mcuda::bf16_absmax(x, 4, 64, 32, out); }, "row_stride");
  expect_invalid([&] { mcuda::bf16_absmax(x, -1, 64, 64, out); }, "num_rows");
  expect_invalid([&] { mcuda::bf16_absmax(x, 4, 64, 64, nullptr); }, "absmax");
  expect_invalid([&] { mcuda::bf16_absmax(nullptr, 4, 64, 64, out); }, "x");
  expect_invalid([&] { mcuda::bf16_absmax(reinterpret_cast<const bf16*>(uintptr_t(0x7f0000000001)), 4, 64, 64, out); },
                 "x");
  expect_invalid([&] { mcuda::bf16_absmax(x, 4, 64, 64, reinterpret_cast<float*>(uintptr_t(0x7f0010000002))); },
                 "absmax");
  // Nothing to read: validated, then no launch.
  EXPECT_NO_THROW(mcuda::bf16_absmax(x, 0, 64, 64, out));
  EXPECT_NO_THROW(mcuda::bf16_absmax(x, 5, 0, 0, out));
}

// ------------------------------------------------------------ bf16_absmax

// GPU absmax of rows [num_rows, row_len] with stride, starting `elem_offset`
// elements into a device buffer holding `host`, folded into `init`.
float gpu_absmax(const std::vector<bf16>& host, int64_t elem_offset, int64_t num_rows, int64_t row_len,
                 int64_t row_stride, float init) {
  DeviceBuffer<bf16> dx(host);
  DeviceBuffer<float> dout(std::vector<float>{init});
  mcuda::bf16_absmax(dx.get() + elem_offset, num_rows, row_len, row_stride, dout.get());
  const float r = dout.download()[0];
  EXPECT_TRUE(dx.guards_intact() && dout.guards_intact());
  return r;
}

float cpu_absmax(const std::vector<bf16>& host, int64_t elem_offset, int64_t num_rows, int64_t row_len,
                 int64_t row_stride, float init) {
  float r = init;
  cpu::bf16_absmax(host.data() + elem_offset, num_rows, row_len, row_stride, &r);
  return r;
}

// Independent reference: max |x| of the non-NaN values, folded into init.
float naive_absmax(const std::vector<bf16>& host, int64_t elem_offset, int64_t num_rows, int64_t row_len,
                   int64_t row_stride, float init) {
  float m = init;
  for (int64_t r = 0; r < num_rows; ++r)
    for (int64_t i = 0; i < row_len; ++i) {
      const float a = std::fabs(codec::bf16_to_float(host[size_t(elem_offset + r * row_stride + i)]));
      if (a == a && a > m) m = a;
    }
  return m;
}

uint32_t fbits(float x) { return codec::f32_bits(x); }

void expect_absmax_match(const std::vector<bf16>& host, int64_t off, int64_t rows, int64_t len, int64_t stride,
                         float init) {
  SCOPED_TRACE("offset " + std::to_string(off) + ", rows " + std::to_string(rows) + ", row_len " +
               std::to_string(len) + ", row_stride " + std::to_string(stride) + ", init " + std::to_string(init));
  const float g = gpu_absmax(host, off, rows, len, stride, init);
  const float c = cpu_absmax(host, off, rows, len, stride, init);
  const float n = naive_absmax(host, off, rows, len, stride, init);
  EXPECT_EQ(fbits(g), fbits(c)) << "gpu " << g << " cpu " << c;
  EXPECT_EQ(fbits(g), fbits(n)) << "gpu " << g << " naive " << n;
}

TEST(GpuAbsmax, StridedRowsWithNaNsMatchCpu) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 24; ++trial) {
    // Rows like fused-QKV K slices, or arbitrary (unaligned, odd) strides.
    const int64_t rows = 1 + int64_t(rng() % 3000);
    const int64_t len = (trial % 3 == 0) ? 8 * int64_t(1 + rng() % 256) : 1 + int64_t(rng() % 2500);
    const int64_t stride = len + ((trial % 2) ? int64_t(rng() % 77) : 8 * int64_t(rng() % 64));
    const int64_t off = (trial % 4 == 1) ? int64_t(rng() % 8) : 8 * int64_t(rng() % 4);
    std::vector<bf16> x(size_t(off + rows * stride));
    fill_rows(rng, x.data() + off, rows, stride, stride, 64, 0.0);
    // NaNs anywhere, including in the largest-magnitude positions.
    for (int i = 0; i < 20; ++i) x[size_t(rng() % x.size())] = bf16_bits(rng() & 1 ? 0x7fc0 : 0xffff);
    // A large value in the padding between rows must not count.
    if (stride > len) x[size_t(off + (rows - 1) / 2 * stride + len)] = to_bf16(1e6f);
    const float init = (trial % 3 == 0) ? 0.0f : (trial % 3 == 1 ? 5.0f : 1e5f);
    expect_absmax_match(x, off, rows, len, stride, init);
    if (HasFailure()) return;
  }
}

TEST(GpuAbsmax, MaximumAtEveryKindOfPosition) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  // Row ends, unaligned heads and tails (short rows too), the first and the
  // last element: {row_len, row_stride, offset of the first element}.
  const int64_t geometries[][3] = {{203, 211, 3}, {7, 9, 1}, {5, 13, 6}, {30, 37, 5}, {64, 72, 7},
                                   {64, 64, 3}, {100, 128, 0}, {17, 24, 4}, {1, 3, 2}};
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (const auto& geo : geometries) {
    const int64_t len = geo[0], stride = geo[1], off = geo[2], rows = 37;
    std::vector<bf16> base(size_t(off + rows * stride));
    for (auto& v : base) v = to_bf16(u(rng));
    std::vector<int64_t> positions = {0, len - 1, (rows - 1) * stride, (rows - 1) * stride + len - 1};
    for (int64_t i = 0; i < std::min<int64_t>(len, 8); ++i) positions.push_back(5 * stride + i);  // a whole head
    for (int64_t i = 0; i < std::min<int64_t>(len, 8); ++i) positions.push_back(9 * stride + len - 1 - i);  // tail
    for (int i = 0; i < 8; ++i) positions.push_back(int64_t(rng() % rows) * stride + int64_t(rng() % len));
    for (int64_t p : positions) {
      std::vector<bf16> x = base;
      x[size_t(off + p)] = to_bf16(rng() & 1 ? -7.5f : 7.5f);
      expect_absmax_match(x, off, rows, len, stride, 0.0f);
      // The contiguous view of the same buffer (row_stride == row_len).
      expect_absmax_match(x, off, rows, stride, stride, 0.0f);
      if (HasFailure()) return;
    }
  }
}

TEST(GpuAbsmax, SpecialValues) {
  METRALE_SKIP_WITHOUT_GPU();
  std::vector<bf16> x(4096, bf16_bits(0x7fc0));  // all NaN
  expect_absmax_match(x, 0, 1, 4096, 4096, 0.0f);
  expect_absmax_match(x, 0, 64, 64, 64, 2.5f);
  x[1234] = bf16_bits(0xff80);  // -inf
  expect_absmax_match(x, 0, 1, 4096, 4096, 0.0f);
  x[1234] = bf16_bits(0x8000);  // -0
  x[99] = bf16_bits(0x8001);    // negative subnormal
  expect_absmax_match(x, 0, 1, 4096, 4096, 0.0f);
  expect_absmax_match(x, 0, 32, 100, 128, 0.0f);
}

TEST(GpuAbsmax, LargeInputs) {
  METRALE_SKIP_WITHOUT_GPU();
  const uint64_t seed = test_seed();
  SCOPED_TRACE(seed_trace(seed));
  std::mt19937_64 rng(seed);
  // A few million elements, contiguous and strided.
  const int64_t n = (int64_t(6) << 20) + 5;
  std::vector<bf16> x(size_t(n) + 8);
  fill_rows(rng, x.data(), 1, n, n, 128, 0.0);
  for (int i = 0; i < 100; ++i) x[size_t(rng() % x.size())] = bf16_bits(0x7fc0);
  x[size_t(n - 1)] = to_bf16(900.0f);  // the very last element holds the maximum
  expect_absmax_match(x, 0, 1, n, n, 0.0f);
  expect_absmax_match(x, 1, 1, n, n, 0.0f);           // unaligned base
  expect_absmax_match(x, 0, 4096, 1024, 1536, 0.0f);  // K slice of fused rows
  expect_absmax_match(x, 0, n / 1024, 1024, 1024, 3.0f);
  x[size_t(rng() % size_t(n))] = to_bf16(-2e4f);
  expect_absmax_match(x, 0, n / 1024, 1024, 1024, 3.0f);
}

}  // namespace
