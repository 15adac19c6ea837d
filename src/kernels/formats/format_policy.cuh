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
    b0 = e4m3x2_to_f16x2(w[kk] & 0xffffu);
    b1 = e4m3x2_to_f16x2(w[kk] >> 16);
  }
  template <int N>
  __device__ __forceinline__ static void v_pair(const uint32_t (&wa)[N], const uint32_t (&wb)[N], int j, uint32_t,
                                                uint32_t& r0, uint32_t& r1) {
    const int k = j % 4;  // byte of the word holding element j
    const uint32_t sel = uint32_t(k) | uint32_t(k + 4) << 4 | uint32_t(k + 1) << 8 | uint32_t(k + 5) << 12;
    const uint32_t t = byte_perm(wa[j / 4], wb[j / 4], sel);
    r0 = e4m3x2_to_f16x2(t & 0xffffu);
    r1 = e4m3x2_to_f16x2(t >> 16);
  }
};

struct Nvfp4Format {
  static constexpr int kBits = 4;
  static constexpr bool kScaled = true;
  // Codes become f16 code*2^-14 and scales f16 scale*2^7 (both exact), so
  // operands carry 2^-7: the kernel multiplies K and V factors by 2^7.
  static constexpr float kOperandFactor = 128.0f;
  using Op = F16Op;
  // `scale` is the f16x2 (s, s) * 2^7 of the group holding these elements.
  template <int N>
  __device__ __forceinline__ static void k_pair(const uint32_t (&w)[N], int kk, uint32_t scale, uint32_t& b0,
                                                uint32_t& b1) {
    const uint32_t word = w[kk / 2];
    const int byte = 2 * (kk % 2);
    // Low nibble of byte -> half 0, high nibble -> half 1.
    const uint32_t t0 = byte_perm(word, word >> 4, uint32_t(byte) | uint32_t(byte + 4) << 8);
    const uint32_t t1 = byte_perm(word, word >> 4, uint32_t(byte + 1) | uint32_t(byte + 5) << 8);
    b0 = hmul2(e2m1x2_to_f16x2_scaled(t0), scale);
    b1 = hmul2(e2m1x2_to_f16x2_scaled(t1), scale);
  }
  // `scales` is the f16x2 (s_a, s_b) * 2^7 of the group holding element j.
  template <int N>
  __device__ __forceinline__ static void v_pair(const uint32_t (&wa)[N], const uint32_t (&wb)[N], int j,
                                                uint32_t scales, uint32_t& r0, uint32_t& r1) {
    const int k = (j / 2) % 4;  // byte holding elements j (low nibble) and j+1 (high nibble)
    const uint32_t t = byte_perm(wa[j / 8], wb[j / 8], uint32_t(k) | uint32_t(k + 4) << 8);
    r0 = hmul2(e2m1x2_to_f16x2_scaled(t), scales);
    r1 = hmul2(e2m1x2_to_f16x2_scaled(t >> 4), scales);
  }
  // Two E4M3 scale codes (bits 0-7, 8-15) -> f16x2 scale * 2^7.
  __device__ __forceinline__ static uint32_t scale_pair(uint32_t codes16) {
    return hmul2(e4m3x2_to_f16x2(codes16), 0x58005800u);  // f16 128.0 = 0x5800
  }
};

}  // namespace metrale::kernels
