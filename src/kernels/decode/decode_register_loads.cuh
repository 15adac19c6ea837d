// The register load pipeline of the decode kernel: each thread loads its
// share of a group of steps straight from global memory into StepBuffers
// (the patterns of decode_kernel.cuh's header), kStages groups in flight.
// NVFP4 always takes it; bf16 and fp8 where the plan says `registers`.
//
// Interface shared with TmaLoads: construct, run(compute) calls compute(b)
// once per step group in order, then bad_page says whether a corrupt page id
// was seen.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/vector_loads.cuh"
#include "kernels/decode/decode_config.cuh"
#include "kernels/decode/decode_steps.cuh"

namespace metrale::kernels {

template <class Cfg>
struct RegisterLoads {
  using Fmt = typename Cfg::Format;
  static constexpr int D = Cfg::kD;
  static constexpr int U = Cfg::kUnroll;
  static constexpr int kKScalesPerVec = Cfg::kKElemsPerVec / Fmt::kGroupSize;

  const DecodeParams& p;
  SplitSteps<Cfg>& steps;
  int g, c;
  bool bad_page = false;
  // Per-thread byte offsets from the start of a step's 16 tokens in a page
  // (see the header for the patterns), computed once: per step only the
  // page's 64-bit base changes.
  int32_t row_stride;  // bytes between tokens of a page
  int32_t head_off;
  // NVFP4 (instruction-bound) holds them in registers; the wider formats'
  // register path (their fallback) has no registers to spare and recomputes.
  int32_t k_off[2], v_off[4];
  // Scale section (NVFP4): byte (t*H + h)*D/G + group of a page's section, G = Fmt::kGroupSize.
  // K: the scale bytes of vector i*4 + c (kKScalesPerVec of them, adjacent);
  // V: those of the thread's eighth row (vector g: group g*kVScalesPerVec,
  // or g/2 where a group spans two eighth rows).
  int32_t srow;
  int32_t ks_off[2], vs_off[4];

  __device__ __forceinline__ int32_t k_offset(int t) const {
    return head_off + (g + 8 * t) * row_stride + c * Cfg::kKVecBytes;
  }
  __device__ __forceinline__ int32_t v_offset(int t) const {
    return head_off + (2 * c + Cfg::vtok(t)) * row_stride + g * Cfg::kVVecBytes;
  }

  // part: the warp's half of head_dim (DecodeConfig's HP; 0 for whole rows).
  __device__ __forceinline__ RegisterLoads(const DecodeParams& p_, SplitSteps<Cfg>& steps_, int kv_head, int part,
                                           int g_, int c_)
      : p(p_), steps(steps_), g(g_), c(c_) {
    row_stride = p.num_kv_heads * Cfg::kRowBytes;
    head_off = kv_head * Cfg::kRowBytes + part * Cfg::kPartBytes;
#pragma unroll
    for (int t = 0; t < 2; ++t) k_off[t] = k_offset(t);
#pragma unroll
    for (int t = 0; t < 4; ++t) v_off[t] = v_offset(t);
    srow = p.num_kv_heads * (D / Fmt::kGroupSize);
    const int32_t scale_head =
        int32_t(p.scale_offset) + kv_head * (D / Fmt::kGroupSize) + part * (Cfg::kPartD / Fmt::kGroupSize);
    const int v_grp = Cfg::kVElemsPerVec >= Fmt::kGroupSize ? g * Cfg::kVScalesPerVec : g / 2;
#pragma unroll
    for (int t = 0; t < 2; ++t) ks_off[t] = scale_head + (g + 8 * t) * srow + c * kKScalesPerVec;
#pragma unroll
    for (int t = 0; t < 4; ++t) vs_off[t] = scale_head + (2 * c + Cfg::vtok(t)) * srow + v_grp;
    // NVFP4 keeps them: in the runs kernel ptxas recomputed them at every
    // step group instead (their IMADs, and SHFs for the 64-bit address:
    // about 3% of the head_dim-128 loop's instructions), though it had the
    // registers.
    if constexpr (Fmt::kScaled) {
#pragma unroll
      for (int t = 0; t < 2; ++t) k_off[t] = pinned(k_off[t]), ks_off[t] = pinned(ks_off[t]);
#pragma unroll
      for (int t = 0; t < 4; ++t) v_off[t] = pinned(v_off[t]), vs_off[t] = pinned(vs_off[t]);
    }
  }
  // The value through an instruction ptxas cannot see through: it keeps
  // the result in a register rather than recomputing it where it is used.
  static __device__ __forceinline__ int32_t pinned(int32_t x) {
    int32_t y;
    asm volatile("prmt.b32 %0, %1, 0, 0x3210;" : "=r"(y) : "r"(x));
    return y;
  }

