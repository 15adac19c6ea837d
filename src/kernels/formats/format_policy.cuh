// KV formats as compile-time policies of the decode kernel.
//
// A policy says how one thread turns the raw bytes it loaded for a token into
// tensor-core operands. The decode kernel is written once against this
// interface and never branches on the format:
//   kBits                 bits per element of the cache rows
//   Op                    MMA operand type (Bf16Op, F16Op)
//   kScaled               rows carry E4M3 group scales (NVFP4)
//   k_pair(words, kk, s)  the two B-fragment registers of QK k-step kk
//   v_pair(...)           two PV B-fragment registers (n-tiles j, j+1)
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

struct Bf16Format {
  static constexpr int kBits = 16;
  static constexpr bool kScaled = false;
  static constexpr float kOperandFactor = 1.0f;
  using Op = Bf16Op;
  // Elements 4kk..4kk+3 of the thread's K stream are words 2kk, 2kk+1.
  template <int N>
  __device__ __forceinline__ static void k_pair(const uint32_t (&w)[N], int kk, uint32_t /*scale*/, uint32_t& b0,
                                                uint32_t& b1) {
    b0 = w[2 * kk];
    b1 = w[2 * kk + 1];
  }
  // Elements j, j+1 (j even) of the V streams of tokens a and b, as the
  // (a, b) pairs of n-tiles j and j+1.
  template <int N>
  __device__ __forceinline__ static void v_pair(const uint32_t (&wa)[N], const uint32_t (&wb)[N], int j,
                                                uint32_t /*scales*/, uint32_t& r0, uint32_t& r1) {
    r0 = byte_perm(wa[j / 2], wb[j / 2], 0x5410);
    r1 = byte_perm(wa[j / 2], wb[j / 2], 0x7632);
  }
};

struct Fp8Format {
  static constexpr int kBits = 8;
  static constexpr bool kScaled = false;
  static constexpr float kOperandFactor = 1.0f;
  using Op = F16Op;
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
  // `scale` is the f16x2 (s, s) of the group holding these elements.
  template <int N>
  __device__ __forceinline__ static void k_pair(const uint32_t (&w)[N], int kk, uint32_t scale, uint32_t& b0,
                                                uint32_t& b1) {
    const uint32_t word = w[kk / 2];
    const uint32_t byte = 2 * (kk % 2);  // elements 4kk..4kk+3 = nibbles of bytes byte, byte+1
    const uint32_t t = byte_perm(low_nibbles_e4m3(word), high_nibbles_e4m3(word),
                                 byte | (byte + 4) << 4 | (byte + 1) << 8 | (byte + 5) << 12);
    e4m3x4_to_f16x2x2(t, b0, b1);
    b0 = hmul2(b0, scale);
    b1 = hmul2(b1, scale);
  }
  // `scales` is the f16x2 (s_a, s_b) of the group holding element j.
  template <int N>
  __device__ __forceinline__ static void v_pair(const uint32_t (&wa)[N], const uint32_t (&wb)[N], int j,
                                                uint32_t scales, uint32_t& r0, uint32_t& r1) {
    const uint32_t k = (j / 2) % 4;  // byte holding elements j (low nibble) and j+1 (high nibble)
    // One permute gathers (a_j, b_j, a_j+1, b_j+1) as E4M3 bytes.
    const uint32_t wa_ = wa[j / 8], wb_ = wb[j / 8];
    const uint32_t lo = byte_perm(low_nibbles_e4m3(wa_), low_nibbles_e4m3(wb_), k | (k + 4) << 4);
    const uint32_t hi = byte_perm(high_nibbles_e4m3(wa_), high_nibbles_e4m3(wb_), k | (k + 4) << 4);
    e4m3x4_to_f16x2x2(byte_perm(lo, hi, 0x5410), r0, r1);
    r0 = hmul2(r0, scales);
    r1 = hmul2(r1, scales);
  }
  // Two E4M3 scale codes (bits 0-7, 8-15) -> f16x2, exact.
  __device__ __forceinline__ static uint32_t scale_pair(uint32_t codes16) { return e4m3x2_to_f16x2(codes16); }
};

}  // namespace metrale::kernels
