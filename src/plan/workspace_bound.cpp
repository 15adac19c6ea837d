// The split-K workspace bound of a plan (workspace_bound.hpp).
#include "plan/workspace_bound.hpp"

#include <algorithm>

#include "metrale/error.hpp"
#include "metrale/ops.hpp"

namespace metrale::detail {

void bound_workspace(AttnPlan& plan, const AttnPlanOptions& opt, size_t reserved) {
  const AttnProblem& p = plan.problem;
  plan.workspace_bytes = reserved;
  if (plan.merge != SplitMerge::workspace && plan.merge != SplitMerge::states_only) return;
  const size_t bound = (opt.max_workspace_bytes ? opt.max_workspace_bytes : kDefaultMaxWorkspaceBytes) - reserved;
  const size_t per_split = splitk_workspace_bytes(p.rows(), p.num_q_heads, p.layout.head_dim, 1);
  const size_t bytes = per_split * size_t(plan.num_splits);
  if (bytes > bound && (opt.num_splits > 0 || plan.merge == SplitMerge::states_only))
    throw_invalid(
        "num_splits",
        concat(plan.num_splits, ": a split-K workspace of ", bytes, " bytes (", p.rows(), " query rows x ",
               p.num_q_heads, " q heads x ", plan.num_splits, " splits x ", p.layout.head_dim + 2, " floats)"),
        concat("a workspace within max_workspace_bytes = ", bound,
               " bytes: fewer splits, or a plan for fewer query rows (num_q_rows, max_q_len)"));
  if (bytes > bound) {
    const int32_t fit = int32_t(std::min<size_t>(bound / std::max<size_t>(per_split, 1), size_t(plan.num_splits)));
    plan.num_splits = std::max(fit, 1);
    if (plan.num_splits == 1) plan.merge = SplitMerge::single_pass;
  }
  plan.workspace_bytes = reserved + (plan.merge == SplitMerge::single_pass ? 0 : per_split * size_t(plan.num_splits));
}

}  // namespace metrale::detail
