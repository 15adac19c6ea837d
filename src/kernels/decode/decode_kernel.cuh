// Paged decode attention, written once against a KV-format policy
// (kernels/formats/format_policy.cuh), for single pass and split-K.
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
// in the main loop, and the warps merge through shared memory at the end.
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

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common/mma.cuh"
#include "kernels/common/tma.cuh"
#include "kernels/decode/decode_params.hpp"
#include "kernels/formats/format_policy.cuh"
#include "metrale/ops.hpp"

namespace metrale::kernels {

// The K permutation of a format policy must be a bijection onto a thread's
// quarter row (D/4 elements), and for scaled formats keep the 4 elements of
// k-step kk in group kk/4 (the kernel applies one group scale per k-step).
template <class Fmt, int D>
constexpr bool k_permutation_ok() {
  constexpr int kN = D / 4;
  bool seen[kN] = {};
  for (int kk = 0; kk < D / 16; ++kk)
    for (int r = 0; r < 4; ++r) {
      const int e = Fmt::k_elem(kk, r);
      if (e < 0 || e >= kN || seen[e]) return false;
      if (Fmt::kScaled && e / Fmt::kGroupSize != 4 * kk / Fmt::kGroupSize) return false;
      seen[e] = true;
    }
  return true;
}

// Shared-memory budget of the TMA ring of one CTA (all warps' stages): 96
// KiB keeps 2 CTAs per SM, the occupancy the split planner counts on (3 CTAs
// per SM left the single-pass grids of 512 and 256 CTAs badly balanced).
constexpr int kTmaRingBytes = 96 * 1024;
// Most steps per TMA stage (one step per stage measured slower: bench/RESULTS.md v7 step 4).
constexpr int kTmaMaxStageSteps = 2;

// kTma: K/V tiles reach shared memory through TMA (a per-warp ring of
// stages, see the kernel) instead of registers. The register path serves
// NVFP4, and bf16/fp8 where the driver cannot encode the tensor maps.
// kPair: D = 128 made of two adjacent kv heads of head_dim 64
// (decode_pairs_kv_heads): each thread's K vectors lie in one head (k_vector),
// so QK k-steps 0..3 are the first head's and 4..7 the second's.
template <class Fmt, int D, bool kTma = false, bool kPair = false>
struct DecodeConfig {
  static_assert(!kPair || D == 128, "pairs of head_dim-64 heads");
  static constexpr int kHeadDim = kPair ? D / 2 : D;  // of q, the output and the split records
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kCols = kDecodeQHeadsPerCta;  // q heads per CTA (the MMA's N)
  static_assert(kCols == 8, "one n-tile of q heads");
  static constexpr int kStepTokens = 16;
  static constexpr int kRowBytes = D * Fmt::kBits / 8;
  // K: a thread loads a quarter of each of two token rows (paired: a
  // quarter of each head's half).
  static constexpr int kKQuarterBytes = kPair ? kRowBytes / 8 : kRowBytes / 4;
  static constexpr int kKVecBytes = kKQuarterBytes < 16 ? kKQuarterBytes : 16;
  static constexpr int kKVecs = kRowBytes / (4 * kKVecBytes);
  static constexpr int kKElemsPerVec = kKVecBytes * 8 / Fmt::kBits;
  static constexpr int kKWords = kRowBytes / 16;
  // V: a thread loads an eighth of each of four token rows.
  static constexpr int kVVecBytes = kRowBytes / 8 < 16 ? kRowBytes / 8 : 16;
  static constexpr int kVVecs = kRowBytes / (8 * kVVecBytes);
  static constexpr int kVElemsPerVec = kVVecBytes * 8 / Fmt::kBits;
  static constexpr int kVWords = kRowBytes / 32;
  static constexpr int kKSteps = D / 16;
  static constexpr int kDTiles = D / 16;
  // 16-token steps loaded together. HBM latency is hidden only by bytes in
  // flight, so narrower formats load more steps at once: about the same
  // bytes per thread for every format, bounded by registers.
  static constexpr int kStepBytesPerThread = kRowBytes;  // two K quarter rows + four V eighth rows
  // Budgets chosen so that no instantiation spills (ptxas -v; the bf16
  // head_dim-256 register path is at the edge: small changes elsewhere in
  // the kernel have spilled 8-20 bytes there); more steps in flight (nvfp4
  // 384) or 3 CTAs per SM were measured slower (bench/RESULTS.md, v5, v8).
  static constexpr int kInFlightBytes = Fmt::kBits == 4 ? 256 : 512;
  static constexpr int kUnrollRaw = kInFlightBytes / kStepBytesPerThread;
  static constexpr int kInFlightSteps = kUnrollRaw < 1 ? 1 : (kUnrollRaw > 8 ? 8 : kUnrollRaw);
  // TMA path: steps per ring stage (below); two where the ring still holds
  // two such stages per warp: half the waits, copies issued and page
  // bookkeeping per step.
  static constexpr int kStepBytes = 2 * kStepTokens * kRowBytes;
  static constexpr int kTmaStageSteps =
      kTmaMaxStageSteps >= 2 && kTmaRingBytes / (kWarps * 2 * kStepBytes) >= 2 ? 2 : 1;
  // Register stages of the software pipeline, at most two: 4 single-step
  // stages (loads issued 3 steps ahead instead of 2, same registers) were
  // measured 5-10% slower than 2 stages of 2 steps, whose two independent
  // steps the compiler interleaves (bench/RESULTS.md, v6).
  static constexpr int kStages = kTma ? 1 : (kInFlightSteps >= 2 ? 2 : 1);
  static constexpr int kUnroll = kTma ? kTmaStageSteps : kInFlightSteps / kStages;
  // NVFP4 group scales per thread and token (one per 16 elements).
  static constexpr int kKScaleBytes = Fmt::kScaled ? kKVecs * kKElemsPerVec / Fmt::kGroupSize : 1;
  static constexpr int kVScalesPerVec = kVElemsPerVec >= Fmt::kGroupSize ? kVElemsPerVec / Fmt::kGroupSize : 1;
  static constexpr int kVScaleBytes = Fmt::kScaled ? kVVecs * kVScalesPerVec : 1;
  static constexpr float kRescaleThreshold = 8.0f;  // log2 units: weights < 2^8

