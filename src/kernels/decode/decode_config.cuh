// The decode kernel's compile-time configuration (one instantiation: format
// policy x head_dim x load path x kv-head pairing): the thread's share of
// each 16-token step, how many steps are in flight, the TMA ring and the
// shared-memory map, each with the measurement behind its value; and the
// registers one thread holds a group of steps in (StepBuffers).
#pragma once

#include <cstdint>

#include "kernels/decode/decode_params.hpp"
#include "kernels/formats/format_policy.cuh"

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
// Most steps per TMA stage (one step per stage was slower).
constexpr int kTmaMaxStageSteps = 2;

// kTma: K/V tiles reach shared memory through TMA (a per-warp ring of
// stages, see the kernel) instead of registers. The register path serves
// NVFP4, and bf16/fp8 where the driver cannot encode the tensor maps.
// kPair: D = 128 made of two adjacent kv heads of head_dim 64
// (decode_pairs_kv_heads): each thread's K vectors lie in one head (k_vector),
// so QK k-steps 0..3 are the first head's and 4..7 the second's.
// NT: n-tiles of 8 columns per CTA (the runs kernel's column tiles,
// geometry::runs_col_tiles): every dequantised K and V fragment feeds NT
// MMAs, so one pass over the pages serves 8 * NT (query row, q head) columns.
// HP: parts of head_dim (1 or 2; geometry::runs_can_split_head_dim). With 2
// the warps work in teams of two: both take the same steps, each loads and
// dequantises one half of every K and V row (part = warp % 2), computes S
// over its half for all columns, adds its teammate's half through shared
// memory (decode_kernel.cuh) and runs PV for its half of head_dim. A team
// keeps one softmax state (computed by both warps); no element is
// dequantised twice, and two n-tiles cost a thread the accumulator
// registers of one n-tile of whole rows.
template <class Fmt, int D, bool kTma = false, bool kPair = false, int NT = 1, int HP = 1>
struct DecodeConfig {
  static_assert(!kPair || D == 128, "pairs of head_dim-64 heads");
  static_assert(NT >= 1 && (!kPair || NT == 1), "column tiles of unpaired heads");
  static_assert(HP == 1 || (HP == 2 && !kTma && !kPair && NT == 2), "head_dim parts on the register path, 2 n-tiles");
  using Format = Fmt;
  static constexpr int kD = D;            // the kernel's head_dim (128 for a pair)
  static constexpr bool kTmaPath = kTma;  // K/V through the TMA ring
  static constexpr bool kPaired = kPair;
  static constexpr int kHeadDim = kPair ? D / 2 : D;  // of q, the output and the split records
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kParts = HP;
  static constexpr int kTeams = kWarps / HP;  // warps (HP 1) or pairs of warps (HP 2) walking the steps
  static constexpr int kPartD = D / HP;       // head_dim elements a warp loads, dequantises and outputs
  static constexpr int kColTiles = NT;
  static constexpr int kCols = kDecodeQHeadsPerCta * NT;  // columns per CTA (the MMAs' N, 8 per n-tile)
  static_assert(kDecodeQHeadsPerCta == 8, "n-tiles of 8 columns");
  static constexpr int kStepTokens = 16;
  static constexpr int kRowBytes = D * Fmt::kBits / 8;         // a token's row (of the kv head)
  static constexpr int kPartBytes = kPartD * Fmt::kBits / 8;   // the warp's part of it
  // K: a thread loads a quarter of each of two token rows' parts (paired: a
  // quarter of each head's half).
  static constexpr int kKQuarterBytes = kPair ? kPartBytes / 8 : kPartBytes / 4;
  static constexpr int kKVecBytes = kKQuarterBytes < 16 ? kKQuarterBytes : 16;
  static constexpr int kKVecs = kPartBytes / (4 * kKVecBytes);
  static constexpr int kKElemsPerVec = kKVecBytes * 8 / Fmt::kBits;
  static constexpr int kKWords = kPartBytes / 16;
  // V: a thread loads an eighth of each of four token rows' parts.
  static constexpr int kVVecBytes = kPartBytes / 8 < 16 ? kPartBytes / 8 : 16;
  static constexpr int kVVecs = kPartBytes / (8 * kVVecBytes);
  static constexpr int kVElemsPerVec = kVVecBytes * 8 / Fmt::kBits;
  static constexpr int kVWords = kPartBytes / 32;
  static constexpr int kKSteps = kPartD / 16;
  static constexpr int kDTiles = kPartD / 16;
  // 16-token steps loaded together. HBM latency is hidden only by bytes in
  // flight, so narrower formats load more steps at once: about the same
  // bytes per thread for every format, bounded by registers.
  static constexpr int kStepBytesPerThread = kPartBytes;  // two K quarter rows + four V eighth rows
  // Budgets chosen so that the decode instantiations do not spill (ptxas
  // -v); the runs kernel at head_dim 256 is at the edge: with CUDA 13.0 its
  // bf16 register path spills 12 bytes and its fp8 TMA path 16 (255
  // registers). More steps in flight (nvfp4 384) or 3 CTAs per SM were slower.
  // Column tiles (NT > 1) hold NT sets of accumulators: the register
  // stages shrink by as much so that they do not spill either. Parts of
  // head_dim (HP 2) keep the bytes (twice the steps of half the bytes).
  static constexpr int kInFlightBytes = (Fmt::kBits == 4 ? 256 : 512) / NT;
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
  // slower than 2 stages of 2 steps, whose two independent steps the
  // compiler interleaves.
  static constexpr int kStages = kTma ? 1 : (kInFlightSteps >= 2 ? 2 : 1);
  static constexpr int kUnroll = kTma ? kTmaStageSteps : kInFlightSteps / kStages;
  // Group scales per thread and token (scaled formats: one per Fmt::kGroupSize elements).
  static constexpr int kKScaleBytes = Fmt::kScaled ? kKVecs * kKElemsPerVec / Fmt::kGroupSize : 1;
  static constexpr int kVScalesPerVec = kVElemsPerVec >= Fmt::kGroupSize ? kVElemsPerVec / Fmt::kGroupSize : 1;
  static constexpr int kVScaleBytes = Fmt::kScaled ? kVVecs * kVScalesPerVec : 1;
  static constexpr float kRescaleThreshold = 8.0f;  // log2 units: weights < 2^8
  // V tokens of thread (g, c) in a step: 2c + vtok(t), t = 0..3.
  __host__ __device__ static constexpr int vtok(int t) { return (t & 1) + 8 * (t >> 1); }

