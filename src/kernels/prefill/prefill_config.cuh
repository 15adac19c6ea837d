// The prefill kernel's compile-time configuration (prefill_kernel.cuh): tile
// sizes, warpgroup roles and register budgets, the shared-memory layout.
#pragma once

#include <cstdint>

#include "kernels/formats/format_policy.cuh"
#include "plan/decode_geometry.hpp"

namespace metrale::kernels {

template <class Fmt, int D>
struct PrefillConfig {
  static_assert(D == 64 || D == 128 || D == 256, "head_dim");
  using Op = typename Fmt::Op;  // the MMA operands: bf16, or f16 for the dequantised formats
  static constexpr int kHeadDim = D;
  // A CTA: kRows packed (query row, q head) rows of one kv head, two
  // consumer warpgroups of 64 rows each (M of their m64 MMAs) and one
  // producer warpgroup that fills the K/V stages.
  static constexpr int kRows = geometry::kPrefillRowsPerCta;
  static constexpr int kConsumers = 2;
  static_assert(kRows == 64 * kConsumers, "64 rows per consumer warpgroup");
  static constexpr int kThreads = 128 * (kConsumers + 1);
  // kv tokens per tile: the N of S = Q K^T, the K of O += P V. head_dim 256
  // halves it to keep O (128 registers) and S in a consumer's budget; bf16
  // at head_dim 128 takes 176 (FlashAttention 3's N there), which spreads
  // a step's fixed work (barriers, turns, waits, shuffles) over 1.375 times
  // the positions, in two stages (S 88 + O 64 + P 44 registers); so does
  // bf16 at head_dim 64, in three (faster from 4096 tokens, a little
  // slower at 1024).
  static constexpr bool kWideTile = Fmt::kBits == 16 && D <= 128;
  static constexpr int kTileTokens = kWideTile ? 176 : (D <= 128 ? 128 : 64);
  // Shared memory: Q [kRows x D], then per stage K and V [kTileTokens x D],
  // all 16-bit swizzled tiles (wgmma.cuh); then the barriers, full and
  // empty, for K and for V, per stage (8 bytes each), and the 1024-byte
  // alignment of the base. K and V of a stage have barriers of their own: a
  // consumer gives K back once its QK completed, a step before V, so the
  // producer refills K a step sooner.
  static constexpr int kQBytes = kRows * D * 2;
  static constexpr int kTileBytes = kTileTokens * D * 2;
  static constexpr int kStageBytes = 2 * kTileBytes + 4 * 8;  // K, V and their four barriers
  static constexpr int kFixedBytes = kQBytes + 1024;
  // kOverlap (head_dim <= 128): a consumer issues tile t's PV with tile
  // t + 1's QK and holds two stages at once, so the ring has three where
  // they fit in shared memory. It holds O, S and one P fragment tile (160
  // registers at head_dim 128). At head_dim 256 O alone is 128 registers:
  // MMAs and softmax run in turn with two stages. The dequantising formats
  // keep a producer of 104 registers (the raw codes of a tile's K and of the
  // tile before's V in flight at once, and the next K row located ahead: all
  // of the CTA's 168 x 384 registers; in passes, with fewer, it was
  // latency-bound).
  static constexpr bool kOverlap = D <= 128;
  // (Two stages serve the overlap too: K and V have barriers of their own,
  // so K of t + 1 fills the slot of K of t - 1 while V of t - 1 is read.
  // 176-position tiles take two at head_dim 128, where three would need
  // 296 KB, and three at 64: 148 KB.)
  static constexpr int kStages = kOverlap && kFixedBytes + 3 * kStageBytes <= 227 * 1024 ? 3 : 2;
  // Register budgets (setmaxnreg) move registers between the warpgroups of
  // the CTA's own allocation (launch bounds of kThreads: 168 per thread,
  // ptxas), so they must fit in it: an increase that does not fit waits forever.
  // At head_dim 256 the dequantising producer fetches V only after storing K
  // (kFetchSplit), for the consumers' 128 O accumulators.
  static constexpr bool kFetchSplit = D == 256;
  static constexpr int kProducerRegs = Fmt::kBits == 16 ? 40 : (kFetchSplit ? (Fmt::kBits == 8 ? 64 : 56) : 104);
  static constexpr int kConsumerRegs = Fmt::kBits == 16 ? 232 : (kFetchSplit ? (Fmt::kBits == 8 ? 216 : 224) : 200);
  static constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kLaunchRegs * kThreads, "the CTA's registers");

  static constexpr int kKOffset(int s) { return kQBytes + s * 2 * kTileBytes; }
  static constexpr int kVOffset(int s) { return kQBytes + s * 2 * kTileBytes + kTileBytes; }
  static constexpr int kBarOffset = kQBytes + kStages * 2 * kTileBytes;
  static constexpr int kSmemBytes = kFixedBytes + kStages * kStageBytes;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per CTA");
};

}  // namespace metrale::kernels
