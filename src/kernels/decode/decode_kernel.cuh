// Paged decode attention, written once against a KV-format policy
// (kernels/formats/format_policy.cuh), for single pass and split-K.
//
// Work decomposition: one CTA per (sequence, kv head, tile of 16 q heads,
// split), so the q heads that share a kv head are served by ONE read of that
// head's cache: the GQA group is the M dimension of the tensor-core MMAs
// (rows beyond the group are zero and never stored). The CTA's 4 warps take
// groups of kUnroll consecutive 8-token steps of the split's pages
// round-robin, loading the next group into a second register stage while
// computing the current one; each warp keeps its own online-softmax state
// and output accumulator in registers, with no barrier in the main loop,
// and the warps merge through shared memory at the end.
//
// Per 8-token step a warp computes S = Q K^T (m16n8k16: M = 16 q heads,
// N = 8 tokens, K = head_dim) and O += P V (m16n8k8: K = the 8 tokens). The
// C fragment of S is exactly the A fragment of P, so softmax weights never
// leave registers. Every thread loads whole 16-byte vectors of token rows
// straight from global memory (shared-memory staging with per-lane cp.async
// was measured slower, bench/RESULTS.md v3):
//   K: thread (g = lane/4, c = lane%4) loads token g of the step, vectors
//      i*4 + c of its row; head_dim position d feeds QK k-step kk through the
//      permutation d = (i*4 + c)*EK + 4h + r (EK elements per vector,
//      kk = i*EK/4 + h), applied to Q as well.
//   V: thread (g, c) loads tokens 2c and 2c+1 of the step, vectors i*8 + g;
//      output column (n-tile j, column n) is head_dim position
//      d = (8*(j/EV) + n)*EV + j%EV (EV elements per vector).
// Both patterns read whole 32-byte sectors per instruction.
//
// Softmax runs in the log2 domain with K's dequant factor and sm_scale
// folded into one multiplier. The running max is only raised when a new
// logit exceeds it by more than kRescaleThreshold (weights stay below 2^8,
// safe in f16/bf16), which skips most rescales of the accumulator; the exact
// max is tracked separately for the split-K record.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/mma.cuh"
#include "kernels/decode/decode_params.hpp"
#include "kernels/formats/format_policy.cuh"
#include "metrale/ops.hpp"

namespace metrale::kernels {

template <class Fmt, int D>
struct DecodeConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kRows = 16;  // q heads per CTA (the MMA's M)
  static constexpr int kRowBytes = D * Fmt::kBits / 8;
  // K: a thread loads a quarter of a token row.
  static constexpr int kKVecBytes = kRowBytes / 4 < 16 ? kRowBytes / 4 : 16;
  static constexpr int kKVecs = kRowBytes / (4 * kKVecBytes);
  static constexpr int kKElemsPerVec = kKVecBytes * 8 / Fmt::kBits;
  static constexpr int kKWords = kRowBytes / 16;
  // V: a thread loads an eighth of each of two token rows.
  static constexpr int kVVecBytes = kRowBytes / 8 < 16 ? kRowBytes / 8 : 16;
  static constexpr int kVVecs = kRowBytes / (8 * kVVecBytes);
  static constexpr int kVElemsPerVec = kVVecBytes * 8 / Fmt::kBits;
  static constexpr int kVWords = kRowBytes / 32;
  static constexpr int kKSteps = D / 16;
  static constexpr int kNTiles = D / 8;
  // 8-token steps loaded together. HBM latency is hidden only by bytes in
  // flight, so narrower formats load more steps at once: about the same
  // bytes per thread for every format, bounded by registers (D = 256 keeps a
  // 128-register accumulator).
  static constexpr int kStepBytesPerThread = kRowBytes / 2;  // K quarter row + two V eighth rows
  // Budgets chosen so that no instantiation spills (ptxas -v): dequantizing
  // formats need temporaries per step, and D = 256 a 128-register accumulator.
  static constexpr int kInFlightBytes =
      D <= 128 ? (Fmt::kBits == 16 ? 512 : Fmt::kBits == 8 ? 384 : 256) : (Fmt::kBits == 16 ? 256 : Fmt::kBits == 8 ? 128 : 64);
  static constexpr int kUnrollRaw = kInFlightBytes / kStepBytesPerThread;
  static constexpr int kInFlightSteps = kUnrollRaw < 1 ? 1 : (kUnrollRaw > 8 ? 8 : kUnrollRaw);
  // Split into two register stages (software pipeline) when possible.
  static constexpr int kStages = kInFlightSteps >= 2 ? 2 : 1;
  static constexpr int kUnroll = kInFlightSteps / kStages;
  // NVFP4 group scales per thread and token (one per 16 elements).
  static constexpr int kKScaleBytes = Fmt::kScaled ? kKVecs * kKElemsPerVec / 16 : 1;
  static constexpr int kVScalesPerVec = kVElemsPerVec >= 16 ? kVElemsPerVec / 16 : 1;
  static constexpr int kVScaleBytes = Fmt::kScaled ? kVVecs * kVScalesPerVec : 1;
  static constexpr float kRescaleThreshold = 8.0f;  // log2 units: weights < 2^8

