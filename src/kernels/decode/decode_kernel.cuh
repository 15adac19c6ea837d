// Paged decode attention, written once against a KV-format policy
// (kernels/formats/format_policy.cuh), for single pass and split-K. This
// file is the kernel body (indices, Q fragments, QK / online softmax / PV per
// step, the warps' merge and the output or split record); its parts:
//   decode_config.cuh          the compile-time configuration, StepBuffers
//   decode_steps.cuh           the split's steps per warp and their page ids
//   decode_register_loads.cuh  the register load pipeline  } one interface:
//   decode_tma_loads.cuh       the TMA load pipeline       } run(compute)
//   decode_cluster_merge.cuh   the split-K merge inside a cluster
//   common/vector_loads.cuh    16/8/4-byte vector loads
//
// Work decomposition: one CTA per (sequence, kv head, tile of 8 q heads,
// split; at head_dim 64 often a pair of kv heads: DecodeConfig's kPair), so
// the q heads that share a kv head are served by ONE read of that head's
// cache: the GQA group is the N dimension of the tensor-core MMAs
// (columns beyond the group are zero and never stored). The CTA's 4 warps
// take groups of kUnroll consecutive 16-token steps of the split's pages
// round-robin, loading the next groups while computing the current one:
// bf16 and fp8 through TMA into a per-warp ring of shared-memory stages
// (kTma), NVFP4 into further register stages. Each warp keeps its own
// online-softmax state and output accumulator in registers, with no barrier
// in the main loop, and the warps merge through shared memory at the end
// (the runs kernel over NVFP4 at head_dim 256 splits head_dim over teams of
// two warps instead: DecodeConfig's HP, a CTA barrier per step).
// A split-K CTA writes its split's record to the workspace, or, launched as
// a cluster of the splits (cluster_merge_records), merges the records of
// its cluster straight into the output.
//
// Tokens sit on the MMA's M (as in TensorRT-LLM's XQA), so one m16n8k16
// covers 16 tokens and the dequantized cache values are A operands straight
// from registers. Per 16-token step a warp computes
//   S^T = K Q^T   (M = 16 tokens, N = 8 q heads, K = head_dim; Q^T is a
//                  B operand held in registers for the whole kernel)
//   O^T += V^T P^T (M = 16 head_dim rows per tile, N = 8 q heads, K = the 16
//                  tokens); P^T's B fragment is S^T's C fragment transposed
//                  in registers by two movmatrix (8x8 b16 transposes).
// Every thread loads whole 16-byte vectors of token rows (from global
// memory, or from the TMA stage in shared memory):
//   K: thread (g = lane/4, c = lane%4) loads tokens g and g+8 of the step,
//      vectors Cfg::k_vector(i, c) of each row (i*4 + c from global memory;
//      EK elements each); element e of that
//      quarter row feeds fragment slot r of QK k-step kk where
//      e = Fmt::k_elem(kk, r) (4kk + r, or the order NVFP4 unpacks in), and
//      Q is loaded in the same permutation.
//   V: thread (g, c) loads tokens 2c, 2c+1, 2c+8, 2c+9 of the step, vectors
//      i*8 + g; element e of that eighth row (d = (i*8 + g)*EV + e%EV, EV
//      elements per vector) is row g + 8*(e%2) of output tile e/2.
// From global memory both patterns read whole 32-byte sectors per
// instruction; from the swizzled stages they are free of bank conflicts.
//
// Softmax runs in the log2 domain with K's dequant factor and sm_scale
// folded into one multiplier. The running max is only raised when a new
// logit exceeds it by more than kRescaleThreshold (weights stay below 2^8,
// safe in f16/bf16), which skips most rescales of the accumulator; the exact
// max is tracked per thread and reduced once, for the split-K record.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/mma.cuh"
#include "kernels/decode/decode_cluster_merge.cuh"
#include "kernels/decode/decode_config.cuh"
#include "kernels/decode/decode_register_loads.cuh"
#include "kernels/decode/decode_runs.cuh"
#include "kernels/decode/decode_steps.cuh"
#include "kernels/decode/decode_tma_loads.cuh"
#include "metrale/ops.hpp"
#include "metrale/softmax_state.hpp"