  // TMA ring: per warp kRingStages stages of kUnroll 16-token steps, per
  // step the K tile then the V tile, each [box][16 tokens][kBoxBytes] with
  // the boxes' 128B/64B/32B swizzle: 16-byte chunks of a token's row are
  // XORed with bits of its line index, which spreads the rows that a warp's
  // fragment reads hit at once over all banks (the dense layout put them on
  // the same banks: 2-4 way conflicts). NVFP4 stays on the
  // register path: its dequantization is instruction-bound and the TMA
  // path's issue and fill instructions made it slower at batch >= 64.
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
  // conflicts too, but its TMA fetch reached a lower fraction of the read
  // ceiling than 128-byte boxes.
  static constexpr bool kSwapOddTokens = kTma && kPair && kKVecs == 2;
  __host__ __device__ static constexpr int k_vector(int i, int c) {
    if (kSwapOddTokens) return i * 4 + c;
    return kTma && kKVecs >= 2 ? (i / 2) * 8 + 2 * c + i % 2 : i * 4 + c;
  }

  // Shared memory: the ring, then the teams' outputs for the merge (which
  // alias the ring: it is dead by then), softmax stats, the ring's barriers,
  // the CTA's split-K record (kCols records of D + 2 floats) for a cluster
  // merge. Teams of two exchange their partial S there before (the records
  // are written after the barrier that ends every team's steps; the outputs
  // before it): per team, part and step parity, NT float4 per lane.
  static constexpr int kOBufBytes = kTeams * kCols * D * 4;
  // The swizzle XORs bits of the absolute shared address, so the ring starts
  // at the first 1024-byte boundary of the CTA's dynamic shared memory
  // (only 16-byte alignment of that is guaranteed: a second CTA on the SM
  // starts wherever the first one's allocation ends).
  static constexpr int kRingAlign = 1024;
  static constexpr int kRingBytes = kTma ? kWarps * kRingStages * kStageBytes + kRingAlign : 0;
  static constexpr int kStatOffset = kOBufBytes > kRingBytes ? kOBufBytes : kRingBytes;
  static constexpr int kStatBytes = kTeams * kCols * 3 * 4;  // [team][col] m_run, l, exact max
  static constexpr int kBarOffset = (kStatOffset + kStatBytes + 7) / 8 * 8;
  static constexpr int kRecOffset = (kBarOffset + (kTma ? kWarps * kRingStages * 8 : 0) + 15) / 16 * 16;
  static constexpr int kRecBytes = kCols * (D + 2) * 4;
  static constexpr int kExchangeBytes = HP == 1 ? 0 : kTeams * HP * 2 * NT * 32 * 16;
  static constexpr int kSmemBytes = kRecOffset + (kRecBytes > kExchangeBytes ? kRecBytes : kExchangeBytes);

  static_assert(kSmemBytes <= 227 * 1024, "dynamic shared memory of one CTA on sm_90");
  static_assert(!kTma || kStageBytes % 1024 == 0, "stages keep the swizzle atoms 1024-byte aligned");
  static_assert(kKVecBytes >= 4 && kVVecBytes >= 4, "rows too narrow for word loads");
  static_assert(kKScaleBytes <= 4 && (!Fmt::kScaled || kVVecs == 1), "a thread's scale bytes of a token fit a word");
  static_assert(kKElemsPerVec % 4 == 0, "a k-step takes 4 elements per thread");
  static_assert(!Fmt::kScaled || kKElemsPerVec % Fmt::kGroupSize == 0, "K vectors must hold whole scale groups");
  static_assert(kDTiles % 2 == 0, "V is converted two tiles at a time");
  static_assert(k_permutation_ok<Fmt, kPartD>(), "Fmt::k_elem must permute the quarter row, one scale group per k-step");
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

}  // namespace metrale::kernels
