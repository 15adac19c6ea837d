// Warp-level tensor-core MMAs (mma.sync, sm_80+) and the packed conversions
// the decode kernel feeds them with. Fragment layouts are PTX ISA's
// "Matrix Fragments for mma.m16n8k16": with g = lane/4, c = lane%4,
//   A (16x16, row): a0a1 (row g, k 2c..2c+1), a2a3 (row g+8, same k),
//                   a4a5 (row g, k 2c+8..), a6a7 (row g+8, k 2c+8..)
//   B (16x8, col):  b0b1 (k 2c..2c+1, col g), b2b3 (k 2c+8.., col g)
//   C (16x8, f32):  c0 c1 (row g, cols 2c, 2c+1), c2 c3 (row g+8, same cols)
// Packed to 16 bits, each 8x8 half of C is a row-per-4-lanes matrix whose
// transpose (movmatrix) is the matching half of a B fragment.
#pragma once

#include <cstdint>

namespace metrale::kernels {

struct Bf16Op {};  // operands are bfloat16
struct F16Op {};   // operands are float16

template <class Op>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);

template <>
__device__ __forceinline__ void mma_16816<Bf16Op>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<F16Op>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Transposes an 8x8 matrix of 16-bit values held one row per 4 lanes (lane
// l: row l/4, columns 2(l%4), 2(l%4)+1): afterwards lane l holds row l/4 of
// the transpose. Turns a C fragment's (row, column) pairs into a B fragment.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(x));
  return r;
}

// Two f32 -> packed pair (lo in bits 0-15), round to nearest even.
template <class Op>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<Bf16Op>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <>
__device__ __forceinline__ uint32_t pack2<F16Op>(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// Four E4M3 codes to two f16x2, exact: bytes 0-1 -> lo (byte 0 in the low
// half), bytes 2-3 -> hi. Splitting the register into halves is free.
__device__ __forceinline__ void e4m3x4_to_f16x2x2(uint32_t codes, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(codes));
}

// Two E4M3 codes (bits 0-7 -> low half, 8-15 -> high half) to f16x2, exact.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t codes16) {
  uint32_t r;
  asm("{\n .reg .b16 t;\n cvt.u16.u32 t, %1;\n cvt.rn.f16x2.e4m3x2 %0, t;\n}\n" : "=r"(r) : "r"(codes16));
  return r;
}

__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
}

// (x.lo, x.lo) or (x.hi, x.hi) of an f16x2: ptxas folds it into the
// operand selector of the HMUL2 that consumes it.
__device__ __forceinline__ uint32_t f16x2_broadcast(uint32_t x, bool hi) {
  uint32_t r;
  if (hi)
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n mov.b32 %0, {h, h};\n}\n" : "=r"(r) : "r"(x));
  else
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n mov.b32 %0, {l, l};\n}\n" : "=r"(r) : "r"(x));
  return r;
}

__device__ __forceinline__ uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) { return __byte_perm(a, b, sel); }

__device__ __forceinline__ float fast_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

}  // namespace metrale::kernels