namespace metrale::kernels {

// kRuns: columns are (query row, q head) pairs of query runs, with sinks,
// soft-cap and lse (decode_runs.cuh); decode with those options runs it too.
// NT: the runs kernel's n-tiles of 8 columns; HP: its parts of head_dim
// (teams of two warps; DecodeConfig).
template <class Fmt, int D, bool kTma, bool kPair, bool kRuns = false, int NT = 1, int HP = 1>
__global__ void __launch_bounds__(DecodeConfig<Fmt, D, kTma, kPair, NT, HP>::kThreads)
    paged_decode_kernel(const __grid_constant__ KernelParams<kRuns> p) {
  static_assert(!(kRuns && kPair), "query runs take one kv head per CTA");
  static_assert(kRuns || (NT == 1 && HP == 1), "decode serves a group of at most 8 q heads per tile");
  using Cfg = DecodeConfig<Fmt, D, kTma, kPair, NT, HP>;
  constexpr int kHD = Cfg::kHeadDim;  // elements of a q row, an output row, a record
  using Op = typename Fmt::Op;
  constexpr int U = Cfg::kUnroll;
  constexpr int kCols = Cfg::kCols;
  const float kNegInf = -__int_as_float(0x7f800000);

  extern __shared__ uint4 smem[];
  uint8_t* const smem_bytes = reinterpret_cast<uint8_t*>(smem);
  float* obuf = reinterpret_cast<float*>(smem);        // [team][col][D]
  float* m_buf = reinterpret_cast<float*>(smem_bytes + Cfg::kStatOffset);  // [team][col]
  float* l_buf = m_buf + Cfg::kTeams * kCols;
  float* mt_buf = l_buf + Cfg::kTeams * kCols;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  // Teams of HP warps take the same steps; part: this warp's part of head_dim.
  const int team = warp / HP, part = warp % HP;

  int64_t cta = blockIdx.x;
  const int tile = int(cta % p.head_tiles);
  cta /= p.head_tiles;
  const int kv_head = int(cta % p.num_kv_heads);
  const int64_t seq = cta / p.num_kv_heads;
  const int split = blockIdx.y;
  const int head0 = kv_head * p.group + tile * kCols;
  int cols = min(kCols, p.group - tile * kCols);

  // Launched as a programmatic dependent (decode_launch.cuh): everything the
  // stream's earlier kernels wrote (q, lengths, tables, cache) is read after
  // this wait.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");

  // Never read past the block-table row, whatever seq_lens says.
  const int32_t seq_len = min(max(p.seq_lens[seq], 0), p.max_blocks_per_seq * p.block_size);
  const int32_t first_pos = window_start(seq_len, p.sliding_window);
  RunColumns rc{};
  if constexpr (kRuns) {
    rc.seq_len = seq_len;
    rc.row0 = p.q_start ? p.q_start[seq] : int32_t(seq);
    rc.run_len = p.q_start ? min(max(p.q_start[seq + 1] - rc.row0, 0), seq_len) : 1;
    rc.fc0 = tile * kCols;
    rc.group = p.group;
    rc.kv_head = kv_head;
    rc.window = p.sliding_window;
    cols = min(kCols, rc.run_len * p.group - rc.fc0);
    if (cols <= 0) return;  // past the run's rows: the whole CTA (and its cluster, the same tile)
  }
  const PageRange pages = split_pages(kRuns ? rc.pages(p.block_size)
                                            : attended_pages(seq_len, p.sliding_window, p.block_size),
                                      split, p.num_splits);
  // The positions any column of the CTA attends (V outside them is zeroed),
  // and (runs) those every column attends: begins and ends grow with the row.
  const int32_t span_begin = kRuns ? rc.range(0).begin : first_pos;
  const int32_t span_end = kRuns ? rc.range(cols - 1).end : seq_len;
  const int32_t inner_begin = kRuns ? rc.range(cols - 1).begin : first_pos;
  const int32_t inner_end = kRuns ? rc.range(0).end : seq_len;
  // Runs: the thread's columns 8n + 2c, 8n + 2c + 1 of n-tile n each mask their own range.
  int32_t col_begin[NT][2] = {}, col_end[NT][2] = {};
  if constexpr (kRuns) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (8 * n + 2 * c + j < cols) {
          const QueryRange r = rc.range(8 * n + 2 * c + j);
          col_begin[n][j] = r.begin;
          col_end[n][j] = r.end;
        }
      }
  }

  // Q^T as B fragments of the QK k-steps, in registers: q head g of the
  // tile (zero past the group), head_dim positions of the K permutation:
  // slot r of k-step kk takes element Fmt::k_elem(kk, r) of the thread's K
  // stream, which is element e % EK of vector e / EK, i.e. head_dim
  // position Cfg::k_vector(e / EK, c) * EK + e % EK. Paired heads: every
  // column holds its q in both halves (each half's k-steps feed one
  // head's logits; the other head's products are never used, so the
  // columns need no zeros and a NaN in one head's K stays there).
  // Column tiles (NT > 1): n-tile n's fragment holds column 8n + g. Parts
  // of head_dim (HP 2): the warp's k-steps are those of its half.
  uint32_t qf[NT][Cfg::kKSteps][2];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const int qc = 8 * n + g;  // the column this thread loads
    const bf16* q_row = p.q + seq * p.q_stride + int64_t(head0 + g) * p.q_head_stride;
    if constexpr (kRuns)
      q_row = qc < cols ? p.q + int64_t(rc.row(qc)) * p.q_stride + int64_t(rc.head(qc)) * p.q_head_stride : p.q;
