// Prefill kernels for the bf16 cache format (head_dim 64, 128, 256).
#include "kernels/formats/bf16.cuh"
#include "kernels/prefill/prefill_launch.cuh"

namespace metrale::kernels {

const PrefillFormatKernels kPrefillBf16Kernels{launch_prefill<Bf16Format>, prefill_instantiated<Bf16Format>};

}  // namespace metrale::kernels
