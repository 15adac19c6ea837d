// make_prefill_params (prefill_params.hpp): host side only.
#include "kernels/prefill/prefill_params.hpp"

#include "kernels/common/attention_params.hpp"

namespace metrale::kernels {

PrefillParams make_prefill_params(const AttnPlan& plan, const AttnArgs& a, float* workspace) {
  PrefillParams p{};
  fill_attention_params(p, plan, a, workspace);
  p.tile_band = plan.launch.tile_band;
  return p;
}

}  // namespace metrale::kernels