#pragma unroll
    for (int kk = 0; kk < Cfg::kKSteps; ++kk) {
      float x[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        constexpr int kEK = Cfg::kKElemsPerVec;
        const int e = Fmt::k_elem(kk, r);
        const int d = part * Cfg::kPartD + Cfg::k_vector(e / kEK, c) * kEK + e % kEK;
        x[r] = qc < cols ? codec::bf16_to_float(q_row[kPair ? d % kHD : d]) : 0.0f;
      }
      qf[n][kk][0] = pack2<Op>(x[0], x[1]);  // exact for bf16; f16 as docs/numerics.md says
      qf[n][kk][1] = pack2<Op>(x[2], x[3]);
    }
  }

  // O^T tiles: o[n][m] = rows (g, g+8) of head_dim tile m (of the warp's
  // part), columns 8n + (2c, 2c+1).
  float o[NT][Cfg::kDTiles][4];
  float m_run[NT][2], m_true[NT][2], l_part[NT][2];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
#pragma unroll
    for (int m = 0; m < Cfg::kDTiles; ++m) o[n][m][0] = o[n][m][1] = o[n][m][2] = o[n][m][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      m_run[n][j] = kNegInf;   // reference max of columns 8n + 2c + j (log2 units)
      m_true[n][j] = kNegInf;  // this thread's exact max
      l_part[n][j] = 0.0f;     // this thread's share of sum exp2(x - m_run)
    }
  }
  bool bad_page = false;

  const int32_t split_pos0 = pages.first * p.block_size;  // position of step 0
  SplitSteps<Cfg> steps(p, seq, pages, team, lane);

  // Teams of two: a step's partial S go through shared memory, [team][step
  // parity][part][n-tile][lane] float4 (a quarter warp's stores and loads
  // are 128 contiguous bytes), one CTA barrier per step (the teams take the
  // same number of steps: SplitSteps::has_group). Two parities: a warp
  // writes step i + 2's only after every warp passed step i + 1's barrier,
  // so after its teammate read step i's.
  float4* const s_exchange = reinterpret_cast<float4*>(smem_bytes + Cfg::kRecOffset) + team * 2 * HP * NT * 32;
  int s_parity = 0;

  // Two MMA chains per n-tile where registers allow (head_dim 256 has none
  // to spare; with parts of head_dim, its two n-tiles are two chains of the
  // half's 8 k-steps).
  constexpr bool kTwoChains = HP == 1 && D <= 128;
  // Attention over the steps held in `b`: QK, online softmax, PV.
  const bool odd_tokens_swapped = Cfg::kSwapOddTokens && (g & 1);
  auto compute = [&](StepBuffers<Cfg>& b) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      // s[n] = S^T rows (tokens g, g+8) x columns 8n + (2c, 2c+1), summed
      // in two independent MMA chains (even / odd k-steps) where registers
      // allow: a chain of dependent MMAs pays the full MMA latency per link.
      // Paired heads: the chains are the two heads' k-steps, and each
      // column takes its own head's (rows g, g+8 of odd g hold the second
      // head in the first chain where kSwapOddTokens: both chains see the
      // same q, as every column carries its q in both halves). Each K
      // fragment is dequantised once for the NT n-tiles.
      float s[NT][4], s_odd[NT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int r = 0; r < 4; ++r) s[n][r] = s_odd[n][r] = 0.0f;
      // K group scales as f16x2 pairs: ksc[t][j] = groups (2j, 2j+1) of the
      // thread's scale bytes of token g + 8t; k-step kk takes group kk/4.
      uint32_t ksc[2][2] = {};
      if constexpr (Fmt::kScaled) {
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
          for (int j = 0; 2 * j < Cfg::kKScaleBytes; ++j) ksc[t][j] = Fmt::scale_pair(b.ks[u][t] >> (16 * j));
      }