  // TMA ring: per warp kRingStages stages of kUnroll 16-token steps, per
  // step the K tile then the V tile, each [box][16 tokens][kBoxBytes] with
  // the boxes' 128B/64B/32B swizzle: 16-byte chunks of a token's row are
  // XORed with bits of its line index, which spreads the rows that a warp's
  // fragment reads hit at once over all banks (the dense layout put them on
  // the same banks: 2-4 way conflicts, 0.75 R for bf16). NVFP4 stays on the
  // register path: its dequantization is instruction-bound and the TMA
  // path's issue and fill instructions made it 2-8% slower at batch >= 64
  // (bench/RESULTS.md, v7).
  static_assert(!kTma || !Fmt::kScaled, "the TMA path carries no NVFP4 scale rows");
  static constexpr int kBoxBytes = kRowBytes < 128 ? kRowBytes : 128;
  static constexpr int kBoxes = kRowBytes / kBoxBytes;
  static constexpr int kSwizzleMask = kBoxBytes / 16 - 1;  // 7, 3, 1: line bits XORed into the chunk index
  static constexpr int kTileBytes = kStepTokens * kRowBytes;
  static constexpr int kStageBytes = kUnroll * 2 * kTileBytes;  // a multiple of 1024: swizzle atoms stay aligned
  static constexpr int kRingRaw = kTmaRingBytes / (kWarps * kStageBytes);
  static constexpr int kRingStages = kRingRaw < 2 ? 2 : (kRingRaw > 8 ? 8 : kRingRaw);
  // K vector of quarter row i that thread c reads. Registers: i*4 + c (any
  // order reads whole sectors). TMA: chunks 2c, 2c+1 of each 128-byte box,
  // so that the two tokens of a quarter warp (g, g+1: line indices of
  // opposite parity) take chunks of opposite parity after the swizzle.
  // Paired fp8 heads (64 bytes each in one 128-byte box): chunk c of head
  // i, which keeps each k-step in one head; tokens g and g+1 of a quarter
  // warp would then read the same banks, so odd tokens read the heads in
  // the other order (kSwapOddTokens). One 64-byte box per head avoided the
  // conflicts too, but its TMA fetch reached 0.70 R at 64x4096 against 0.84
  // with 128-byte boxes (session 6 in bench/RESULTS.md).
  static constexpr bool kSwapOddTokens = kTma && kPair && kKVecs == 2;
  __host__ __device__ static constexpr int k_vector(int i, int c) {
    if (kSwapOddTokens) return i * 4 + c;
    return kTma && kKVecs >= 2 ? (i / 2) * 8 + 2 * c + i % 2 : i * 4 + c;
  }

  // Shared memory: the ring, then the warps' outputs for the merge (which
  // alias the ring: it is dead by then), softmax stats, the ring's barriers,
  // the CTA's split-K record (kCols records of D + 2 floats) for a cluster
  // merge.
  static constexpr int kOBufBytes = kWarps * kCols * D * 4;
  // The swizzle XORs bits of the absolute shared address, so the ring starts
  // at the first 1024-byte boundary of the CTA's dynamic shared memory
  // (only 16-byte alignment of that is guaranteed: a second CTA on the SM
  // starts wherever the first one's allocation ends).
  static constexpr int kRingAlign = 1024;
  static constexpr int kRingBytes = kTma ? kWarps * kRingStages * kStageBytes + kRingAlign : 0;
  static constexpr int kStatOffset = kOBufBytes > kRingBytes ? kOBufBytes : kRingBytes;
  static constexpr int kStatBytes = kWarps * kCols * 3 * 4;  // [warp][col] m_run, l, exact max
  static constexpr int kBarOffset = (kStatOffset + kStatBytes + 7) / 8 * 8;
  static constexpr int kRecOffset = (kBarOffset + (kTma ? kWarps * kRingStages * 8 : 0) + 15) / 16 * 16;
  static constexpr int kSmemBytes = kRecOffset + kCols * (D + 2) * 4;

