// Plans with a forced split count and merge, for the tests and benchmarks
// that cover one path (the single pass, the split-K states) on either
// backend: plan_attention with AttnPlanOptions, and the tuning knobs of
// src/plan/tuning.hpp where a variant is forced.
#pragma once

#include "metrale/cpu.hpp"
#include "metrale/cuda.hpp"
#include "metrale/plan.hpp"
#include "src/plan/tuning.hpp"

namespace metrale::test {

// The public options and the tuning knobs in one struct, for tests that
// force both.
struct PlanChoices : AttnPlanOptions, detail::TuningOptions {};
inline AttnPlan plan_with(const AttnProblem& problem, const AttnTarget& target, const PlanChoices& c = {}) {
  return detail::plan_attention(problem, target, static_cast<const AttnPlanOptions&>(c),
                                static_cast<const detail::TuningOptions&>(c));
}

inline bool is_prefill(const AttnPlan& p) { return p.kernel == AttnKernel::prefill; }

// The plan of `a` (attention_problem(a)) with num_splits and merge forced.
inline AttnPlan forced_plan(const AttnArgs& a, const AttnTarget& target, int32_t num_splits, SplitMerge merge,
                            const detail::TuningOptions& tuning = {}) {
  AttnPlanOptions o;
  o.num_splits = num_splits;
  o.merge = merge;
  return detail::plan_attention(attention_problem(a), target, o, tuning);
}

// The CPU backend's single pass over `a`.
inline void cpu_single_pass(const AttnArgs& a) {
  cpu::run_attention(forced_plan(a, cpu::attention_target(), 1, SplitMerge::single_pass), a, {});
}

// The CPU backend's split-K states of `a` into ws (ws.num_splits splits), no reduce.
inline void cpu_split_states(const AttnArgs& a, const SplitKWorkspace& ws) {
  cpu::run_attention(forced_plan(a, cpu::attention_target(), ws.num_splits, SplitMerge::states_only), a, ws);
}

// The CUDA backend's single pass / split-K states, as the CPU ones.
inline void cuda_single_pass(const AttnArgs& a, cuda::Stream stream = nullptr) {
  cuda::run_attention(forced_plan(a, cuda::attention_target(), 1, SplitMerge::single_pass), a, {}, stream);
}
inline void cuda_split_states(const AttnArgs& a, const SplitKWorkspace& ws, cuda::Stream stream = nullptr) {
  cuda::run_attention(forced_plan(a, cuda::attention_target(), ws.num_splits, SplitMerge::states_only), a, ws, stream);
}

}  // namespace metrale::test
