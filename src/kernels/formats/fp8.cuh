// FP8 E4M3 with a per-tensor scale: x = code * scale (metrale/format.hpp;
// interface in format_policy.cuh).
#pragma once

#include "kernels/cache/quantize_fast.cuh"
#include "kernels/formats/format_policy.cuh"

namespace metrale::kernels {

struct Fp8Format : FormatPolicy<KvFormat::fp8_e4m3>, VQuadByPairs<Fp8Format> {
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

  // ---- prefill (kernels/prefill): 16 codes of a row, in order, to the
  // 16 f16 operands the tensor cores read from shared memory (exact) ----
  __device__ __forceinline__ static void unpack16(const uint4 codes, uint4 (&out)[2]) {
    e4m3x4_to_f16x2x2(codes.x, out[0].x, out[0].y);
    e4m3x4_to_f16x2x2(codes.y, out[0].z, out[0].w);
    e4m3x4_to_f16x2x2(codes.z, out[1].x, out[1].y);
    e4m3x4_to_f16x2x2(codes.w, out[1].z, out[1].w);
  }

  // ---- cache write: 16 elements (two 16-byte loads, one 16-byte store);
  // code = e4m3_rne_satfinite(x * inv_scale) by the hardware conversion
  // (quantize_fast.cuh) ----
  static constexpr int kWriteElems = 16;
  struct WriteChunk {
    uint4 v[2];
  };
  __device__ static WriteChunk load_chunk(const bf16* src) {
    const uint4* p = reinterpret_cast<const uint4*>(src);
    return {{__ldg(p), __ldg(p + 1)}};
  }
  // Returns non-zero when the chunk may hold a saturated element: one of its
  // codes is 448 or NaN (codec::e4m3_code_may_saturate, one packed test per
  // word); chunk_saturated then counts them.
  __device__ static uint32_t store_chunk(const WriteChunk& c, uint8_t* page, int64_t row, int32_t chunk, int32_t D,
                                         int64_t /*data_section*/, float inv_scale) {
    float x[16];
    unpack8(c.v[0], x);
    unpack8(c.v[1], x + 8);
    // The product is rounded to f32 first, exactly as the reference does.
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      w[i] = cuda::fastq::e4m3x4_rne_satfinite(x[4 * i] * inv_scale, x[4 * i + 1] * inv_scale,
                                               x[4 * i + 2] * inv_scale, x[4 * i + 3] * inv_scale);
    *reinterpret_cast<uint4*>(page + row * D + chunk * 16) = make_uint4(w[0], w[1], w[2], w[3]);
    return uint32_t(cuda::fastq::e4m3x4_may_saturate(w[0]) | cuda::fastq::e4m3x4_may_saturate(w[1]) |
                    cuda::fastq::e4m3x4_may_saturate(w[2]) | cuda::fastq::e4m3x4_may_saturate(w[3]));
  }
  // The saturated elements (codec::fp8_saturates) of the chunk at src, read
  // again (the rare path: the common one keeps no values live for it).
  __device__ static uint32_t chunk_saturated(const bf16* src, uint32_t /*may*/, float inv_scale) {
    const WriteChunk c = load_chunk(src);
    float x[16];
    unpack8(c.v[0], x);
    unpack8(c.v[1], x + 8);
    uint32_t n = 0;
#pragma unroll
    for (int i = 0; i < 16; ++i) n += codec::fp8_saturates(x[i], inv_scale);
    return n;
  }
  // inv_scale = 1.0f / scale, once, in f32 (docs/spec.md 2).
  static float write_param(float scale) { return 1.0f / scale; }
};

}  // namespace metrale::kernels