  static_assert(kSmemBytes <= 227 * 1024, "dynamic shared memory of one CTA on sm_90");
  static_assert(!kTma || kStageBytes % 1024 == 0, "stages keep the swizzle atoms 1024-byte aligned");
  static_assert(kKVecBytes >= 4 && kVVecBytes >= 4, "rows too narrow for word loads");
  static_assert(kKScaleBytes <= 4 && (!Fmt::kScaled || kVVecs == 1), "a thread's scale bytes of a token fit a word");
  static_assert(kKElemsPerVec % 4 == 0, "a k-step takes 4 elements per thread");
  static_assert(!Fmt::kScaled || kKElemsPerVec % Fmt::kGroupSize == 0, "K vectors must hold whole NVFP4 groups");
  static_assert(kDTiles % 2 == 0, "V is converted two tiles at a time");
  static_assert(k_permutation_ok<Fmt, D>(), "Fmt::k_elem must permute the quarter row, one scale group per k-step");
};

// Raw cache bytes of kUnroll 16-token steps, as one thread loaded them:
// K of tokens g, g+8 (index 0, 1), V of tokens 2c, 2c+1, 2c+8, 2c+9 (0..3).
template <class Cfg>
struct StepBuffers {
  uint32_t kw[Cfg::kUnroll][2][Cfg::kKWords];
  uint32_t vw[Cfg::kUnroll][4][Cfg::kVWords];
  // NVFP4 group-scale bytes of those rows, little-endian in one word per
  // token (whole words: byte arrays cost a mask per use).
  uint32_t ks[Cfg::kUnroll][2];
  uint32_t vs[Cfg::kUnroll][4];
  int32_t st0;                 // first step held
  uint32_t live;               // bit u: step st0+u is inside the split and on a valid page
};

// Loads `Bytes` (4, 8 or 16) bytes of shared memory into consecutive words.
template <int Bytes>
__device__ __forceinline__ void load_smem_vec(const uint8_t* ptr, uint32_t* w) {
  if constexpr (Bytes == 16) {
    const uint4 v = *reinterpret_cast<const uint4*>(ptr);
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if constexpr (Bytes == 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(ptr);
    w[0] = v.x, w[1] = v.y;
  } else {
    static_assert(Bytes == 4, "vector width");
    w[0] = *reinterpret_cast<const uint32_t*>(ptr);
  }
}

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

// Loads `Bytes` (1 or 2) read-only bytes, zero-extended.
template <int Bytes>
__device__ __forceinline__ uint32_t load_bytes(const uint8_t* ptr) {
  static_assert(Bytes == 1 || Bytes == 2, "scale run width");
  if constexpr (Bytes == 2) return __ldg(reinterpret_cast<const uint16_t*>(ptr));
  return __ldg(ptr);
}

// Split-K merged inside a cluster: the num_splits CTAs of a (sequence, kv
// head, q-head tile) are one thread-block cluster, each holding its split's
// records in shared memory (`recs`: [col][D + 2], the workspace layout of
// SYSTEM.md 4). After a cluster barrier, CTA `rank` merges every num_splits-th
// slice of the tile's outputs by the reduce's rule (reduce.cu), reading the
// other CTAs' records through distributed shared memory, and writes them to
// `out`; a second barrier keeps every CTA's records alive until all reads are
// done. Replaces the workspace round trip and the reduce launch.
template <int D>
__device__ void cluster_merge_records(const DecodeParams& p, const float* recs, int64_t seq, int head0, int cols) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  const int S = p.num_splits, rank = int(cluster.block_rank());
  const float ninf = -__int_as_float(0x7f800000);
  for (int idx = rank * int(blockDim.x) + threadIdx.x; idx < cols * D; idx += S * int(blockDim.x)) {
    const int col = idx / D, d = idx % D;
    float M = ninf;
    bool nan = false;
    for (int s = 0; s < S; ++s) {
      const float* r = cluster.map_shared_rank(recs, s) + col * (D + 2);
      const float m = r[D], l = r[D + 1];
      nan |= (m != m) || (l != l);
      M = fmaxf(M, m);
    }
    float a = 0.0f, L = 0.0f;
    if (!nan && M != ninf) {
      for (int s = 0; s < S; ++s) {
        const float* r = cluster.map_shared_rank(recs, s) + col * (D + 2);
        if (r[D] == ninf) continue;  // empty split
        const float w = r[D + 1] * expf(r[D] - M);
        a += w * r[d];
        L += w;
      }
      a /= L;
    } else if (nan) {
      a = __int_as_float(0x7fc00000);
    }
    p.out[(seq * p.num_q_heads + head0 + col) * D + d] = codec::float_to_bf16(a);
  }
  cluster.sync();
}

template <class Fmt, int D, bool kTma, bool kPair>
__global__ void __launch_bounds__(DecodeConfig<Fmt, D, kTma, kPair>::kThreads)
    paged_decode_kernel(const __grid_constant__ DecodeParams p) {
  using Cfg = DecodeConfig<Fmt, D, kTma, kPair>;
  constexpr int kHD = Cfg::kHeadDim;  // elements of a q row, an output row, a record
  using Op = typename Fmt::Op;
  constexpr int U = Cfg::kUnroll;
  constexpr int kCols = Cfg::kCols;
  const float kNegInf = -__int_as_float(0x7f800000);

  extern __shared__ uint4 smem[];
  uint8_t* const smem_bytes = reinterpret_cast<uint8_t*>(smem);
  float* obuf = reinterpret_cast<float*>(smem);        // [warp][col][D]
  float* m_buf = reinterpret_cast<float*>(smem_bytes + Cfg::kStatOffset);  // [warp][col]
  float* l_buf = m_buf + Cfg::kWarps * kCols;
  float* mt_buf = l_buf + Cfg::kWarps * kCols;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;

  int64_t cta = blockIdx.x;
  const int tile = int(cta % p.head_tiles);
  cta /= p.head_tiles;
  const int kv_head = int(cta % p.num_kv_heads);
  const int64_t seq = cta / p.num_kv_heads;
  const int split = blockIdx.y;
  const int head0 = kv_head * p.group + tile * kCols;
  const int cols = min(kCols, p.group - tile * kCols);

  // Launched as a programmatic dependent (decode_launch.cuh): everything the
  // stream's earlier kernels wrote (q, lengths, tables, cache) is read after
  // this wait.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");

  // Never read past the block-table row, whatever seq_lens says.
  const int32_t seq_len = min(max(p.seq_lens[seq], 0), p.max_blocks_per_seq * p.block_size);
  const int32_t first_pos = window_start(seq_len, p.sliding_window);
  const PageRange pages = split_pages(attended_pages(seq_len, p.sliding_window, p.block_size), split, p.num_splits);

  // Q^T as B fragments of the QK k-steps, in registers: q head g of the
  // tile (zero past the group), head_dim positions of the K permutation:
  // slot r of k-step kk takes element Fmt::k_elem(kk, r) of the thread's K
  // stream, which is element e % EK of vector e / EK, i.e. head_dim
  // position Cfg::k_vector(e / EK, c) * EK + e % EK. Paired heads: every
  // column holds its q in both halves (each half's k-steps feed one
  // head's logits; the other head's products are never used, so the
  // columns need no zeros and a NaN in one head's K stays there).
  uint32_t qf[Cfg::kKSteps][2];
  const bf16* q_row = p.q + seq * p.q_stride + int64_t(head0 + g) * kHD;
#pragma unroll
  for (int kk = 0; kk < Cfg::kKSteps; ++kk) {
    float x[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      constexpr int kEK = Cfg::kKElemsPerVec;
      const int e = Fmt::k_elem(kk, r);
      const int d = Cfg::k_vector(e / kEK, c) * kEK + e % kEK;
      x[r] = g < cols ? codec::bf16_to_float(q_row[kPair ? d % kHD : d]) : 0.0f;
    }
    qf[kk][0] = pack2<Op>(x[0], x[1]);  // exact for bf16; f16 as docs/numerics.md says
    qf[kk][1] = pack2<Op>(x[2], x[3]);
  }

  // O^T tiles: o[m] = rows (g, g+8) of head_dim tile m, q heads (2c, 2c+1).
  float o[Cfg::kDTiles][4];
#pragma unroll
  for (int m = 0; m < Cfg::kDTiles; ++m) o[m][0] = o[m][1] = o[m][2] = o[m][3] = 0.0f;
  float m_run[2] = {kNegInf, kNegInf};   // reference max of q heads 2c, 2c+1 (log2 units)
  float m_true[2] = {kNegInf, kNegInf};  // this thread's exact max
  float l_part[2] = {0.0f, 0.0f};        // this thread's share of sum exp2(x - m_run)
  bool bad_page = false;

  const int steps_per_page = p.block_size / Cfg::kStepTokens;
  const int total_steps = (pages.end - pages.first) * steps_per_page;
  // block_size is a power of two: step -> (page, token) by shift and mask.
  const int spp_shift = 31 - __clz(steps_per_page);
  const int spp_mask = steps_per_page - 1;
  const int32_t* table = p.block_tables + seq * p.max_blocks_per_seq;
  const int32_t split_pos0 = pages.first * p.block_size;  // position of step 0

  // Per-thread byte offsets from the start of a step's 16 tokens in a page
  // (see the header for the patterns), computed once: per step only the
  // page's 64-bit base changes.
  const int32_t row_stride = p.num_kv_heads * Cfg::kRowBytes;  // bytes between tokens of a page
  const int32_t head_off = kv_head * Cfg::kRowBytes;
  // V tokens of a thread: 2c + vtok(t), t = 0..3.
  auto vtok = [](int t) { return (t & 1) + 8 * (t >> 1); };
  // NVFP4 (instruction-bound) holds them in registers; the wider formats'
  // register path (their fallback) has no registers to spare and recomputes.
  auto k_offset = [=](int t) { return head_off + (g + 8 * t) * row_stride + c * Cfg::kKVecBytes; };
  auto v_offset = [=](int t) { return head_off + (2 * c + vtok(t)) * row_stride + g * Cfg::kVVecBytes; };
  int32_t k_off[2], v_off[4];
#pragma unroll
  for (int t = 0; t < 2; ++t) k_off[t] = k_offset(t);
#pragma unroll
  for (int t = 0; t < 4; ++t) v_off[t] = v_offset(t);
  // NVFP4 scale section: byte (t*H + h)*D/16 + group of a page's section.
  // K: the scale bytes of vector i*4 + c (kKScalesPerVec of them, adjacent);
  // V: those of the thread's eighth row (vector g: group g*kVScalesPerVec,
  // or g/2 where a group spans two eighth rows).
  const int32_t srow = p.num_kv_heads * (D / Fmt::kGroupSize);
  constexpr int kKScalesPerVec = Cfg::kKElemsPerVec / Fmt::kGroupSize;
  int32_t ks_off[2], vs_off[4];
  {
    const int32_t scale_head = int32_t(p.scale_offset) + kv_head * (D / Fmt::kGroupSize);
    const int v_grp = Cfg::kVElemsPerVec >= Fmt::kGroupSize ? g * Cfg::kVScalesPerVec : g / 2;
#pragma unroll
    for (int t = 0; t < 2; ++t) ks_off[t] = scale_head + (g + 8 * t) * srow + c * kKScalesPerVec;
#pragma unroll
    for (int t = 0; t < 4; ++t) vs_off[t] = scale_head + (2 * c + vtok(t)) * srow + v_grp;
  }

  // Warps take groups of U consecutive steps round-robin.
  constexpr int kStride = Cfg::kWarps * U;
  // Page ids of the warp's steps come from a window held in its lanes (lane
  // j: step j % U of group win_base + j / U), 32 steps per block-table read,
  // the next window read while this one is used. So the K/V loads of a step
  // never wait on the read that locates them (a dependent read per step had
  // put a second memory latency on every step group's critical path, v6 in
  // bench/RESULTS.md), and a CTA's first stages are issued after one read
  // instead of one per stage.
  static_assert(32 % U == 0, "a window holds whole groups");
  constexpr int kWinGroups = 32 / U;
  // Lane j's page id in the window of groups k0 .. (0 past the split).
  auto window = [&](int k0) {
    const int st = warp * U + kStride * (k0 + lane / U) + lane % U;
    return st < total_steps ? __ldg(table + pages.first + (st >> spp_shift)) : 0;
  };
  int32_t win = window(0), win_next = window(kWinGroups);
  int win_base = 0;
  // Page ids of the steps of the warp's group k (k grows by one per call).
  auto group_pages = [&](int k, int32_t (&page)[U]) {
    if (k - win_base == kWinGroups) {
      win = win_next;
      win_base = k;
      win_next = window(k + kWinGroups);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) page[u] = __shfl_sync(0xffffffffu, win, (k - win_base) * U + u);
  };

  // Issues the loads of the warp's step group k (steps st0 .. st0+U-1) into
  // `b` (steps past the split or on a corrupt page load nothing and stay
  // zero).
  auto load = [&](StepBuffers<Cfg>& b, int k) {
    const int st0 = warp * U + kStride * k;
    int32_t pg[U];
    group_pages(k, pg);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int st = st0 + u;
      const int32_t page = pg[u];
      const bool page_ok = page >= 0 && page < p.num_blocks;
      bad_page |= !page_ok;  // corrupt table: never dereference, poison the output
      const bool live = st < total_steps && page_ok;
      if (u == 0) b.st0 = st0, b.live = 0;
      b.live |= uint32_t(live) << u;
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int w = 0; w < Cfg::kKWords; ++w) b.kw[u][t][w] = 0;
#pragma unroll
      for (int t = 0; t < 4; ++t)
#pragma unroll
        for (int w = 0; w < Cfg::kVWords; ++w) b.vw[u][t][w] = 0;
      b.ks[u][0] = b.ks[u][1] = 0;
      b.vs[u][0] = b.vs[u][1] = b.vs[u][2] = b.vs[u][3] = 0;
      if (!live) continue;  // nothing to load; compute() masks the whole step
      const int32_t tok0 = (st & spp_mask) * Cfg::kStepTokens;
      const int64_t page_off = int64_t(page) * p.page_stride;
      const uint8_t* kp = p.k_cache + page_off + tok0 * row_stride;
      const uint8_t* vp = p.v_cache + page_off + tok0 * row_stride;
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int i = 0; i < Cfg::kKVecs; ++i)
          load_vec<Cfg::kKVecBytes>(kp + (Fmt::kScaled ? k_off[t] : k_offset(t)) + i * 4 * Cfg::kKVecBytes,
                                    &b.kw[u][t][i * Cfg::kKVecBytes / 4]);
#pragma unroll
      for (int t = 0; t < 4; ++t)
#pragma unroll
        for (int i = 0; i < Cfg::kVVecs; ++i)
          load_vec<Cfg::kVVecBytes>(vp + (Fmt::kScaled ? v_off[t] : v_offset(t)) + i * 8 * Cfg::kVVecBytes,
                                    &b.vw[u][t][i * Cfg::kVVecBytes / 4]);
      if constexpr (Fmt::kScaled) {
        const uint8_t* ksp = p.k_cache + page_off + tok0 * srow;
        const uint8_t* vsp = p.v_cache + page_off + tok0 * srow;
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
          for (int i = 0; i < Cfg::kKVecs; ++i)
            b.ks[u][t] |= load_bytes<kKScalesPerVec>(ksp + ks_off[t] + i * 4 * kKScalesPerVec)
                          << (8 * i * kKScalesPerVec);
#pragma unroll
        for (int t = 0; t < 4; ++t) b.vs[u][t] = load_bytes<Cfg::kVScaleBytes>(vsp + vs_off[t]);
      }
    }
  };
  // Attention over the steps held in `b`: QK, online softmax, PV.
  const bool odd_tokens_swapped = Cfg::kSwapOddTokens && (g & 1);
  auto compute = [&](StepBuffers<Cfg>& b) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      // s = S^T rows (tokens g, g+8) x columns (q heads 2c, 2c+1), summed
      // in two independent MMA chains (even / odd k-steps) where registers
      // allow: a chain of dependent MMAs pays the full MMA latency per link.
      // Paired heads: the chains are the two heads' k-steps, and each
      // column takes its own head's (rows g, g+8 of odd g hold the second
      // head in the first chain where kSwapOddTokens: both chains see the
      // same q, as every column carries its q in both halves).
      float s[4] = {0.0f, 0.0f, 0.0f, 0.0f}, s_odd[4] = {0.0f, 0.0f, 0.0f, 0.0f};
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
        const bool odd_chain = kPair ? kk >= Cfg::kKSteps / 2 : kk % 2 && D <= 128;
        mma_16816<Op>(odd_chain ? s_odd : s, a, qf[kk][0], qf[kk][1]);
      }
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        if constexpr (kPair)
          s[r] = (2 * c + r % 2 >= cols / 2) != odd_tokens_swapped ? s_odd[r] : s[r];  // the column's head
        else
          s[r] += s_odd[r];
      }
      // Logits in log2 units; positions outside [first_pos, seq_len) are masked.
      // Most steps lie wholly inside the attended range (warp-uniform test)
      // and skip the V masking below.
      const int st = b.st0 + u;
      const bool live = (b.live >> u) & 1u;
      const int32_t pos0 = split_pos0 + st * Cfg::kStepTokens;  // pages hold whole steps
      const bool full = live && pos0 >= first_pos && pos0 + Cfg::kStepTokens <= seq_len;
      const bool ok_lo = live && pos0 + g >= first_pos && pos0 + g < seq_len;
      const bool ok_hi = live && pos0 + g + 8 >= first_pos && pos0 + g + 8 < seq_len;
      float x[4];
      x[0] = ok_lo ? s[0] * p.qk_log2_scale : kNegInf;
      x[1] = ok_lo ? s[1] * p.qk_log2_scale : kNegInf;
      x[2] = ok_hi ? s[2] * p.qk_log2_scale : kNegInf;
      x[3] = ok_hi ? s[3] * p.qk_log2_scale : kNegInf;
      float mx[2] = {fmaxf(x[0], x[2]), fmaxf(x[1], x[3])};
      m_true[0] = fmaxf(m_true[0], mx[0]);
      m_true[1] = fmaxf(m_true[1], mx[1]);
      // The reference max is shared by the 8 threads of a column (same c):
      // raised only when some logit passes it by the threshold.
      const bool raise = mx[0] > m_run[0] + Cfg::kRescaleThreshold || mx[1] > m_run[1] + Cfg::kRescaleThreshold;
      if (__any_sync(0xffffffffu, raise)) {
        float f[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 4));
          mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 8));
          mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 16));
          const float m_new = fmaxf(m_run[j], mx[j]);
          f[j] = m_new == kNegInf ? 1.0f : fast_exp2(m_run[j] - m_new);
          m_run[j] = m_new;
          l_part[j] *= f[j];
        }
