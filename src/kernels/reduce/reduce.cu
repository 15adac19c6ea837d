// Split-K reduce: merges the (o, m, l) records of SYSTEM.md 4 into the bf16
// output. One reduce serves every KV format: the records are format-free.
//
// One CTA of D/2 threads per (sequence, q head); each thread owns two output
// columns. Merge rule: M = max m_i, w_i = l_i * exp(m_i - M),
// out = sum w_i o_i / sum w_i; all splits empty (m = -inf) gives 0, and a NaN
// m or l (NaN in K/V, corrupt block table) makes the output NaN.
#include <cuda_runtime.h>

#include "host/validate.hpp"
#include "kernels/common/cuda_check.hpp"
#include "metrale/cuda.hpp"

namespace metrale::kernels {

struct ReduceParams {
  const float* workspace;
  int32_t num_splits;
  int32_t head_dim;
  bf16* out;
};

__global__ void splitk_reduce_kernel(const __grid_constant__ ReduceParams p) {
  // Launched as a programmatic dependent of the split pass: wait until its
  // records are complete and visible.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  const int64_t row = blockIdx.x;  // seq * num_q_heads + head
  const int D = p.head_dim;
  const float* rec0 = p.workspace + row * p.num_splits * (D + 2);
  const float ninf = -__int_as_float(0x7f800000);
  float M = ninf;
  bool nan = false;
  for (int s = 0; s < p.num_splits; ++s) {
    const float m = rec0[s * (D + 2) + D], l = rec0[s * (D + 2) + D + 1];
    nan |= (m != m) || (l != l);
    M = fmaxf(M, m);
  }
  const int d = 2 * threadIdx.x;
  float a0 = 0.0f, a1 = 0.0f, L = 0.0f;
  if (!nan && M != ninf) {
    for (int s = 0; s < p.num_splits; ++s) {
      const float* rec = rec0 + s * (D + 2);
      const float m = rec[D];
      if (m == ninf) continue;  // empty split
      const float w = rec[D + 1] * expf(m - M);
      const float2 o = *reinterpret_cast<const float2*>(rec + d);
      a0 += w * o.x;
      a1 += w * o.y;
      L += w;
    }
    a0 /= L;
    a1 /= L;
  } else if (nan) {
    a0 = a1 = __int_as_float(0x7fc00000);
  }
  p.out[row * D + d] = codec::float_to_bf16(a0);
  p.out[row * D + d + 1] = codec::float_to_bf16(a1);
}

}  // namespace metrale::kernels

namespace metrale::cuda {

void paged_decode_attn_reduce(const ReduceArgs& args, Stream stream) {
  detail::validate_reduce(args);
  if (args.num_seqs == 0) return;
  const int64_t rows = int64_t(args.num_seqs) * args.num_q_heads;
  METRALE_CHECK_ARG(rows <= detail::kMaxGridX, "num_seqs", args.num_seqs, "num_seqs * num_q_heads <= 2^31-1");
  kernels::ReduceParams p{args.workspace, args.num_splits, args.head_dim, args.out};
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(rows));
  cfg.blockDim = dim3(unsigned(args.head_dim / 2));
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  detail::cuda_check(cudaLaunchKernelEx(&cfg, kernels::splitk_reduce_kernel, p), "splitk_reduce_kernel");
}

}  // namespace metrale::cuda
