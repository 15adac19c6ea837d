// The split-K softmax state (docs/spec.md 4), written once: the record every
// partial result is stored as, how states merge, the empty and NaN rules and
// the final normalisation. The decode kernel's epilogue and cluster merge, the
// reduce kernel, the CPU backend and the context-parallel merge all use it.
// CUDA-free, host and device.
//
// A state over logits x_j: m = max_j x_j, l = sum_j e^(x_j - m), and its
// partial output o = sum_j e^(x_j - m) v_j / l. Records hold m in natural-log
// units; the decode kernel works in log2 units (exp2 is one instruction) and
// converts once, in to_record. Rules:
//   * empty (nothing attended): m = -inf, l = 0, o = 0; it weighs 0.
//   * NaN (a NaN logit, a bad page): m = l = NaN; any merge holding one is NaN.
//   * merge of states s_i: M = max m_i, w_i = l_i e^(m_i - M), L = sum w_i,
//     o = sum w_i o_i / L; (M, L) is again a state. All empty: o = 0.
// The merge is taken against the common M of all its states (one exp per
// state, no pairwise re-referencing), in the callers' fixed summation order.
#pragma once

#include <math.h>

#include <cstdint>

#include "metrale/codec.hpp"  // METRALE_HD

namespace metrale::softmax {

// Units of m: the records' natural log, or the decode kernel's log2.
struct Ln {
  METRALE_HD static float exp(float x) { return expf(x); }
};
struct Log2 {
  METRALE_HD static float exp(float x) { return exp2f(x); }
};

// ---- the record: D floats of o, then m, then l ----
METRALE_HD constexpr int32_t record_floats(int32_t head_dim) { return head_dim + 2; }
// Record of (row = seq * num_q_heads + q head, split) in a split-K workspace.
METRALE_HD constexpr int64_t record_index(int64_t row, int32_t num_splits, int32_t split) {
  return row * num_splits + split;
}

template <class Units = Ln>
struct State {
  float m;  // max logit (-inf: empty)
  float l;  // sum of e^(logit - m)

  METRALE_HD static State empty() { return {-INFINITY, 0.0f}; }
  METRALE_HD static State nan() { return {NAN, NAN}; }
  METRALE_HD bool is_empty() const { return m == -INFINITY; }
  METRALE_HD bool is_nan() const { return m != m || l != l; }
  // e^(m - M): re-references this state's o and l to a max M >= m; 0 when empty.
  METRALE_HD float scale(float M) const { return is_empty() ? 0.0f : Units::exp(m - M); }
  // w = l e^(m - M), the state's weight in a merge against M.
  METRALE_HD float weight(float M) const { return l * scale(M); }
};

METRALE_HD State<Ln> load_state(const float* rec, int32_t head_dim) { return {rec[head_dim], rec[head_dim + 1]}; }
METRALE_HD void store_state(float* rec, int32_t head_dim, State<Ln> s) {
  rec[head_dim] = s.m;
  rec[head_dim + 1] = s.l;
}

// The kernel's merged log2 state (reference max M, sum L against it) as a
// record state: re-referenced to the exact max `m_exact` (M <= m_exact, so
// l shrinks) and converted to natural-log units.
METRALE_HD State<Ln> to_record(State<Log2> s, float m_exact) {
  if (s.is_nan()) return State<Ln>::nan();
  if (s.is_empty()) return State<Ln>::empty();
  constexpr float kLn2 = 0.69314718055994530942f;
  return {m_exact * kLn2, s.l * exp2f(s.m - m_exact)};
}

// A merge in two passes over its states: see() each one (the common max M
// and the NaN flag), then, if sums(), add each non-empty state's
// weight(M) to L and weight(M) * o to the output; finalize() turns the sums
// into the output.
template <class Units = Ln>
struct Merge {
  float M = -INFINITY;
  bool nan = false;
  // An attention sink's logit (docs/spec.md 8; same units as m): it joins the
  // denominator of the final normalisation only. -inf: none.
  float sink = -INFINITY;

  METRALE_HD void see(State<Units> s) {
    nan = nan || s.is_nan();
    see_max(s);
  }
  // The max alone, where the NaN rule holds by arithmetic: a NaN l reaches
  // L, every weight w / L (taken wherever L != 0) and the merged state's l
  // (to_record makes that a NaN record), so the sums need no flag (the
  // decode epilogue, per column of every CTA: the flag's tests cost
  // 0.07 us at 1 x 1024).
  METRALE_HD void see_max(State<Units> s) { M = fmaxf(M, s.m); }
  // Whether any weighted sum is needed: not when the output is NaN or 0.
  METRALE_HD bool sums() const { return !nan && M != -INFINITY; }
  // The merged state, (M, L) for the sum L of the weights.
  METRALE_HD State<Units> merged(float L) const { return nan ? State<Units>::nan() : State<Units>{M, L}; }
  // What the weighted sum is divided by: L, plus the sink's weight e^(sink - M)
  // (once, at the final normalisation; a sink far above M gives an infinite
  // denominator, i.e. an output of 0, its limit).
  METRALE_HD float denominator(float L) const { return sink == -INFINITY ? L : L + Units::exp(sink - M); }
  // ln-sum-exp of the merged state, M + ln(L) (natural-log units; without
  // the sink): -inf when empty, NaN when NaN.
  METRALE_HD float lse(float L) const { return nan ? NAN : (M == -INFINITY ? -INFINITY : M + logf(L)); }
  // One output element from its weighted sum `acc`: NaN, 0 (all empty) or acc / denominator.
  METRALE_HD float finalize(float acc, float L) const {
    return nan ? NAN : (M == -INFINITY ? 0.0f : acc / denominator(L));
  }
};

}  // namespace metrale::softmax
