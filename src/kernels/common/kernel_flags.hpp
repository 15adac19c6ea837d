// Named template flags of the attention kernels: an instantiation reads as
// paged_decode_kernel<Fp8Format, 128, KvLoads::tma, KvHeads::single, ...>
// rather than as a row of bools. The kernels turn them into the bool
// constants their bodies test.
#pragma once

namespace metrale::kernels {

// How the decode kernel's K/V steps reach registers.
enum class KvLoads : bool {
  registers,  // vector loads from global memory into register stages
  tma,        // TMA boxes into a per-warp shared-memory ring
};

// How many kv heads one decode CTA serves.
enum class KvHeads : bool {
  single,  // one kv head and its group of q heads
  paired,  // two adjacent kv heads of head_dim 64, run as one of 128
};

// What the decode kernel's columns are.
enum class Columns : bool {
  heads,       // the q heads of one token (decode)
  query_runs,  // (query row, q head) pairs of query runs, with sinks, soft-cap and lse
};

// Whether the prefill kernel runs as CTA pairs sharing their K/V tiles.
enum class TilePairs : bool {
  alone,   // each CTA loads its own tiles
  paired,  // clusters of two adjacent row tiles (prefill_pair.cuh)
};

}  // namespace metrale::kernels