#pragma unroll
        for (int m = 0; m < Cfg::kDTiles; ++m) {
          o[m][0] *= f[0], o[m][1] *= f[1];
          o[m][2] *= f[0], o[m][3] *= f[1];
        }
      }
      const float ref0 = m_run[0] == kNegInf ? 0.0f : m_run[0];
      const float ref1 = m_run[1] == kNegInf ? 0.0f : m_run[1];
      const float p0 = fast_exp2(x[0] - ref0), p1 = fast_exp2(x[1] - ref1);
      const float p2 = fast_exp2(x[2] - ref0), p3 = fast_exp2(x[3] - ref1);
      l_part[0] += p0 + p2;
      l_part[1] += p1 + p3;
      // P^T as the B fragment of PV: (tokens 2c, 2c+1 | 2c+8, 2c+9; q head g).
      const uint32_t pb0 = movmatrix_trans(pack2<Op>(p0, p1));
      const uint32_t pb1 = movmatrix_trans(pack2<Op>(p2, p3));
      // Unattended slots hold whatever the cache held (possibly NaN codes):
      // a zero weight times NaN is NaN, so their V operands are zeroed too.
      if (!full) {
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          const int32_t pos = pos0 + 2 * c + vtok(t);
          const bool ok = live && pos >= first_pos && pos < seq_len;
#pragma unroll
          for (int w = 0; w < Cfg::kVWords; ++w) b.vw[u][t][w] = ok ? b.vw[u][t][w] : 0u;
          if constexpr (Fmt::kScaled) b.vs[u][t] = ok ? b.vs[u][t] : 0u;
        }
      }
      // Two tiles at a time: elements 2m .. 2m+3 of the V eighth rows (one
      // NVFP4 scale group: groups are 8 or 16 aligned elements).
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
        mma_16816<Op>(o[m], a0, pb0, pb1);
        mma_16816<Op>(o[m + 1], a1, pb0, pb1);
      }
    }
  };

  if constexpr (kTma) {
    // The TMA pipeline: warp w takes the same step groups as in the register
    // path (U consecutive steps, groups round-robin over the warps) through
    // its own ring of S stages of one group. Lane 0 issues a stage's copies
    // (K and V tiles) and its mbarrier completes when they land; the warp
    // reads the stage into registers, refills it with the group S ahead,
    // then computes. No barrier between warps, S groups in flight per warp.
    constexpr int S = Cfg::kRingStages;
    constexpr int BB = Cfg::kBoxBytes;
    uint8_t* const ring = smem_bytes + ((Cfg::kRingAlign - (smem_addr(smem_bytes) & (Cfg::kRingAlign - 1))) &
                                        (Cfg::kRingAlign - 1));
    uint8_t* const tiles = ring + warp * S * Cfg::kStageBytes;
    const uint32_t bar0 = smem_addr(smem_bytes + Cfg::kBarOffset) + warp * S * 8;
    if (lane == 0) {
      for (int s = 0; s < S; ++s) mbar_init(bar0 + 8 * s, 1);
      fence_mbarrier_init();
    }
    __syncwarp();

    uint32_t live_bits = 0;  // bit s*U + u: step u of stage s is attended and on a valid page
    // Stage s <- steps st0 .. st0+U-1 of group k of this warp (steps past
    // the split copy nothing).
    // The caller's __syncwarp orders the warp's reads of the stage before
    // the copies that overwrite it, as a consumer's release of an "empty"
    // barrier does in a producer/consumer TMA pipeline. (A proxy fence here
    // compiles to MEMBAR.ALL.CTA, which also waits for the page-id loads in
    // flight.)
    auto issue = [&](int s, int k) {
      const int st0 = warp * U + kStride * k;
      const uint32_t bar = bar0 + 8 * s, dst = smem_addr(tiles) + s * Cfg::kStageBytes;
      uint32_t live = 0;
      int32_t page[U];
      group_pages(k, page);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const bool page_ok = page[u] >= 0 && page[u] < p.num_blocks;
        bad_page |= !page_ok;  // corrupt table: never dereference, poison the output
        live |= uint32_t(st0 + u < total_steps && page_ok) << u;
      }
      live_bits = (live_bits & ~(((1u << U) - 1) << (s * U))) | (live << (s * U));
      if (lane == 0) {
        if (live) {
          mbar_arrive_expect_tx(bar, __popc(live) * 2 * Cfg::kTileBytes);
#pragma unroll
          for (int u = 0; u < U; ++u) {
            if (!((live >> u) & 1u)) continue;
            const int tok0 = ((st0 + u) & spp_mask) * Cfg::kStepTokens;
            const uint32_t kdst = dst + u * 2 * Cfg::kTileBytes;
#pragma unroll
            for (int x = 0; x < Cfg::kBoxes; ++x) {
              tma_load_4d(kdst + x * 16 * BB, &p.k_map, bar, x * BB, kv_head, tok0, page[u]);
              tma_load_4d(kdst + Cfg::kTileBytes + x * 16 * BB, &p.v_map, bar, x * BB, kv_head, tok0, page[u]);
            }
          }
        } else {
          mbar_arrive(bar);
        }
      }
    };
    // Byte `b` of token `tok`'s row in a swizzled tile: box b / BB, chunk
    // index XORed with bits of the token's 128-byte line index, as TMA's
    // 128B/64B/32B swizzle stores it (DecodeConfig, TMA ring).
    auto tile_off = [](int tok, int b) {
      const int x = ((tok * BB) >> 7 & Cfg::kSwizzleMask) << 4;
      return (b / BB) * 16 * BB + tok * BB + ((b % BB) ^ x);
    };
    // Stage -> registers, in the layout the register path loads (header),
    // K vectors in Cfg::k_vector order.
    auto fill = [&](StepBuffers<Cfg>& b, int s, int st0, uint32_t live) {
      b.st0 = st0;
      b.live = live;
      constexpr int VB = Cfg::kKVecBytes, VVB = Cfg::kVVecBytes;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const uint8_t* kt = tiles + s * Cfg::kStageBytes + u * 2 * Cfg::kTileBytes;
        const uint8_t* vt = kt + Cfg::kTileBytes;
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
          for (int i = 0; i < Cfg::kKVecs; ++i)
            load_smem_vec<VB>(kt + tile_off(g + 8 * t, Cfg::k_vector(Cfg::kSwapOddTokens ? i ^ (g & 1) : i, c) * VB),
                              &b.kw[u][t][i * VB / 4]);
#pragma unroll
        for (int t = 0; t < 4; ++t)
#pragma unroll
          for (int i = 0; i < Cfg::kVVecs; ++i)
            load_smem_vec<VVB>(vt + tile_off(2 * c + vtok(t), (i * 8 + g) * VVB), &b.vw[u][t][i * VVB / 4]);
      }
    };