#pragma unroll
      for (int kk = 0; kk < Cfg::kKSteps; ++kk) {
        uint32_t a[4];
        uint32_t ks0 = 0, ks1 = 0;
        if constexpr (Fmt::kScaled) {
          constexpr int kGroupSteps = Fmt::kGroupSize / 4;  // k-steps per scale group
          ks0 = f16x2_broadcast(ksc[0][kk / (2 * kGroupSteps)], (kk / kGroupSteps) % 2);
          ks1 = f16x2_broadcast(ksc[1][kk / (2 * kGroupSteps)], (kk / kGroupSteps) % 2);
        }
        Fmt::k_pair(b.kw[u][0], kk, ks0, a[0], a[2]);
        Fmt::k_pair(b.kw[u][1], kk, ks1, a[1], a[3]);
        // Two chains per n-tile: with one per n-tile, two n-tiles ran a
        // chain of 8 dependent MMAs per step (NVFP4 q_len 4: "wait" the
        // largest stall, 31% of the samples, ncu, session 17).
        const bool odd_chain = kPair ? kk >= Cfg::kKSteps / 2 : kk % 2 && kTwoChains;
#pragma unroll
        for (int n = 0; n < NT; ++n) mma_16816<Op>(odd_chain ? s_odd[n] : s[n], a, qf[n][kk][0], qf[n][kk][1]);
      }
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          if constexpr (kPair)
            s[n][r] = (2 * c + r % 2 >= cols / 2) != odd_tokens_swapped ? s_odd[n][r] : s[n][r];  // the column's head
          else if constexpr (kTwoChains)
            s[n][r] += s_odd[n][r];
        }
      if constexpr (HP == 2) {
        // S over the whole head_dim: this warp's half plus its teammate's,
        // the same sum in both (addition commutes), so both keep the same
        // softmax state and weights.
        float4* const xs = s_exchange + s_parity * HP * NT * 32;
#pragma unroll
        for (int n = 0; n < NT; ++n) xs[(part * NT + n) * 32 + lane] = make_float4(s[n][0], s[n][1], s[n][2], s[n][3]);
        __syncthreads();
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const float4 t = xs[((1 - part) * NT + n) * 32 + lane];
          s[n][0] += t.x, s[n][1] += t.y, s[n][2] += t.z, s[n][3] += t.w;
        }
        s_parity ^= 1;
      }
      // Logits in log2 units; positions outside [first_pos, seq_len) are masked.
      // Most steps lie wholly inside the attended range (warp-uniform test)
      // and skip the V masking below.
      const int st = b.st0 + u;
      const bool live = (b.live >> u) & 1u;
      const int32_t pos0 = split_pos0 + st * Cfg::kStepTokens;  // pages hold whole steps
      const bool full = live && pos0 >= span_begin && pos0 + Cfg::kStepTokens <= span_end;
      float x[NT][4];
      if constexpr (kRuns) {
        // x[n][r]: token g + 8 (r / 2), column 8n + 2c + r % 2: soft-capped or
        // scaled (one warp-uniform branch), then masked to its column's range
        // unless the step lies inside every column's range (most steps; the
        // masks and the soft-cap select were 12% of NVFP4's instructions).
        if (p.softcap_log2 > 0.0f) {
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int r = 0; r < 4; ++r) x[n][r] = p.softcap_log2 * fast_tanh(s[n][r] * p.softcap_scale);
        } else {
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int r = 0; r < 4; ++r) x[n][r] = s[n][r] * p.qk_log2_scale;
        }
        if (!(live && pos0 >= inner_begin && pos0 + Cfg::kStepTokens <= inner_end)) {
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              const int32_t t = pos0 + g + 8 * (r / 2);
              const bool ok = live && t >= col_begin[n][r % 2] && t < col_end[n][r % 2];
              x[n][r] = ok ? x[n][r] : kNegInf;
            }
        }
      } else {
        const bool ok_lo = live && pos0 + g >= first_pos && pos0 + g < seq_len;
        const bool ok_hi = live && pos0 + g + 8 >= first_pos && pos0 + g + 8 < seq_len;
        x[0][0] = ok_lo ? s[0][0] * p.qk_log2_scale : kNegInf;
        x[0][1] = ok_lo ? s[0][1] * p.qk_log2_scale : kNegInf;
        x[0][2] = ok_hi ? s[0][2] * p.qk_log2_scale : kNegInf;
        x[0][3] = ok_hi ? s[0][3] * p.qk_log2_scale : kNegInf;
      }
      float mx[NT][2];
      bool raise = false;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        mx[n][0] = fmaxf(x[n][0], x[n][2]);
        mx[n][1] = fmaxf(x[n][1], x[n][3]);
        m_true[n][0] = fmaxf(m_true[n][0], mx[n][0]);
        m_true[n][1] = fmaxf(m_true[n][1], mx[n][1]);
        // The reference max is shared by the 8 threads of a column (same c):
        // raised only when some logit passes it by the threshold.
        raise = raise || mx[n][0] > m_run[n][0] + Cfg::kRescaleThreshold ||
                mx[n][1] > m_run[n][1] + Cfg::kRescaleThreshold;
      }
      if (__any_sync(0xffffffffu, raise)) {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          float f[2];
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            mx[n][j] = fmaxf(mx[n][j], __shfl_xor_sync(0xffffffffu, mx[n][j], 4));
            mx[n][j] = fmaxf(mx[n][j], __shfl_xor_sync(0xffffffffu, mx[n][j], 8));
            mx[n][j] = fmaxf(mx[n][j], __shfl_xor_sync(0xffffffffu, mx[n][j], 16));
            const float m_new = fmaxf(m_run[n][j], mx[n][j]);
            f[j] = m_new == kNegInf ? 1.0f : fast_exp2(m_run[n][j] - m_new);
            m_run[n][j] = m_new;
            l_part[n][j] *= f[j];
          }
