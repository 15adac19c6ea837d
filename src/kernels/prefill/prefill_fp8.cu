// Prefill kernels for the fp8 cache format (head_dim 64, 128, 256).
#include "kernels/formats/fp8.cuh"
#include "kernels/prefill/prefill_launch.cuh"

namespace metrale::kernels {

const PrefillFormatKernels kPrefillFp8Kernels{launch_prefill<Fp8Format>, prefill_instantiated<Fp8Format>};

}  // namespace metrale::kernels
