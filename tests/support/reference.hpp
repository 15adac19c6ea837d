// The independent float64 decode reference and the output comparison
// (SYSTEM.md 5), shared by the CPU and GPU tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "metrale/codec.hpp"
#include "support/problem.hpp"

namespace metrale::test {

// Dequantized value (f64) of element d of token position `pos` of sequence
// `seq`, kv head h, read from the cache bytes with the SYSTEM.md 3 layout math
// (no code shared with src/cpu). `which` = 'k' or 'v'.
double cache_value(const HostProblem& p, char which, int32_t seq, int32_t pos, int32_t h, int32_t d);

// Naive float64 attention over the dequantized cache, written independently
// of src/cpu: output [num_seqs, num_q_heads, head_dim]. A sequence of length 0
// outputs 0. A NaN in an attended K row makes the whole (seq, q head) output
// NaN; a NaN in an attended V element makes that output channel NaN. A page id
// outside [0, num_blocks) in a sequence's attended range makes that sequence's
// output NaN (the backends' contract); seq_lens must fit the table rows.
std::vector<double> reference_decode(const HostProblem& p);

struct Comparison {
  bool ok = true;
  double worst_rel_l2 = 0.0;
  int64_t nonfinite = 0;  // output elements that are NaN/Inf where the reference is finite
  std::string report;
};

// Per (seq, head) block: ||out - ref||_2 / ||ref||_2 <= tol over the channels
// where the reference is finite; a block whose reference is all zero must be
// exactly zero; an output NaN/Inf where the reference is finite fails (this
// also catches unwritten elements still holding the NaN poison). Where the
// reference is NaN the output must be NaN too. The report names the worst
// block and the first failing ones.
Comparison compare_decode(const bf16* out, const std::vector<double>& ref, int32_t num_seqs, int32_t num_q_heads,
                          int32_t head_dim, double tol = 1e-2);

}  // namespace metrale::test
