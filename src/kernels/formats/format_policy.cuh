// KV formats as compile-time policies of the decode kernel.
//
// A policy says how one thread turns the raw bytes it loaded for a token into
// tensor-core operands. The decode kernel is written once against this
// interface and never branches on the format:
//   kBits                 bits per element of the cache rows
//   Op                    MMA operand type (Bf16Op, F16Op)
//   kScaled               rows carry E4M3 group scales (NVFP4)
//   k_elem(kk, r)         which element of a thread's K stream fragment slot
//                         r (0-1: first register, 2-3: second) of QK k-step
//                         kk holds; Q is loaded in the same order
//   k_pair(words, kk, s)  the two A-fragment registers of QK k-step kk for one
//                         token
//   v_quad(wa, wb, j, s)  PV A-fragment registers of a token pair (a, b):
//                         elements j, j+1 (one tile) and j+2, j+3 (the next)
//   kOperandFactor        power of two the operands were shifted by
//
// Addressing (why the permutations): the dot product over head_dim and the
// output columns are order-free, so each thread loads whole 16-byte vectors
// of a token row and the kernel assigns head_dim positions to fragment slots
// to match, instead of gathering 2-byte elements. See decode_kernel.cuh.
#pragma once

#include <cstdint>

#include "kernels/common/mma.cuh"

namespace metrale::kernels {

// The unscaled formats convert V one tile (an element pair) at a time:
// their v_quad is two v_pair calls.
template <class Fmt>
struct VQuadByPairs {
  template <int N>
  __device__ __forceinline__ static void v_quad(const uint32_t (&wa)[N], const uint32_t (&wb)[N], int j,
                                                uint32_t scales, uint32_t (&r)[4]) {
    Fmt::v_pair(wa, wb, j, scales, r[0], r[1]);
    Fmt::v_pair(wa, wb, j + 2, scales, r[2], r[3]);
  }
};

struct Bf16Format : VQuadByPairs<Bf16Format> {
  static constexpr int kBits = 16;
  static constexpr bool kScaled = false;
  static constexpr float kOperandFactor = 1.0f;
  using Op = Bf16Op;
  __host__ __device__ static constexpr int k_elem(int kk, int r) { return 4 * kk + r; }
  // Elements 4kk..4kk+3 of the thread's K stream are words 2kk, 2kk+1.
  template <int N>
  __device__ __forceinline__ static void k_pair(const uint32_t (&w)[N], int kk, uint32_t /*scale*/, uint32_t& b0,
                                                uint32_t& b1) {
    b0 = w[2 * kk];
    b1 = w[2 * kk + 1];
  }
  // Elements j, j+1 (j even) of the V streams of tokens a and b, as (a, b)
  // pairs: rows g and g+8 of PV tile j/2.
  template <int N>
  __device__ __forceinline__ static void v_pair(const uint32_t (&wa)[N], const uint32_t (&wb)[N], int j,
                                                uint32_t /*scales*/, uint32_t& r0, uint32_t& r1) {
    r0 = byte_perm(wa[j / 2], wb[j / 2], 0x5410);
    r1 = byte_perm(wa[j / 2], wb[j / 2], 0x7632);
  }
};

struct Fp8Format : VQuadByPairs<Fp8Format> {
  static constexpr int kBits = 8;
  static constexpr bool kScaled = false;
  static constexpr float kOperandFactor = 1.0f;
  using Op = F16Op;
  __host__ __device__ static constexpr int k_elem(int kk, int r) { return 4 * kk + r; }
  template <int N>
  __device__ __forceinline__ static void k_pair(const uint32_t (&w)[N], int kk, uint32_t, uint32_t& b0,
                                                uint32_t& b1) {
    e4m3x4_to_f16x2x2(w[kk], b0, b1);
  }
  template <int N>
  __device__ __forceinline__ static void v_pair(const uint32_t (&wa)[N], const uint32_t (&wb)[N], int j, uint32_t,
                                                uint32_t& r0, uint32_t& r1) {
    const int k = j % 4;  // byte of the word holding element j
    const uint32_t sel = uint32_t(k) | uint32_t(k + 4) << 4 | uint32_t(k + 1) << 8 | uint32_t(k + 5) << 12;
    e4m3x4_to_f16x2x2(byte_perm(wa[j / 4], wb[j / 4], sel), r0, r1);
  }
};

struct Nvfp4Format {
  static constexpr int kBits = 4;
  static constexpr bool kScaled = true;
  // An E2M1 code's sign, exponent and mantissa bits, moved into an E4M3
  // byte's sign, low exponent and top mantissa bits, encode code * 2^-6
  // exactly (E2M1's 0.5 lands on an E4M3 subnormal); the hardware E4M3 -> f16
  // conversion then takes two at a time. Code * scale stays exact in f16
  // (at most 5 significant bits, >= 2^-16), so the kernel multiplies the K
  // and V factors by 2^6.
  static constexpr float kOperandFactor = 64.0f;
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
};

}  // namespace metrale::kernels