#pragma unroll
    for (int s = 0; s < S; ++s) issue(s, s);
    int k = 0, s = 0;
    uint32_t parity = 0;
    while (warp * U + kStride * k < total_steps) {
      mbar_wait(bar0 + 8 * s, parity);
      StepBuffers<Cfg> b;
      fill(b, s, warp * U + kStride * k, (live_bits >> (s * U)) & ((1u << U) - 1));
      __syncwarp();
      issue(s, k + S);
      compute(b);
      ++k;
      if (++s == S) s = 0, parity ^= 1u;
    }
    __syncthreads();  // every ring is dead (no copy in flight): obuf may alias them
  } else {
    // The pipeline: stage k's buffer is computed while the loads of the
    // kStages-1 following step groups are in flight. The stage loop is
    // unrolled so that every buffer index is static (registers, not local
    // memory).
    constexpr int S = Cfg::kStages;
    StepBuffers<Cfg> buf[S];
#pragma unroll
    for (int k = 0; k + 1 < S; ++k) load(buf[k], k);
    int k0 = 0;  // group held by buf[0]
    bool more = warp * U < total_steps;
    while (more) {
#pragma unroll
      for (int k = 0; k < S; ++k) {
        if (more) {
          load(buf[(k + S - 1) % S], k0 + k + S - 1);
          compute(buf[k]);
          more = warp * U + kStride * (k0 + k + 1) < total_steps;
        }
      }
      k0 += S;
    }
  }

  // Let a programmatically dependent reduce start its launch while this
  // grid finishes; it still waits for our writes (griddepcontrol.wait).
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  // ---- merge the warps' states ----
#pragma unroll
  for (int j = 0; j < 2; ++j) {
#pragma unroll
    for (int x = 4; x < 32; x *= 2) {
      l_part[j] += __shfl_xor_sync(0xffffffffu, l_part[j], x);
      m_true[j] = fmaxf(m_true[j], __shfl_xor_sync(0xffffffffu, m_true[j], x));
    }
  }
  // The warps' O^T tiles go through shared memory as [warp][col][D], d
  // XOR-swizzled per (col, 32-element block): t = c + 4 * (g's bits above
  // those that select a bank) flips only bits inside a thread's vector, so
  // both the fragment stores (lanes g, c) and the row reads below (32
  // consecutive d) are free of bank conflicts (the plain layout put up to 8
  // lanes of a store on one bank; with it the stores took 0.6 us per CTA).
  constexpr int kEV = Cfg::kVElemsPerVec;
  auto o_index = [](int col, int d) { return col * D + (d ^ ((col >> 1) + 4 * ((d >> 5) & (kEV / 4 - 1)))); };
  float* my_o = obuf + warp * kCols * D;
