// The independent float64 decode reference (docs/spec.md 5) and the output
// comparison: the oracle of the tests, and the error column of the `metrale`
// command. Written without any code of src/cpu: the dequantization is the
// docs/spec.md 3 layout math done again here, the attention a naive float64 loop.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "metrale/codec.hpp"
#include "metrale/ops.hpp"

namespace metrale::test {

// Writes the K and V rows (head_dim values each) of position `pos` of
// sequence `seq`, kv head `kv_head`, as the reference should see them.
using KvRows = std::function<void(int32_t seq, int32_t pos, int32_t kv_head, double* k, double* v)>;

// The dequantized rows of `a.cache` (host memory) through a's block tables:
// codes x group scales x per-tensor scales. A page id outside
// [0, num_blocks) gives NaN rows (the backends' contract: that sequence's
// output is NaN).
KvRows cache_rows(const AttnArgs& a);

// Attention written from the spec again (docs/spec.md 8), in float64: row j
// of sequence s's run of n rows (one row per sequence without q_start: a
// decode) sits at p = L - n + j and attends [max(0, p + 1 - W), p]; logits
// sm_scale * q.k, soft-capped c * tanh(s / c) when a.softcap > 0; a.sinks[h]
// joins the denominator, e^(sink - M) with M = max(logits, sink). q head h
// reads kv head h / group; q, q_start, seq_lens and sinks are host pointers
// (a.out and the cache pointers are not read when `rows` does not read
// them). [rows, num_q_heads, head_dim]; a run over no positions outputs 0; a
// NaN in an attended K row makes the whole (row, q head) output NaN, a NaN
// in a V element that output channel. `lse` (when given) receives [rows,
// num_q_heads] of max + ln(sum e^(logit - max)) without the sink (-inf for
// an empty range, NaN where a logit is NaN). Throws std::invalid_argument
// when a length does not fit its table row.
std::vector<double> attention_f64(const AttnArgs& a, const KvRows& rows, std::vector<double>* lse = nullptr);

// attention_f64 over the dequantized cache: what every kernel must match.
std::vector<double> reference_attention(const AttnArgs& a);

struct Comparison {
  bool ok = true;
  double worst_rel_l2 = 0.0;  // worst ||out - ref||_2 / ||ref||_2 over the (seq, head) blocks
  double mean_rel_l2 = 0.0;   // mean of the same over the blocks with a finite, nonzero reference
  int64_t blocks = 0;         // ... how many blocks that is
  int64_t nonfinite = 0;      // output elements that are NaN/Inf where the reference is finite
  std::string report;
};

// Per (seq, head) block: ||out - ref||_2 / ||ref||_2 <= tol over the channels
// where the reference is finite; a block whose reference is all zero must be
// exactly zero; an output NaN/Inf where the reference is finite fails (this
// also catches unwritten elements still holding the NaN poison) and counts
// as an infinite error. Where the reference is NaN the output must be NaN
// too. The report names the worst block and the first failing ones.
Comparison compare_decode(const bf16* out, const std::vector<double>& ref, int32_t num_seqs, int32_t num_q_heads,
                          int32_t head_dim, double tol = 1e-2);

}  // namespace metrale::test
