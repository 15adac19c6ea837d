// Split-K reduce: merges the (o, m, l) records of SYSTEM.md 4 into the bf16
// output. One reduce serves every KV format: the records are format-free.
//
// One CTA of D/2 threads (1-4 warps) per (sequence, q head); each thread
// owns two output columns. Merge rule: M = max m_i, w_i = l_i * exp(m_i - M),
// out = sum w_i o_i / sum w_i; all splits empty (m = -inf) gives 0, and a NaN
// m or l (NaN in K/V, corrupt block table) makes the output NaN.
#include <cuda_runtime.h>

#include "host/validate.hpp"
#include "kernels/common/cuda_check.hpp"
#include "kernels/common/dependent_launch.hpp"
#include "kernels/reduce/reduce.hpp"
#include "metrale/cuda.hpp"

namespace metrale::kernels {

struct ReduceParams {
  const float* workspace;
  int32_t num_splits;
  int32_t head_dim;
  bf16* out;
};

__global__ void splitk_reduce_kernel(const __grid_constant__ ReduceParams p) {
  // Per split: its max logit and weight l * exp(m - M). Filled in parallel
  // (a split per thread) so that the merge below issues independent loads:
  // one thread walking the splits' (m, l) records in turn paid a memory
  // latency per split (18.6 us for 33 splits at batch 1, Nsight Compute).
  __shared__ float m_s[kMaxSplits];
  __shared__ float w_s[kMaxSplits];
  __shared__ float warp_max[32];
  // Launched as a programmatic dependent of the split pass: wait until its
  // records are complete and visible.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  // The next kernel (a decode, launched as a programmatic dependent) may be
  // scheduled now; it waits for this grid's writes before reading anything.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  const int64_t row = blockIdx.x;  // seq * num_q_heads + head
  const int D = p.head_dim;
  const int S = p.num_splits;
  const float* rec0 = p.workspace + row * S * (D + 2);
  const float ninf = -__int_as_float(0x7f800000);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int d = 2 * threadIdx.x;
  // This thread's two columns of the first kChunk splits, read together with
  // the (m, l) records below: up to kChunk splits cost one memory round trip,
  // then one per kChunk more. (The code stays short: it runs once per CTA,
  // cold in the instruction cache; a 48-split chunk made batch 1 x 1024
  // 1.6 us slower.)
  constexpr int kChunk = 16;
  float2 o[kChunk];
  auto load_chunk = [&](int s0) {
#pragma unroll
    for (int i = 0; i < kChunk; ++i)
      o[i] = s0 + i < S ? *reinterpret_cast<const float2*>(rec0 + (s0 + i) * (D + 2) + d) : make_float2(0.0f, 0.0f);
  };
  load_chunk(0);

  float m_max = ninf;
  bool nan = false;
  for (int s = threadIdx.x; s < S; s += blockDim.x) {
    const float m = rec0[s * (D + 2) + D], l = rec0[s * (D + 2) + D + 1];
    nan |= (m != m) || (l != l);
    m_max = fmaxf(m_max, m);
    m_s[s] = m;
    w_s[s] = l;
  }
  for (int x = 16; x > 0; x /= 2) m_max = fmaxf(m_max, __shfl_xor_sync(0xffffffffu, m_max, x));
  if (lane == 0) warp_max[warp] = m_max;
  nan = __syncthreads_or(nan);
  float M = ninf;
  for (int w = 0; w < warps; ++w) M = fmaxf(M, warp_max[w]);

  float a0 = 0.0f, a1 = 0.0f, L = 0.0f;
  if (!nan && M != ninf) {
    for (int s = threadIdx.x; s < S; s += blockDim.x)
      if (m_s[s] != ninf) w_s[s] *= expf(m_s[s] - M);
    __syncthreads();
    // In split order, as before: the same sums, bit for bit.
#pragma unroll 1
    for (int s0 = 0; s0 < S; s0 += kChunk) {
      if (s0 > 0) load_chunk(s0);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        const int s = s0 + i;
        if (s >= S || m_s[s] == ninf) continue;  // past the splits, or an empty split
        const float w = w_s[s];
        a0 += w * o[i].x;
        a1 += w * o[i].y;
        L += w;
      }
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

namespace metrale::kernels {

void launch_splitk_reduce(const ReduceArgs& args, cudaStream_t stream) {
  if (args.num_seqs == 0) return;
  const int64_t rows = int64_t(args.num_seqs) * args.num_q_heads;
  METRALE_CHECK_ARG(rows <= detail::kMaxGridX, "num_seqs", args.num_seqs, "num_seqs * num_q_heads <= 2^31-1");
  ReduceParams p{args.workspace, args.num_splits, args.head_dim, args.out};
  detail::launch_dependent(detail::DependentLaunch(dim3(unsigned(rows)), dim3(unsigned(args.head_dim / 2)), 0, stream),
                           splitk_reduce_kernel, "splitk_reduce_kernel", p);
}

}  // namespace metrale::kernels

namespace metrale::cuda {

void paged_decode_attn_reduce(const ReduceArgs& args, Stream stream) {
  detail::validate_reduce(args);
  kernels::launch_splitk_reduce(args, stream);
}

}  // namespace metrale::cuda
