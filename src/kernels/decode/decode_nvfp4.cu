// Decode kernels for the nvfp4 cache format (head_dim 64, 128, 256).
#include "kernels/decode/decode_launch.cuh"
#include "kernels/formats/nvfp4.cuh"

namespace metrale::kernels {

const DecodeFormatKernels kDecodeNvfp4Kernels{launch_decode<Nvfp4Format>, resident_decode_clusters<Nvfp4Format>,
                                              decode_instantiated<Nvfp4Format>};

}  // namespace metrale::kernels
