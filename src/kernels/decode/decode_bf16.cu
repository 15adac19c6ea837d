// Decode kernels for the bf16 cache format (head_dim 64, 128, 256).
#include "kernels/decode/decode_launch.cuh"
#include "kernels/formats/bf16.cuh"

namespace metrale::kernels {

const DecodeFormatKernels kDecodeBf16Kernels{launch_decode<Bf16Format>, resident_decode_clusters<Bf16Format>,
                                               decode_instantiated<Bf16Format>};

}  // namespace metrale::kernels
