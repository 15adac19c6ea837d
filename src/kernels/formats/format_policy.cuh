// KV formats as compile-time policies, one header per format (bf16.cuh,
// fp8.cuh, nvfp4.cuh), each serving both the decode kernel and the cache
// write; this header is what they share. A policy takes its numbers (code
// bits, scale group) from its entry of the host table metrale/format.hpp, so
// a format is described once on each side.
//
// Decode part: how one thread turns the raw bytes it loaded for a token into
// tensor-core operands. The decode kernel is written once against this
// interface and never branches on the format:
//   kBits                 bits per element of the cache rows
//   kScaled, kGroupSize   rows carry E4M3 group scales, one per kGroupSize
//                         elements (unscaled formats: 1, never read for a scale)
//   scale_pair(codes16)   scaled formats: two scale codes -> f16x2
//   Op                    MMA operand type (Bf16Op, F16Op)
//   k_elem(kk, r)         which element of a thread's K stream fragment slot
//                         r (0-1: first register, 2-3: second) of QK k-step
//                         kk holds; Q is loaded in the same order
//   k_pair(words, kk, s)  the two A-fragment registers of QK k-step kk for one
//                         token
//   v_quad(wa, wb, j, s)  PV A-fragment registers of a token pair (a, b):
//                         elements j, j+1 (one tile) and j+2, j+3 (the next)
// The host folds the table's operand_factor (the power of two the operands
// carry) with the per-tensor scale into the kernel's factors.
//
// Cache-write part (kernels/cache/reshape_and_cache.cu): a thread quantizes
// one chunk of kWriteElems consecutive elements of a (token, kv head) row:
//   WriteChunk, load_chunk(src)   the bf16 source bytes of a chunk
//   store_chunk(c, page, row, chunk, D, data_section, param)
//                                 codes (and scales) of the chunk into row
//                                 (t*H + h) of a page, bit-identical to the
//                                 CPU codec (src/cpu/kv_rows.hpp); returns
//                                 non-zero where the chunk may hold
//                                 saturated elements (its codes or scales)
//   chunk_saturated(src, may, param)
//                                 counts them (the rule of metrale/codec.hpp),
//                                 reading the chunk at src again: rare, so
//                                 the common path keeps nothing live for it
//   kSaturates                    whether a format can saturate at all
//   write_param(tensor_scale)     host: the `param` of store_chunk
//
// Addressing (why the permutations): the dot product over head_dim and the
// output columns are order-free, so each thread loads whole 16-byte vectors
// of a token row and the kernel assigns head_dim positions to fragment slots
// to match, instead of gathering 2-byte elements. See decode_kernel.cuh.
#pragma once

#include <cstdint>

#include "kernels/common/mma.cuh"
#include "metrale/codec.hpp"
#include "metrale/format.hpp"

namespace metrale::kernels {

// The numbers of format F's table entry.
template <KvFormat F>
struct FormatPolicy {
  static constexpr KvFormatDesc kDesc = kKvFormats[int(F)];
  static constexpr int kBits = kDesc.code_bits;
  static constexpr bool kScaled = kDesc.group_size > 0;
  static constexpr int kGroupSize = kScaled ? kDesc.group_size : 1;
  // A format with a calibrated range (a per-tensor scale) can saturate.
  static constexpr bool kSaturates = kDesc.calibration_max > 0.0f;
  // The prefill kernel's tiles (kernels/prefill): which element of a 16-byte
  // unit (8 consecutive elements of head_dim) position p of the unit holds
  // in shared memory. The products sum over head_dim (QK) or keep it as the
  // output's columns (PV), so an order that saves the dequantising producer
  // its byte permutes is free if Q's units are stored in the same order and
  // the epilogue puts the output's columns back. In order unless a format says.
  __host__ __device__ static constexpr int prefill_unit_elem(int p) { return p; }
};

// Whether Fmt's prefill units hold their elements in order (the epilogue
// then writes each accumulator pair as it is).
template <class Fmt>
__host__ __device__ constexpr bool prefill_units_in_order() {
  for (int p = 0; p < 8; ++p)
    if (Fmt::prefill_unit_elem(p) != p) return false;
  return true;
}

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

// Unpacks 8 bf16 (one 16-byte word) into f32; exact.
__device__ __forceinline__ void unpack8(const uint4 v, float* out) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = codec::f32_from_bits(w[i] << 16);
    out[2 * i + 1] = codec::f32_from_bits(w[i] & 0xffff0000u);
  }
}

}  // namespace metrale::kernels