#pragma unroll
          for (int m = 0; m < Cfg::kDTiles; ++m) {
            o[n][m][0] *= f[0], o[n][m][1] *= f[1];
            o[n][m][2] *= f[0], o[n][m][3] *= f[1];
          }
        }
      }
      // P^T as the B fragments of PV: (tokens 2c, 2c+1 | 2c+8, 2c+9; column 8n + g).
      uint32_t pb0[NT], pb1[NT];
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const float ref0 = m_run[n][0] == kNegInf ? 0.0f : m_run[n][0];
        const float ref1 = m_run[n][1] == kNegInf ? 0.0f : m_run[n][1];
        const float p0 = fast_exp2(x[n][0] - ref0), p1 = fast_exp2(x[n][1] - ref1);
        const float p2 = fast_exp2(x[n][2] - ref0), p3 = fast_exp2(x[n][3] - ref1);
        l_part[n][0] += p0 + p2;
        l_part[n][1] += p1 + p3;
        pb0[n] = movmatrix_trans(pack2<Op>(p0, p1));
        pb1[n] = movmatrix_trans(pack2<Op>(p2, p3));
      }
      // Unattended slots hold whatever the cache held (possibly NaN codes):
      // a zero weight times NaN is NaN, so their V operands are zeroed too.
      if (!full) {
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const int32_t pos = pos0 + 2 * c + Cfg::vtok(t);
          const bool ok = live && pos >= span_begin && pos < span_end;
#pragma unroll
          for (int w = 0; w < Cfg::kVWords; ++w) b.vw[u][t][w] = ok ? b.vw[u][t][w] : 0u;
          if constexpr (Fmt::kScaled) b.vs[u][t] = ok ? b.vs[u][t] : 0u;
        }
      }
      // Two tiles at a time: elements 2m .. 2m+3 of the V eighth rows (one
      // NVFP4 scale group: groups are 8 or 16 aligned elements), each
      // dequantised once for the NT n-tiles.
