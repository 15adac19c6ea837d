// A sequence's length and query run as every kernel reads them from device
// memory (docs/decisions.md, bad input at run time): the length clamped to
// its block-table row (negative: 0), the run's length to [0, length]; a
// missing q_start is one row per sequence. `P` is any params struct with
// seq_lens, q_start, max_blocks_per_seq and block_size; the sequence index
// keeps its caller's integer type (its address arithmetic with it). Read
// after the kernel's griddepcontrol.wait.
#pragma once

#include <cstdint>

#include "metrale/ops.hpp"

namespace metrale::kernels {

template <class P, class Seq>
__device__ __forceinline__ int32_t clamped_seq_len(const P& p, Seq seq) {
  return min(max(p.seq_lens[seq], 0), p.max_blocks_per_seq * p.block_size);
}

struct QueryRun {
  int32_t row0;  // its first row of q
  int32_t len;   // its rows
};
template <class P, class Seq>
__device__ __forceinline__ QueryRun query_run(const P& p, Seq seq, int32_t seq_len) {
  const int32_t row0 = p.q_start ? p.q_start[seq] : int32_t(seq);
  return QueryRun{row0, p.q_start ? min(max(p.q_start[seq + 1] - row0, 0), seq_len) : 1};
}

// The pages a run attends: from its first row's window start to the
// sequence's end.
__device__ __forceinline__ PageRange run_pages(int32_t seq_len, int32_t run_len, int32_t window, int32_t block_size) {
  return PageRange{query_range(seq_len, run_len, 0, window).begin / block_size,
                   (seq_len + block_size - 1) / block_size};
}

}  // namespace metrale::kernels