#pragma unroll
  for (int m = 0; m < Cfg::kDTiles; ++m) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int e = 2 * m + r / 2, col = 2 * c + r % 2;
      my_o[o_index(col, ((e / kEV) * 8 + g) * kEV + e % kEV)] = o[m][r];
    }
  }
  if (g == 0) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      m_buf[warp * kCols + 2 * c + j] = m_run[j];
      l_buf[warp * kCols + 2 * c + j] = l_part[j];
      mt_buf[warp * kCols + 2 * c + j] = m_true[j];
    }
  }
  const bool bad = __syncthreads_or(bad_page);

  // Warp w writes the outputs of columns w, w + kWarps: each of its lanes
  // derives those columns' warp weights from the four warps' states (the
  // same values in every lane), then sums 32 consecutive d per pass. No
  // second barrier, and every warp has work at a group of 4 (warp 0
  // computing every weight behind a second barrier, then a rolled pass
  // over all outputs, cost 0.4-0.5 us per launch at 1x1024: v8.2 in
  // bench/RESULTS.md).
  const float qnan = __int_as_float(0x7fc00000);
  float* const my_rec = reinterpret_cast<float*>(smem_bytes + Cfg::kRecOffset);  // [col][kHD + 2]
  static_assert(kHD % 32 == 0 && kCols % Cfg::kWarps == 0, "whole passes over the tile's outputs");
