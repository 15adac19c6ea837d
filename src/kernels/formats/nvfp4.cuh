// NVFP4: E2M1 codes, one E4M3 scale per kGroupSize (16) elements, per-tensor
// global scale: x = e2m1 * group scale * global scale (metrale/format.hpp;
// interface in format_policy.cuh).
#pragma once

#include "kernels/cache/quantize_fast.cuh"
#include "kernels/formats/format_policy.cuh"

namespace metrale::kernels {

struct Nvfp4Format : FormatPolicy<KvFormat::nvfp4> {
  // An E2M1 code's sign, exponent and mantissa bits, moved into an E4M3
  // byte's sign, low exponent and top mantissa bits, encode code * 2^-6
  // exactly (E2M1's 0.5 lands on an E4M3 subnormal); the hardware E4M3 -> f16
  // conversion then takes two at a time. Code * scale stays exact in f16
  // (at most 5 significant bits, >= 2^-16), so the host multiplies the K
  // and V factors by 2^6, the table's operand_factor.
  static_assert(kDesc.operand_factor == 64.0f, "operands are code * scale * 2^-6");
  static_assert(kGroupSize == codec::kNvfp4GroupSize, "the codec's group");
  using Op = F16Op;
  // E4M3 bytes for the low (resp. high) nibble of each byte of w.
  __device__ __forceinline__ static uint32_t low_nibbles_e4m3(uint32_t w) {
    return ((w & 0x07070707u) << 2) | ((w & 0x08080808u) << 4);
  }
  __device__ __forceinline__ static uint32_t high_nibbles_e4m3(uint32_t w) {
    return ((w >> 2) & 0x1c1c1c1cu) | (w & 0x80808080u);
  }
  // A word of 8 codes unpacks into low-nibble bytes (codes 0, 2, 4, 6) and
  // high-nibble bytes (1, 3, 5, 7) with no byte permute; k-step kk takes
  // half kk%2 of both: slots (r0, r1, r2, r3) = codes 4h + (0, 2, 1, 3) of
  // word kk/2.
  __host__ __device__ static constexpr int k_elem(int kk, int r) {
    return 8 * (kk / 2) + 4 * (kk % 2) + 2 * (r % 2) + r / 2;
  }
  // `scale` is the f16x2 (s, s) of the group holding these elements.
  template <int N>
  __device__ __forceinline__ static void k_pair(const uint32_t (&w)[N], int kk, uint32_t scale, uint32_t& b0,
                                                uint32_t& b1) {
    uint32_t l0, l1, h0, h1;  // identical conversions of the sibling k-step are shared (CSE)
    e4m3x4_to_f16x2x2(low_nibbles_e4m3(w[kk / 2]), l0, l1);
    e4m3x4_to_f16x2x2(high_nibbles_e4m3(w[kk / 2]), h0, h1);
    b0 = hmul2(kk % 2 ? l1 : l0, scale);
    b1 = hmul2(kk % 2 ? h1 : h0, scale);
  }
  // One permute gathers bytes j/2 and j/2+1 of both tokens, (a, b, a', b');
  // their low nibbles are elements (j, j+2) and high nibbles (j+1, j+3).
  // `scales` is the f16x2 (s_a, s_b) of the group holding elements j..j+3.
  template <int N>
  __device__ __forceinline__ static void v_quad(const uint32_t (&wa)[N], const uint32_t (&wb)[N], int j,
                                                uint32_t scales, uint32_t (&r)[4]) {
    const uint32_t k = (j / 2) % 4;  // even: bytes k, k+1 share a word
    const uint32_t x = byte_perm(wa[j / 8], wb[j / 8], k | (k + 4) << 4 | (k + 1) << 8 | (k + 5) << 12);
    uint32_t lo0, lo1, hi0, hi1;
    e4m3x4_to_f16x2x2(low_nibbles_e4m3(x), lo0, lo1);
    e4m3x4_to_f16x2x2(high_nibbles_e4m3(x), hi0, hi1);
    r[0] = hmul2(lo0, scales);  // (a_j, b_j)
    r[1] = hmul2(hi0, scales);  // (a_j+1, b_j+1)
    r[2] = hmul2(lo1, scales);  // (a_j+2, b_j+2)
    r[3] = hmul2(hi1, scales);  // (a_j+3, b_j+3)
  }
  // Two E4M3 scale codes (bits 0-7, 8-15) -> f16x2, exact.
  __device__ __forceinline__ static uint32_t scale_pair(uint32_t codes16) { return e4m3x2_to_f16x2(codes16); }

