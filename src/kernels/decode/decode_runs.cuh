// Query runs in the decode kernel (docs/spec.md 8): the columns of a CTA are
// (query row, q head) pairs of its kv head's group instead of q heads alone,
// so that one pass over the kv head's pages serves 8 * col_tiles of them
// (DecodeConfig's NT n-tiles): the run's rows j and the group's heads h in
// order, column fc = tile * 8 * NT + col, j = fc / group, h = fc % group (at
// GQA 4 and two n-tiles: four rows per tile).
// Each column masks its own causal range; V is masked to the union of the
// tile's ranges, so a NaN V inside that union reaches every column of the
// tile (0 * NaN), not only those attending it (docs/numerics.md).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "metrale/ops.hpp"

namespace metrale::kernels {

struct RunColumns {
  int32_t seq_len;  // the sequence's length, clamped to its block-table row
  int32_t row0;     // its run's first query row
  int32_t run_len;  // its run's rows, clamped to [0, seq_len]
  int32_t fc0;      // the tile's first column in the run's (row, head) order
  int32_t group;    // q heads per kv head
  int32_t kv_head;
  int32_t window;   // sliding window (0 = off)

  __device__ __forceinline__ int32_t row(int col) const { return row0 + (fc0 + col) / group; }
  __device__ __forceinline__ int32_t head(int col) const { return kv_head * group + (fc0 + col) % group; }
  // Positions [begin, end) column `col` attends.
  __device__ __forceinline__ QueryRange range(int col) const {
    return query_range(seq_len, run_len, (fc0 + col) / group, window);
  }
  // The pages any row of the run attends: the range split-K cuts (the same
  // for every tile of the sequence, and the CPU backend's run_pages).
  __device__ __forceinline__ PageRange pages(int32_t block_size) const {
    return PageRange{query_range(seq_len, run_len, 0, window).begin / block_size,
                     (seq_len + block_size - 1) / block_size};
  }
};

// tanh through the MUFU approximation (max relative error ~2^-11, far below
// the bf16 output's): the logit soft-cap c * tanh(s / c).
__device__ __forceinline__ float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace metrale::kernels