  // Shared memory: Q fragments, then the warps' outputs and softmax stats.
  static constexpr int kQFragBytes = kKSteps * 32 * 16;
  static constexpr int kOBufBytes = kWarps * kRows * D * 4;
  static constexpr int kStatBytes = kWarps * kRows * 3 * 4 + kRows * 4 * (kWarps + 2);
  static constexpr int kSmemBytes = kQFragBytes + kOBufBytes + kStatBytes;

  static_assert(kKVecBytes >= 4 && kVVecBytes >= 4, "rows too narrow for word loads");
  static_assert(kKElemsPerVec % 4 == 0, "a k-step takes 4 elements per thread");
  static_assert(!Fmt::kScaled || kKElemsPerVec % 16 == 0, "K vectors must hold whole NVFP4 groups");
  static_assert(kNTiles % 2 == 0, "v_pair produces two n-tiles");
};

// Raw cache bytes of kUnroll 8-token steps, as one thread loaded them.
template <class Cfg>
struct StepBuffers {
  uint32_t kw[Cfg::kUnroll][Cfg::kKWords];
  uint32_t va[Cfg::kUnroll][Cfg::kVWords], vb[Cfg::kUnroll][Cfg::kVWords];
  uint8_t ks[Cfg::kUnroll][Cfg::kKScaleBytes];
  uint8_t vsa[Cfg::kUnroll][Cfg::kVScaleBytes], vsb[Cfg::kUnroll][Cfg::kVScaleBytes];
  int32_t st0;                 // first step held
  uint32_t live;               // bit u: step st0+u is inside the split and on a valid page
};

// Loads `Bytes` (4, 8 or 16) read-only bytes into consecutive words.
template <int Bytes>
__device__ __forceinline__ void load_vec(const uint8_t* ptr, uint32_t* w) {
  if constexpr (Bytes == 16) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(ptr));
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if constexpr (Bytes == 8) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(ptr));
    w[0] = v.x, w[1] = v.y;
  } else {
    static_assert(Bytes == 4, "vector width");
    w[0] = __ldg(reinterpret_cast<const uint32_t*>(ptr));
  }
}

