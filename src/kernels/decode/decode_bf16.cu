// Decode kernels for the bf16 cache format (head_dim 64, 128, 256).
#include "kernels/decode/decode_launch.cuh"

namespace metrale::kernels {

bool launch_decode_bf16(const DecodeParams& p, int head_dim, int64_t num_ctas, cudaStream_t stream) {
  return launch_decode_format<Bf16Format>(p, head_dim, num_ctas, stream);
}

}  // namespace metrale::kernels