#pragma unroll
      for (int m = 0; m < Cfg::kDTiles; m += 2) {
        uint32_t vs01 = 0, vs89 = 0;
        if constexpr (Fmt::kScaled) {
          // Byte i of each token's scale bytes: the group of elements 2m..2m+3.
          const uint32_t i = Cfg::kVElemsPerVec >= Fmt::kGroupSize ? (2 * m) / Fmt::kGroupSize : 0;
          vs01 = Fmt::scale_pair(byte_perm(b.vs[u][0], b.vs[u][1], i | (i + 4) << 4));
          vs89 = Fmt::scale_pair(byte_perm(b.vs[u][2], b.vs[u][3], i | (i + 4) << 4));
        }
        uint32_t lo[4], hi[4];  // (tokens 2c, 2c+1) and (2c+8, 2c+9): tiles m, m+1
        Fmt::v_quad(b.vw[u][0], b.vw[u][1], 2 * m, vs01, lo);
        Fmt::v_quad(b.vw[u][2], b.vw[u][3], 2 * m, vs89, hi);
        const uint32_t a0[4] = {lo[0], lo[1], hi[0], hi[1]}, a1[4] = {lo[2], lo[3], hi[2], hi[3]};
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          mma_16816<Op>(o[n][m], a0, pb0[n], pb1[n]);
          mma_16816<Op>(o[n][m + 1], a1, pb0[n], pb1[n]);
        }
      }
    }
  };

  // The loads, through TMA or registers (one interface: run, bad_page).
  if constexpr (kTma) {
    TmaLoads<Cfg> loads(p, steps, smem_bytes, kv_head, warp, lane, g, c);
    loads.run(compute);
    bad_page = loads.bad_page;
  } else {
    RegisterLoads<Cfg> loads(p, steps, kv_head, part, g, c);
    loads.run(compute);
    bad_page = loads.bad_page;
  }

  // Let a programmatically dependent reduce start its launch while this
  // grid finishes; it still waits for our writes (griddepcontrol.wait).
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  // ---- merge the warps' states ----
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int x = 4; x < 32; x *= 2) {
        l_part[n][j] += __shfl_xor_sync(0xffffffffu, l_part[n][j], x);
        m_true[n][j] = fmaxf(m_true[n][j], __shfl_xor_sync(0xffffffffu, m_true[n][j], x));
      }
    }
  // The warps' O^T tiles go through shared memory as [warp][col][D], d
  // XOR-swizzled per (col, 32-element block): t = c + 4 * (g's bits above
  // those that select a bank) flips only bits inside a thread's vector, so
  // both the fragment stores (lanes g, c) and the row reads below (32
  // consecutive d) are free of bank conflicts (the plain layout put up to 8
  // lanes of a store on one bank; with it the stores took 0.6 us per CTA).
  // Column tiles swizzle alike (each n-tile's stores are instructions of their own).
  // Teams of two: [team][col][D], each warp its part of d; the state once.
  constexpr int kEV = Cfg::kVElemsPerVec;
  auto o_index = [](int col, int d) {
    const int tcol = NT == 1 ? col : col % 8;
    return col * D + (d ^ ((tcol >> 1) + 4 * ((d >> 5) & (kEV / 4 - 1))));
  };
  float* my_o = obuf + team * kCols * D;
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int m = 0; m < Cfg::kDTiles; ++m) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int e = 2 * m + r / 2, col = 8 * n + 2 * c + r % 2;
        my_o[o_index(col, part * Cfg::kPartD + ((e / kEV) * 8 + g) * kEV + e % kEV)] = o[n][m][r];
      }
    }
  if (g == 0 && part == 0) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        m_buf[team * kCols + 8 * n + 2 * c + j] = m_run[n][j];
        l_buf[team * kCols + 8 * n + 2 * c + j] = l_part[n][j];
        mt_buf[team * kCols + 8 * n + 2 * c + j] = m_true[n][j];
      }
  }
  const bool bad = __syncthreads_or(bad_page);

  // Warp w writes the outputs of columns w, w + kWarps: each of its lanes
  // merges those columns' team states (log2 units, softmax_state.hpp;
  // the same values in every lane), then sums 32 consecutive d per pass. No
  // second barrier, and every warp has work at a group of 4 (warp 0
  // computing every weight behind a second barrier, then a rolled pass
  // over all outputs, cost 0.4-0.5 us per launch at 1x1024: v8.2 in
  // bench/RESULTS.md).
  const float qnan = __int_as_float(0x7fc00000);
  constexpr int kRec = softmax::record_floats(kHD);
  float* const my_rec = reinterpret_cast<float*>(smem_bytes + Cfg::kRecOffset);  // [col] records
  static_assert(kHD % 32 == 0 && kCols % Cfg::kWarps == 0, "whole passes over the tile's outputs");