template <class Fmt, int D>
__global__ void __launch_bounds__(DecodeConfig<Fmt, D>::kThreads)
    paged_decode_kernel(const __grid_constant__ DecodeParams p) {
  using Cfg = DecodeConfig<Fmt, D>;
  using Op = typename Fmt::Op;
  constexpr int U = Cfg::kUnroll;
  const float kNegInf = -__int_as_float(0x7f800000);

  extern __shared__ uint4 smem[];
  uint4* qfrag = smem;                                                        // [kKSteps][32]
  float* obuf = reinterpret_cast<float*>(smem + Cfg::kQFragBytes / 16);      // [warp][row][D]
  float* m_buf = obuf + Cfg::kWarps * Cfg::kRows * D;                        // [warp][row]
  float* l_buf = m_buf + Cfg::kWarps * Cfg::kRows;
  float* mt_buf = l_buf + Cfg::kWarps * Cfg::kRows;
  float* w_buf = mt_buf + Cfg::kWarps * Cfg::kRows;                          // [warp][row] weights / L
  float* row_m = w_buf + Cfg::kWarps * Cfg::kRows;                           // [row] exact max (log2)
  float* row_l = row_m + Cfg::kRows;                                         // [row] L in that frame

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;

  int64_t cta = blockIdx.x;
  const int tile = int(cta % p.head_tiles);
  cta /= p.head_tiles;
  const int kv_head = int(cta % p.num_kv_heads);
  const int64_t seq = cta / p.num_kv_heads;
  const int split = blockIdx.y;
  const int head0 = kv_head * p.group + tile * Cfg::kRows;
  const int rows = min(Cfg::kRows, p.group - tile * Cfg::kRows);

  // Never read past the block-table row, whatever seq_lens says.
  const int32_t seq_len = min(max(p.seq_lens[seq], 0), p.max_blocks_per_seq * p.block_size);
  const int32_t first_pos = window_start(seq_len, p.sliding_window);
  const PageRange pages = split_pages(attended_pages(seq_len, p.sliding_window, p.block_size), split, p.num_splits);

  // Q -> fragment order in shared memory (rows past the group are zero).
  for (int idx = threadIdx.x; idx < Cfg::kKSteps * 32; idx += Cfg::kThreads) {
    const int kk = idx / 32, ln = idx % 32, gg = ln / 4, cc = ln % 4;
    const int i = kk / (Cfg::kKElemsPerVec / 4), h = kk % (Cfg::kKElemsPerVec / 4);
    const int d0 = (i * 4 + cc) * Cfg::kKElemsPerVec + 4 * h;
    uint32_t w[2][2] = {{0, 0}, {0, 0}};  // [row g / g+8][elements d0..1 / d0+2..3]
    for (int half = 0; half < 2; ++half) {
      const int r = gg + 8 * half;
      if (r < rows) {
        const uint2 raw = *reinterpret_cast<const uint2*>(p.q + seq * p.q_stride + int64_t(head0 + r) * D + d0);
        if constexpr (std::is_same_v<Op, Bf16Op>) {
          w[half][0] = raw.x, w[half][1] = raw.y;
        } else {
          w[half][0] = pack2<Op>(__uint_as_float(raw.x << 16), __uint_as_float(raw.x & 0xffff0000u));
          w[half][1] = pack2<Op>(__uint_as_float(raw.y << 16), __uint_as_float(raw.y & 0xffff0000u));
        }
      }
    }
    qfrag[idx] = make_uint4(w[0][0], w[1][0], w[0][1], w[1][1]);
  }
  __syncthreads();

  float o[Cfg::kNTiles][4];
#pragma unroll
  for (int j = 0; j < Cfg::kNTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m_run[2] = {kNegInf, kNegInf};   // reference max of rows g, g+8 (log2 units)
  float m_true[2] = {kNegInf, kNegInf};  // exact max
  float l_part[2] = {0.0f, 0.0f};        // this thread's share of sum exp2(x - m_run)
  bool bad_page = false;

  const int steps_per_page = p.block_size / 8;
  const int total_steps = (pages.end - pages.first) * steps_per_page;
  // block_size is a power of two: step -> (page, token) by shift and mask.
  const int spp_shift = 31 - __clz(steps_per_page);
  const int spp_mask = steps_per_page - 1;
  const int32_t* table = p.block_tables + seq * p.max_blocks_per_seq;

  // Per-thread byte offsets inside a page (see the header for the patterns).
  const int32_t row_stride = p.num_kv_heads * Cfg::kRowBytes;  // bytes between tokens of a page
  const int32_t k_thread = g * row_stride + c * Cfg::kKVecBytes;
  const int32_t va_thread = 2 * c * row_stride + g * Cfg::kVVecBytes;
  const int64_t head_off = int64_t(kv_head) * Cfg::kRowBytes;
  // NVFP4 scale section: (t*H + h)*D/16 bytes in.
  const int32_t srow = p.num_kv_heads * (D / 16);
  const int64_t scale_base = p.scale_offset + int64_t(kv_head) * (D / 16);
  constexpr int kKScalesPerVec = Cfg::kKElemsPerVec / 16;

  // Issues the loads of steps st0 .. st0+U-1 of this warp into `b` (steps
  // past the split or on a corrupt page load nothing and stay zero).
  auto load = [&](StepBuffers<Cfg>& b, int st0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int st = st0 + u;
      const int page_idx = pages.first + (st >> spp_shift);
      const int32_t page = st < total_steps ? table[page_idx] : 0;
      const bool page_ok = page >= 0 && page < p.num_blocks;
      bad_page |= !page_ok;  // corrupt table: never dereference, poison the output
      const bool live = st < total_steps && page_ok;
      if (u == 0) b.st0 = st0, b.live = 0;
      b.live |= uint32_t(live) << u;
      const int tok0 = (st & spp_mask) * 8;
      const int64_t page_off = int64_t(live ? page : 0) * p.page_stride + tok0 * row_stride;
      const uint8_t* kp = p.k_cache + page_off + head_off + k_thread;
      const uint8_t* vp = p.v_cache + page_off + head_off + va_thread;
#pragma unroll
      for (int w = 0; w < Cfg::kKWords; ++w) b.kw[u][w] = 0;
#pragma unroll
      for (int w = 0; w < Cfg::kVWords; ++w) b.va[u][w] = b.vb[u][w] = 0;
#pragma unroll
      for (int i = 0; i < Cfg::kKScaleBytes; ++i) b.ks[u][i] = 0;
#pragma unroll
      for (int i = 0; i < Cfg::kVScaleBytes; ++i) b.vsa[u][i] = b.vsb[u][i] = 0;
      if (!live) continue;  // nothing to load; compute() masks the whole step
#pragma unroll
      for (int i = 0; i < Cfg::kKVecs; ++i)
        load_vec<Cfg::kKVecBytes>(kp + i * 4 * Cfg::kKVecBytes, &b.kw[u][i * Cfg::kKVecBytes / 4]);
#pragma unroll
      for (int i = 0; i < Cfg::kVVecs; ++i) {
        load_vec<Cfg::kVVecBytes>(vp + i * 8 * Cfg::kVVecBytes, &b.va[u][i * Cfg::kVVecBytes / 4]);
        load_vec<Cfg::kVVecBytes>(vp + row_stride + i * 8 * Cfg::kVVecBytes, &b.vb[u][i * Cfg::kVVecBytes / 4]);
      }
      if constexpr (Fmt::kScaled) {
        const int64_t spage = int64_t(page) * p.page_stride + scale_base + tok0 * srow;
        const uint8_t* ksp = p.k_cache + spage + g * srow + c * kKScalesPerVec;
        const uint8_t* vsp = p.v_cache + spage + 2 * c * srow;
#pragma unroll
        for (int i = 0; i < Cfg::kKVecs; ++i)
#pragma unroll
          for (int j = 0; j < kKScalesPerVec; ++j) b.ks[u][i * kKScalesPerVec + j] = __ldg(ksp + i * 4 * kKScalesPerVec + j);
#pragma unroll
        for (int i = 0; i < Cfg::kVVecs; ++i)
#pragma unroll
          for (int j = 0; j < Cfg::kVScalesPerVec; ++j) {
            const int grp = Cfg::kVElemsPerVec >= 16 ? (i * 8 + g) * Cfg::kVScalesPerVec + j : (i * 8 + g) / 2;
            b.vsa[u][i * Cfg::kVScalesPerVec + j] = __ldg(vsp + grp);
            b.vsb[u][i * Cfg::kVScalesPerVec + j] = __ldg(vsp + srow + grp);
          }
      }
    }
  };

  // Attention over the steps held in `b`: QK, online softmax, PV.
  auto compute = [&](StepBuffers<Cfg>& b) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int kk = 0; kk < Cfg::kKSteps; ++kk) {
        const uint4 a4 = qfrag[kk * 32 + lane];
        const uint32_t a[4] = {a4.x, a4.y, a4.z, a4.w};
        uint32_t kscale = 0;
        if constexpr (Fmt::kScaled) {
          const uint32_t sc = b.ks[u][kk / 4];
          kscale = Nvfp4Format::scale_pair(sc | (sc << 8));
        }
        uint32_t b0, b1;
        Fmt::k_pair(b.kw[u], kk, kscale, b0, b1);
        mma_16816<Op>(s, a, b0, b1);
      }
      // Logits in log2 units; positions outside [first_pos, seq_len) are masked.
      // Most steps lie wholly inside the attended range (warp-uniform test)
      // and skip the V masking below.
      const int st = b.st0 + u;
      const bool live = (b.live >> u) & 1u;
      const int32_t pos0 = (pages.first + (st >> spp_shift)) * p.block_size + (st & spp_mask) * 8;
      const bool full = live && pos0 >= first_pos && pos0 + 8 <= seq_len;
      const int32_t pa = pos0 + 2 * c;
      const bool ok0 = live && pa >= first_pos && pa < seq_len;
      const bool ok1 = live && pa + 1 >= first_pos && pa + 1 < seq_len;
      float x[4];
      x[0] = ok0 ? s[0] * p.qk_log2_scale : kNegInf;
      x[1] = ok1 ? s[1] * p.qk_log2_scale : kNegInf;
      x[2] = ok0 ? s[2] * p.qk_log2_scale : kNegInf;
      x[3] = ok1 ? s[3] * p.qk_log2_scale : kNegInf;
      float mx[2] = {fmaxf(x[0], x[1]), fmaxf(x[2], x[3])};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        m_true[r] = fmaxf(m_true[r], mx[r]);
      }
      const bool raise = mx[0] > m_run[0] + Cfg::kRescaleThreshold || mx[1] > m_run[1] + Cfg::kRescaleThreshold;
      if (__any_sync(0xffffffffu, raise)) {
        float f[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const float m_new = fmaxf(m_run[r], mx[r]);
          f[r] = m_new == kNegInf ? 1.0f : fast_exp2(m_run[r] - m_new);
          m_run[r] = m_new;
          l_part[r] *= f[r];
        }
#pragma unroll
        for (int j = 0; j < Cfg::kNTiles; ++j) {
          o[j][0] *= f[0], o[j][1] *= f[0];
          o[j][2] *= f[1], o[j][3] *= f[1];
        }
      }
      const float ref0 = m_run[0] == kNegInf ? 0.0f : m_run[0];
      const float ref1 = m_run[1] == kNegInf ? 0.0f : m_run[1];
      const float p0 = fast_exp2(x[0] - ref0), p1 = fast_exp2(x[1] - ref0);
      const float p2 = fast_exp2(x[2] - ref1), p3 = fast_exp2(x[3] - ref1);
      l_part[0] += p0 + p1;
      l_part[1] += p2 + p3;
      const uint32_t pa01 = pack2<Op>(p0, p1), pa23 = pack2<Op>(p2, p3);
      // Unattended slots hold whatever the cache held (possibly NaN codes):
      // a zero weight times NaN is NaN, so their V operands are zeroed too.
      if (!full) {
#pragma unroll
        for (int w = 0; w < Cfg::kVWords; ++w) {
          b.va[u][w] = ok0 ? b.va[u][w] : 0u;
          b.vb[u][w] = ok1 ? b.vb[u][w] : 0u;
        }
        if constexpr (Fmt::kScaled) {
#pragma unroll
          for (int i = 0; i < Cfg::kVScaleBytes; ++i) {
            b.vsa[u][i] = ok0 ? b.vsa[u][i] : uint8_t(0);
            b.vsb[u][i] = ok1 ? b.vsb[u][i] : uint8_t(0);
          }
        }
      }
