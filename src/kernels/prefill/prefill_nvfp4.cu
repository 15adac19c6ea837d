// Prefill kernels for the nvfp4 cache format (head_dim 64, 128, 256).
#include "kernels/formats/nvfp4.cuh"
#include "kernels/prefill/prefill_launch.cuh"

namespace metrale::kernels {

const PrefillFormatKernels kPrefillNvfp4Kernels{launch_prefill<Nvfp4Format>, prefill_instantiated<Nvfp4Format>};

}  // namespace metrale::kernels