#pragma unroll 1
  for (int col = warp; col < cols; col += Cfg::kWarps) {
    // The teams' states against their reference maxima; MT: the exact max.
    constexpr int kT = Cfg::kTeams;
    softmax::State<softmax::Log2> ws[kT];
    softmax::Merge<softmax::Log2> mg;
    float MT = kNegInf;
#pragma unroll
    for (int w = 0; w < kT; ++w) {
      ws[w] = {m_buf[w * kCols + col], l_buf[w * kCols + col]};
      mg.see_max(ws[w]);  // a NaN logit's l spreads through the sums below
      MT = fmaxf(MT, mt_buf[w * kCols + col]);
    }
    mg.nan = bad;
    if constexpr (kRuns) {  // the sink joins the final normalisation only (not a split's record)
      constexpr float kLog2e = 1.4426950408889634f;
      if (p.sinks && !p.cluster_merge && p.workspace == nullptr) mg.sink = p.sinks[rc.head(col)] * kLog2e;
    }
    // wt[w] scales team w's O^T to the merged state; L = sum of the weights.
    float wt[kT];
#pragma unroll
    for (int w = 0; w < kT; ++w) wt[w] = ws[w].scale(mg.M);
    static_assert(kT == 4 || kT == 2, "the sum of L below");
    float L = ws[0].l * wt[0] + ws[1].l * wt[1];
    if constexpr (kT == 4) L += ws[2].l * wt[2] + ws[3].l * wt[3];
#pragma unroll
    // L = 0: nothing attended, output 0. A NaN L (some team's l) makes every
    // weight NaN, also where no team attended a finite logit (M = -inf).
    for (int w = 0; w < kT; ++w) wt[w] = L == 0.0f ? 0.0f : wt[w] / mg.denominator(L);
    const int64_t qh = int64_t(head0 + col);
    // The column's output row: (sequence or query row) * num_q_heads + q head.
    const int64_t out_row = kRuns ? int64_t(rc.row(col)) * p.num_q_heads + rc.head(col) : seq * p.num_q_heads + qh;
    // The split's record (cluster merge: in shared memory), or none: the output.
    float* rec = nullptr;
    if (p.cluster_merge) {
      rec = my_rec + col * kRec;
    } else if (p.workspace != nullptr) {
      rec = p.workspace + softmax::record_index(out_row, p.num_splits, split) * kRec;
    }
    // Paired heads: the column's own head is the upper half of the tile's D.
    const int d0 = kPair && col >= cols / 2 ? kHD : 0;
#pragma unroll
    for (int i = 0; i < kHD / 32; ++i) {
      const int d = lane + 32 * i;
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < kT; ++w) v += obuf[w * kCols * D + o_index(col, d0 + d)] * wt[w];
      v = mg.nan ? qnan : v * p.v_factor;
      if (rec == nullptr) {
        p.out[out_row * kHD + d] = codec::float_to_bf16(v);
      } else {
        rec[d] = v;
      }
    }
    if (rec != nullptr && lane == 0) softmax::store_state(rec, kHD, softmax::to_record(mg.merged(L), MT));
    if constexpr (kRuns) {
      if (rec == nullptr && p.lse != nullptr && lane == 0) {  // the single pass's lse (split-K: the merge's)
        const softmax::State<> st = softmax::to_record(mg.merged(L), MT);
        softmax::Merge<> ln;
        ln.M = st.m;
        ln.nan = st.is_nan();
        p.lse[out_row] = ln.lse(st.l);
      }
    }
  }
  if (p.cluster_merge) {
    if constexpr (kRuns) {
      const int32_t num_q_heads = p.num_q_heads;
      cluster_merge_records<kHD, true>(p, my_rec, cols, [rc, num_q_heads](int col) {
        return ColumnRow{int64_t(rc.row(col)) * num_q_heads + rc.head(col), rc.head(col)};
      });
    } else {
      const int64_t row0 = seq * p.num_q_heads + head0;  // the tile's first output row
      cluster_merge_records<kHD, false>(p, my_rec, cols, [row0, head0](int col) {
        return ColumnRow{row0 + col, head0 + col};
      });
    }
  }
}

}  // namespace metrale::kernels
