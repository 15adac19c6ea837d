// Paged decode attention, written once against a KV-format policy
// (kernels/formats/format_policy.cuh), for single pass and split-K. This
// file is the kernel body (the CTA's work, its columns' ranges, the state,
// the loads driving the mainloop, the output rows); its parts:
//   decode_config.cuh          the compile-time configuration, StepBuffers
//   decode_steps.cuh           the split's steps per warp and their page ids
//   decode_q_fragments.cuh     Q^T as the QK B fragments
//   decode_register_loads.cuh  the register load pipeline  } one interface:
//   decode_tma_loads.cuh       the TMA load pipeline       } run(compute)
//   decode_mainloop.cuh        compute: QK, logits, online softmax, PV per step
//   decode_epilogue.cuh        the warps' merge, a column's weights and outputs
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

#include "kernels/common/kernel_flags.hpp"
#include "kernels/common/mma.cuh"
#include "kernels/common/sequence_run.cuh"
#include "kernels/decode/decode_cluster_merge.cuh"
#include "kernels/decode/decode_config.cuh"
#include "kernels/decode/decode_epilogue.cuh"
#include "kernels/decode/decode_mainloop.cuh"
#include "kernels/decode/decode_q_fragments.cuh"
#include "kernels/decode/decode_register_loads.cuh"
#include "kernels/decode/decode_runs.cuh"
#include "kernels/decode/decode_steps.cuh"
#include "kernels/decode/decode_tma_loads.cuh"
#include "metrale/ops.hpp"
#include "metrale/softmax_state.hpp"

namespace metrale::kernels {

// kColumns query_runs: columns are (query row, q head) pairs of query runs,
// with sinks, soft-cap and lse (decode_runs.cuh); decode with those options
// runs it too.
// NT: the runs kernel's n-tiles of 8 columns; HP: its parts of head_dim
// (teams of two warps; DecodeConfig). The bound states the occupancy the
// split planner counts on (geometry::kDecodeCtasPerSm): without it ptxas
// held some instantiations at 168 registers (3 CTAs per SM, which their
// shared memory does not allow) and spilled.
template <class Fmt, int D, KvLoads kLoads, KvHeads kHeads, Columns kColumns = Columns::heads, int NT = 1, int HP = 1>
__global__ void __launch_bounds__(
    DecodeConfig<Fmt, D, kLoads == KvLoads::tma, kHeads == KvHeads::paired, NT, HP>::kThreads,
    geometry::kDecodeCtasPerSm)
    paged_decode_kernel(const __grid_constant__ KernelParams<kColumns == Columns::query_runs> p) {
  constexpr bool kTma = kLoads == KvLoads::tma, kPair = kHeads == KvHeads::paired;
  constexpr bool kRuns = kColumns == Columns::query_runs;
  static_assert(!(kRuns && kPair), "query runs take one kv head per CTA");
  static_assert(kRuns || (NT == 1 && HP == 1), "decode serves a group of at most 8 q heads per tile");
  using Cfg = DecodeConfig<Fmt, D, kTma, kPair, NT, HP>;
  constexpr int kHD = Cfg::kHeadDim;  // elements of a q row, an output row, a record
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
  const int32_t seq_len = clamped_seq_len(p, seq);
  const int32_t first_pos = window_start(seq_len, p.sliding_window);
  RunColumns rc{};
  if constexpr (kRuns) {
    rc.seq_len = seq_len;
    const QueryRun run = query_run(p, seq, seq_len);
    rc.row0 = run.row0;
    rc.run_len = run.len;
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
  if constexpr (kRuns) decode_column_ranges(rc, cols, c, col_begin, col_end);

  uint32_t qf[NT][Cfg::kKSteps][2];
  decode_load_q<Fmt, Cfg, kPair, kRuns, NT>(p, rc, seq, head0, cols, part, g, c, qf);

  // O^T tiles: o[n][m] = rows (g, g+8) of head_dim tile m (of the warp's
  // part), columns 8n + (2c, 2c+1).
  float o[NT][Cfg::kDTiles][4];
  float m_run[NT][2], m_true[NT][2], l_part[NT][2];
  decode_empty_state(o, m_run, m_true, l_part);
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

  const bool odd_tokens_swapped = Cfg::kSwapOddTokens && (g & 1);
  const DecodeStep<Fmt, Cfg, D, kPair, kRuns, NT, HP> compute{
      p,         qf,          o,          m_run,      m_true,    l_part,      col_begin,          col_end,
      s_exchange, s_parity,   cols,       split_pos0, first_pos, seq_len,     span_begin,         span_end,
      inner_begin, inner_end, odd_tokens_swapped, g, c,        lane,        part};

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

  // ---- epilogue: merge the warps' states, write the columns ----
  decode_merge_warps<Cfg, D, NT, HP>(o, m_run, m_true, l_part, obuf, m_buf, l_buf, mt_buf, team, part, g, c);
  const bool bad = __syncthreads_or(bad_page);
  // Warp w writes the outputs of columns w, w + kWarps: each of its lanes
  // merges those columns' team states (log2 units, softmax_state.hpp;
  // the same values in every lane), then sums 32 consecutive d per pass. No
  // second barrier, and every warp has work at a group of 4 (warp 0
  // computing every weight behind a second barrier, then a rolled pass
  // over all outputs, was slower at small batches).
  constexpr int kRec = softmax::record_floats(kHD);
  float* const my_rec = reinterpret_cast<float*>(smem_bytes + Cfg::kRecOffset);  // [col] records
  static_assert(kHD % 32 == 0 && kCols % Cfg::kWarps == 0, "whole passes over the tile's outputs");
#pragma unroll 1
  for (int col = warp; col < cols; col += Cfg::kWarps) {
    // The teams' states against their reference maxima; MT: the exact max.
    constexpr int kT = Cfg::kTeams;  // teams of warps with states of their own
    softmax::State<softmax::Log2> ws[kT];
    softmax::Merge<softmax::Log2> mg;
    float MT = kNegInf;
    decode_team_states<Cfg>(m_buf, l_buf, mt_buf, col, ws, mg, MT);
    mg.nan = bad;
    if constexpr (kRuns) {  // the sink joins the final normalisation only (not a split's record)
      constexpr float kLog2e = 1.4426950408889634f;
      if (p.sinks && !p.cluster_merge && p.workspace == nullptr) mg.sink = p.sinks[rc.head(col)] * kLog2e;
    }
    // wt[w] scales team w's O^T to the merged state; L = sum of the weights.
    float wt[kT];
    const float L = decode_team_weights<Cfg>(ws, mg, wt);
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
    decode_store_column<Cfg, D, NT, kRuns>(p, obuf, col, d0, wt, mg, L, MT, rec, out_row, lane);
  }
  if (p.cluster_merge) decode_cluster_merge<Cfg, kRuns>(p, rc, my_rec, cols, seq, head0);
}

}  // namespace metrale::kernels
