// Decode kernels for the nvfp4 cache format (head_dim 64, 128, 256).
#include "kernels/decode/decode_launch.cuh"

namespace metrale::kernels {

bool launch_decode_nvfp4(const DecodeParams& p, int head_dim, int64_t num_ctas, cudaStream_t stream) {
  return launch_decode_format<Nvfp4Format>(p, head_dim, num_ctas, stream);
}

}  // namespace metrale::kernels