#pragma unroll 1
  for (int col = warp; col < cols; col += Cfg::kWarps) {
    float M = kNegInf, MT = kNegInf;
#pragma unroll
    for (int w = 0; w < Cfg::kWarps; ++w) {
      M = fmaxf(M, m_buf[w * kCols + col]);
      MT = fmaxf(MT, mt_buf[w * kCols + col]);
    }
    float wt[Cfg::kWarps];
#pragma unroll
    for (int w = 0; w < Cfg::kWarps; ++w) {
      const float mw = m_buf[w * kCols + col];
      wt[w] = mw == kNegInf ? 0.0f : exp2f(mw - M);
    }
    static_assert(Cfg::kWarps == 4, "the sum of L below");
    const float L = (l_buf[col] * wt[0] + l_buf[kCols + col] * wt[1]) +
                    (l_buf[2 * kCols + col] * wt[2] + l_buf[3 * kCols + col] * wt[3]);
#pragma unroll
    for (int w = 0; w < Cfg::kWarps; ++w) wt[w] = L == 0.0f ? 0.0f : wt[w] / L;  // L = 0: nothing attended, output 0
    const int64_t qh = int64_t(head0 + col);
    // The split's record (cluster merge: in shared memory), or none: the output.
    float* rec = nullptr;
    if (p.cluster_merge) {
      rec = my_rec + col * (kHD + 2);
    } else if (p.workspace != nullptr) {
      rec = p.workspace + ((seq * p.num_q_heads + qh) * p.num_splits + split) * (kHD + 2);
    }
    // Paired heads: the column's own head is the upper half of the tile's D.
    const int d0 = kPair && col >= cols / 2 ? kHD : 0;
#pragma unroll
    for (int i = 0; i < kHD / 32; ++i) {
      const int d = lane + 32 * i;
      float v = 0.0f;
#pragma unroll
      for (int w = 0; w < Cfg::kWarps; ++w) v += obuf[w * kCols * D + o_index(col, d0 + d)] * wt[w];
      v = bad ? qnan : v * p.v_factor;
      if (rec == nullptr) {
        p.out[(seq * p.num_q_heads + qh) * kHD + d] = codec::float_to_bf16(v);
      } else {
        rec[d] = v;
      }
    }
    if (rec != nullptr && lane == 0) {
      // The record's (m, l): the exact max (ln units) and L re-referenced to it.
      constexpr float kLn2 = 0.69314718055994530942f;
      rec[kHD] = bad ? qnan : (L == 0.0f ? kNegInf : MT * kLn2);
      rec[kHD + 1] = bad ? qnan : (L == 0.0f ? 0.0f : L * exp2f(M - MT));
    }
  }
  if (p.cluster_merge) cluster_merge_records<kHD>(p, my_rec, seq, head0, cols);
}

}  // namespace metrale::kernels