  // Issues the loads of the warp's step group k (steps st0 .. st0+U-1) into
  // `b`. Steps past the split or on a corrupt page load nothing. The wider
  // formats zero such a step's words (first, for every step: the words are
  // then dead before the loads); NVFP4's keep what the buffer held (zero,
  // or an earlier group's cache bytes), which compute() never lets reach a
  // result (the step's logits are selected to -inf, its V words to 0): no
  // zeroing per step (its stores were 2% of the loop's instructions).
  __device__ __forceinline__ void load(StepBuffers<Cfg>& b, int k) {
    const int st0 = steps.first_step(k);
    int32_t pg[U];
    steps.group_pages(k, pg);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int st = st0 + u;
      const int32_t page = pg[u];
      const bool page_ok = page >= 0 && page < p.num_blocks;
      bad_page |= !page_ok;  // corrupt table: never dereference, poison the output
      const bool live = st < steps.total_steps && page_ok;
      if (u == 0) b.st0 = st0, b.live = 0;
      b.live |= uint32_t(live) << u;
      if constexpr (!Fmt::kScaled) {
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
          for (int w = 0; w < Cfg::kKWords; ++w) b.kw[u][t][w] = 0;
#pragma unroll
        for (int t = 0; t < 4; ++t)
#pragma unroll
          for (int w = 0; w < Cfg::kVWords; ++w) b.vw[u][t][w] = 0;
      }
      if (!live) continue;  // nothing to load; compute() masks the whole step
      const Offset tok0 = Offset(steps.token0(st));
      const int64_t page_off = int64_t(page) * p.page_stride;
      const uint8_t* kp = p.k_cache + page_off + tok0 * Offset(row_stride);
      const uint8_t* vp = p.v_cache + page_off + tok0 * Offset(row_stride);
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int i = 0; i < Cfg::kKVecs; ++i)
          load_vec<Cfg::kKVecBytes>(Fmt::kScaled ? kp + Offset(k_off[t] + i * 4 * Cfg::kKVecBytes)
                                                 : kp + k_offset(t) + i * 4 * Cfg::kKVecBytes,
                                    &b.kw[u][t][i * Cfg::kKVecBytes / 4]);
#pragma unroll
      for (int t = 0; t < 4; ++t)
#pragma unroll
        for (int i = 0; i < Cfg::kVVecs; ++i)
          load_vec<Cfg::kVVecBytes>(Fmt::kScaled ? vp + Offset(v_off[t] + i * 8 * Cfg::kVVecBytes)
                                                 : vp + v_offset(t) + i * 8 * Cfg::kVVecBytes,
                                    &b.vw[u][t][i * Cfg::kVVecBytes / 4]);
      if constexpr (Fmt::kScaled) {
        const uint8_t* ksp = p.k_cache + page_off + tok0 * Offset(srow);
        const uint8_t* vsp = p.v_cache + page_off + tok0 * Offset(srow);
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          b.ks[u][t] = 0;
#pragma unroll
          for (int i = 0; i < Cfg::kKVecs; ++i)
            b.ks[u][t] |= load_bytes<kKScalesPerVec>(ksp + Offset(ks_off[t] + i * 4 * kKScalesPerVec))
                          << (8 * i * kKScalesPerVec);
        }
#pragma unroll
        for (int t = 0; t < 4; ++t) b.vs[u][t] = load_bytes<Cfg::kVScaleBytes>(vsp + Offset(vs_off[t]));
      }
    }
  }

  // Offsets inside a page: NVFP4 adds them unsigned, an IADD3 and an IMAD.X
  // per load (signed, ptxas added base, page and offset in two three-input
  // IADD3 per load and held every offset as 64 bits); the wider formats'
  // register path (a fallback) keeps them signed, with which it spills less.
  using Offset = std::conditional_t<Fmt::kScaled, uint32_t, int32_t>;

  // The pipeline: stage k's buffer is computed while the loads of the
  // kStages-1 following step groups are in flight. The stage loop is
  // unrolled so that every buffer index is static (registers, not local
  // memory).
  template <class Compute>
  __device__ __forceinline__ void run(Compute&& compute) {
    constexpr int S = Cfg::kStages;
    StepBuffers<Cfg> buf[S];
    if constexpr (Fmt::kScaled) {  // the buffers' state before their first group (load)
#pragma unroll
      for (int k = 0; k < S; ++k) buf[k] = {};
    }
#pragma unroll
    for (int k = 0; k + 1 < S; ++k) load(buf[k], k);
    int k0 = 0;  // group held by buf[0]
    bool more = steps.has_group(0);
    while (more) {
#pragma unroll
      for (int k = 0; k < S; ++k) {
        if (more) {
          load(buf[(k + S - 1) % S], k0 + k + S - 1);
          compute(buf[k]);
          more = steps.has_group(k0 + k + 1);
        }
      }
      k0 += S;
    }
  }
};

}  // namespace metrale::kernels
