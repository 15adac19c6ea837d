// Decode kernels for the fp8 cache format (head_dim 64, 128, 256).
#include "kernels/decode/decode_launch.cuh"

namespace metrale::kernels {

bool launch_decode_fp8(const DecodeParams& p, int head_dim, int64_t num_ctas, cudaStream_t stream) {
  return launch_decode_format<Fp8Format>(p, head_dim, num_ctas, stream);
}

}  // namespace metrale::kernels
