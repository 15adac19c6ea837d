// The CPU split-K reduce for callers that validated its arguments
// (run_attention); cpu::reduce_states validates first.
#pragma once

#include "metrale/ops.hpp"

namespace metrale::cpu::detail {

void reduce_splits(const ReduceArgs& args);

}  // namespace metrale::cpu::detail
