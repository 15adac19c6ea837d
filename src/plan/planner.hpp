// The planner's decision step without the problem's validation, for the
// entry points that validated their arguments already (validate once).
#pragma once

#include "metrale/plan.hpp"
#include "plan/tuning.hpp"

namespace metrale::detail {

// plan_attention after the problem's checks; `problem` must be valid.
AttnPlan decide_plan(const AttnProblem& problem, const AttnTarget& target, const AttnPlanOptions& options,
                     const TuningOptions& tuning);

}  // namespace metrale::detail
