// The planner's decision step without the problem's validation, for the
// entry points that validated their arguments already (validate once).
#pragma once

#include "metrale/plan.hpp"

namespace metrale::detail {

// plan_decode after the problem's checks; `problem` must be valid.
DecodePlan decide_decode_plan(const DecodeProblem& problem, const DecodeTarget& target,
                              const DecodePlanOptions& options);

}  // namespace metrale::detail