#pragma unroll
      for (int j = 0; j < Cfg::kNTiles; j += 2) {
        uint32_t vscale = 0;
        if constexpr (Fmt::kScaled) {
          constexpr int kEV = Cfg::kVElemsPerVec;
          const int i = (j / kEV) * Cfg::kVScalesPerVec + (kEV >= 16 ? (j % kEV) / 16 : 0);
          vscale = Nvfp4Format::scale_pair(uint32_t(b.vsa[u][i]) | (uint32_t(b.vsb[u][i]) << 8));
        }
        uint32_t r0, r1;
        Fmt::v_pair(b.va[u], b.vb[u], j, vscale, r0, r1);
        mma_1688<Op>(o[j], pa01, pa23, r0);
        mma_1688<Op>(o[j + 1], pa01, pa23, r1);
      }
    }
  };

  // Two register stages where the budget allows: the loads of the next
  // steps are in flight while the current ones are computed.
  constexpr int kStride = Cfg::kWarps * U;
  StepBuffers<Cfg> buf[Cfg::kStages];
  int st0 = warp * U;
  if constexpr (Cfg::kStages == 1) {
    for (; st0 < total_steps; st0 += kStride) {
      load(buf[0], st0);
      compute(buf[0]);
    }
  } else {
    load(buf[0], st0);
    while (st0 < total_steps) {
      load(buf[1], st0 + kStride);
      compute(buf[0]);
      st0 += kStride;
      if (st0 >= total_steps) break;
      load(buf[0], st0 + kStride);
      compute(buf[1]);
      st0 += kStride;
    }
  }

  // Let a programmatically dependent reduce start its launch while this
  // grid finishes; it still waits for our writes (griddepcontrol.wait).
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  // ---- merge the warps' states ----
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_part[r] += __shfl_xor_sync(0xffffffffu, l_part[r], 1);
    l_part[r] += __shfl_xor_sync(0xffffffffu, l_part[r], 2);
  }
  constexpr int kEV = Cfg::kVElemsPerVec;
  float* my_o = obuf + warp * Cfg::kRows * D;
