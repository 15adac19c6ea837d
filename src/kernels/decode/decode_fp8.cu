// Decode kernels for the fp8 cache format (head_dim 64, 128, 256).
#include "kernels/decode/decode_launch.cuh"
#include "kernels/formats/fp8.cuh"

namespace metrale::kernels {

const DecodeFormatKernels kDecodeFp8Kernels{launch_decode<Fp8Format>, resident_decode_clusters<Fp8Format>,
                                            decode_instantiated<Fp8Format>};

}  // namespace metrale::kernels
