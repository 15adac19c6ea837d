// The split-K workspace bound of a plan (AttnPlanOptions::max_workspace_bytes),
// the planner's last decision for every kernel (planner.cpp).
#pragma once

#include <cstddef>

#include "metrale/plan.hpp"

namespace metrale::detail {

// The split-K workspace of a plan that merges through it, inside the bound
// (AttnPlanOptions::max_workspace_bytes): a forced split count (or a
// states_only plan) past it is refused before anything is allocated; the
// planner's own count shrinks to what fits, down to a single pass.
// `reserved`: the workspace's other bytes (a prefill plan's staged pages),
// which the records' bound leaves out.
void bound_workspace(AttnPlan& plan, const AttnPlanOptions& opt, size_t reserved = 0);

}  // namespace metrale::detail