#pragma unroll
  for (int j = 0; j < Cfg::kNTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = g + 8 * (e / 2), n = 2 * c + (e % 2);
      my_o[row * D + (8 * (j / kEV) + n) * kEV + j % kEV] = o[j][e];
    }
  }
  if (c == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      m_buf[warp * Cfg::kRows + g + 8 * r] = m_run[r];
      l_buf[warp * Cfg::kRows + g + 8 * r] = l_part[r];
      mt_buf[warp * Cfg::kRows + g + 8 * r] = m_true[r];
    }
  }
  const bool bad = __syncthreads_or(bad_page);

  if (threadIdx.x < Cfg::kRows) {
    const int row = threadIdx.x;
    float M = kNegInf, MT = kNegInf;
    for (int w = 0; w < Cfg::kWarps; ++w) {
      M = fmaxf(M, m_buf[w * Cfg::kRows + row]);
      MT = fmaxf(MT, mt_buf[w * Cfg::kRows + row]);
    }
    float L = 0.0f, wt[Cfg::kWarps];
    for (int w = 0; w < Cfg::kWarps; ++w) {
      const float mw = m_buf[w * Cfg::kRows + row];
      wt[w] = mw == kNegInf ? 0.0f : exp2f(mw - M);
      L += l_buf[w * Cfg::kRows + row] * wt[w];
    }
    const float inv = L == 0.0f ? 0.0f : 1.0f / L;  // L = 0: nothing attended, output 0
    for (int w = 0; w < Cfg::kWarps; ++w) w_buf[w * Cfg::kRows + row] = wt[w] * inv;
    row_m[row] = MT;
    row_l[row] = L == 0.0f ? 0.0f : L * exp2f(M - MT);  // re-referenced to the exact max
  }
  __syncthreads();

  const float qnan = __int_as_float(0x7fc00000);
  for (int idx = threadIdx.x; idx < rows * D; idx += Cfg::kThreads) {
    const int row = idx / D, d = idx % D;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < Cfg::kWarps; ++w) v += obuf[(w * Cfg::kRows + row) * D + d] * w_buf[w * Cfg::kRows + row];
    v = bad ? qnan : v * p.v_factor;
    const int64_t qh = int64_t(head0 + row);
    if (p.workspace == nullptr) {
      p.out[(seq * p.num_q_heads + qh) * D + d] = codec::float_to_bf16(v);
    } else {
      float* rec = p.workspace + ((seq * p.num_q_heads + qh) * p.num_splits + split) * (D + 2);
      rec[d] = v;
      if (d == 0) {
        constexpr float kLn2 = 0.69314718055994530942f;
        const bool empty = row_l[row] == 0.0f;
        rec[D] = bad ? qnan : (empty ? kNegInf : row_m[row] * kLn2);
        rec[D + 1] = bad ? qnan : row_l[row];
      }
    }
  }
}

}  // namespace metrale::kernels
