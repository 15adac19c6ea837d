// Prefill kernels for the fp8 cache format (head_dim 64, 128, 256).
#include "kernels/formats/fp8.cuh"
#include "kernels/prefill/prefill_launch.cuh"

namespace metrale::kernels {

const PrefillLaunch kPrefillFp8 = launch_prefill<Fp8Format>;

}  // namespace metrale::kernels