  // ---- prefill (kernels/prefill): 32 codes of a row (two scale groups,
  // their E4M3 scale codes in bits 0-7 and 8-15 of `scales16`) to four
  // 16-byte units of the f16 operands code * scale * 2^-6 (exact, as for
  // decode); a word's low nibbles then its high nibbles, with no byte
  // permute: unit i holds codes 8i + (0, 2, 4, 6, 1, 3, 5, 7) ----
  __host__ __device__ static constexpr int prefill_unit_elem(int p) { return p < 4 ? 2 * p : 2 * p - 7; }
  __device__ __forceinline__ static void unpack32(const uint4 codes, uint32_t scales16, uint4 (&out)[4]) {
    const uint32_t s = scale_pair(scales16);
    const uint32_t w[4] = {codes.x, codes.y, codes.z, codes.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t sc = f16x2_broadcast(s, i >= 2);  // words 0-1: group 0, words 2-3: group 1
      uint32_t a0, a1, b0, b1;  // (codes 0, 2), (4, 6) of the word; (1, 3), (5, 7)
      e4m3x4_to_f16x2x2(low_nibbles_e4m3(w[i]), a0, a1);
      e4m3x4_to_f16x2x2(high_nibbles_e4m3(w[i]), b0, b1);
      out[i] = make_uint4(hmul2(a0, sc), hmul2(a1, sc), hmul2(b0, sc), hmul2(b1, sc));
    }
  }

  // ---- cache write: 32 elements = two scale groups, quantized independently
  // (ILP; four 16-byte loads, one 16-byte store of packed codes, one 2-byte
  // store of the two E4M3 scales) through fastq::nvfp4_quantize_groups ----
  static constexpr int kWriteElems = 2 * kGroupSize;
  struct WriteChunk {
    uint4 v[4];
  };
  __device__ static WriteChunk load_chunk(const bf16* src) {
    const uint4* p = reinterpret_cast<const uint4*>(src);
    return {{__ldg(p), __ldg(p + 1), __ldg(p + 2), __ldg(p + 3)}};
  }
  // 16 bytes of codes at (row*D + 32*chunk)/2 and 2 scale bytes at
  // row*D/16 + 2*chunk: aligned, as D is a multiple of 32 and the page
  // stride, data section and cache base are multiples of 16 (validated).
  // Returns the groups that may hold a saturated element (bit g: group g's
  // scale code is 448 or NaN, codec::e4m3_code_may_saturate); chunk_saturated
  // then counts them.
  __device__ static uint32_t store_chunk(const WriteChunk& c, uint8_t* page, int64_t row, int32_t chunk, int32_t D,
                                         int64_t data_section, float global_scale) {
    const uint32_t w[16] = {c.v[0].x, c.v[0].y, c.v[0].z, c.v[0].w, c.v[1].x, c.v[1].y, c.v[1].z, c.v[1].w,
                            c.v[2].x, c.v[2].y, c.v[2].z, c.v[2].w, c.v[3].x, c.v[3].y, c.v[3].z, c.v[3].w};
    uint32_t packed[4];
    uint8_t s[2];
    cuda::fastq::nvfp4_quantize_groups<2>(w, global_scale, packed, s);
    *reinterpret_cast<uint4*>(page + ((row * D) >> 1) + chunk * 16) =
        make_uint4(packed[0], packed[1], packed[2], packed[3]);
    *reinterpret_cast<uint16_t*>(page + data_section + row * (D >> 4) + chunk * 2) = uint16_t(s[0] | (s[1] << 8));
    return may_saturate(s);
  }
  __device__ __forceinline__ static uint32_t may_saturate(const uint8_t (&s)[2]) {
    return uint32_t(codec::e4m3_code_may_saturate(s[0])) | uint32_t(codec::e4m3_code_may_saturate(s[1])) << 1;
  }
  // The saturated elements (codec::nvfp4_saturates) of the groups `may`
  // names of the chunk at src, read again (the rare path: the common one
  // keeps no values live for it).
  __device__ static uint32_t chunk_saturated(const bf16* src, uint32_t may, float global_scale) {
    const float six_g = 6.0f * global_scale;  // the codec's f32 product
    const uint4* p = reinterpret_cast<const uint4*>(src);
    uint32_t n = 0;
    for (int g = 0; g < 2; ++g) {
      if (!(may >> g & 1u)) continue;
      const uint4 a = __ldg(p + 2 * g), b = __ldg(p + 2 * g + 1);
      const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      n += cuda::fastq::nvfp4_group_saturated(w, six_g);
    }
    return n;
  }
  static float write_param(float global_scale) { return global_scale; }
};

}  // namespace metrale::kernels
