// Split-K reduce: merges the (o, m, l) records of SYSTEM.md 4 into the bf16
// output. One reduce serves every KV format: the records are format-free.
//
// One CTA of D/2 threads (1-4 warps) per (sequence, q head); each thread
// owns two output columns. The merge rule, the empty and NaN rules are
// softmax_state.hpp's (M = max m_i, w_i = l_i * exp(m_i - M),
// out = sum w_i o_i / sum w_i), summed in split order.
#include <cuda_runtime.h>

#include "host/validate.hpp"
#include "kernels/common/cuda_check.hpp"
#include "kernels/common/dependent_launch.hpp"
#include "kernels/reduce/reduce.hpp"
#include "metrale/cuda.hpp"
#include "metrale/softmax_state.hpp"

namespace metrale::kernels {

struct ReduceParams {
  const float* workspace;
  int32_t num_splits;
  int32_t head_dim;
  bf16* out;
  int32_t num_q_heads;
  const float* sinks;  // [num_q_heads] or null (SYSTEM.md 8)
  float* lse;          // [rows] or null
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
  const int rec_len = softmax::record_floats(D);
  const float* rec0 = p.workspace + softmax::record_index(row, S, 0) * rec_len;
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
      o[i] = s0 + i < S ? *reinterpret_cast<const float2*>(rec0 + (s0 + i) * rec_len + d) : make_float2(0.0f, 0.0f);
  };
  load_chunk(0);

  softmax::Merge<> part;  // this thread's splits, then the CTA's (M over the warps' maxima)
  for (int s = threadIdx.x; s < S; s += blockDim.x) {
    const softmax::State<> st = softmax::load_state(rec0 + s * rec_len, D);
    part.see(st);
    m_s[s] = st.m;
    w_s[s] = st.l;
  }
  for (int x = 16; x > 0; x /= 2) part.M = fmaxf(part.M, __shfl_xor_sync(0xffffffffu, part.M, x));
  if (lane == 0) warp_max[warp] = part.M;
  softmax::Merge<> mg;
  if (p.sinks) mg.sink = p.sinks[row % p.num_q_heads];
  mg.nan = __syncthreads_or(part.nan);
  for (int w = 0; w < warps; ++w) mg.M = fmaxf(mg.M, warp_max[w]);

  float a0 = 0.0f, a1 = 0.0f, L = 0.0f;
  if (mg.sums()) {
    for (int s = threadIdx.x; s < S; s += blockDim.x) w_s[s] = softmax::State<>{m_s[s], w_s[s]}.weight(mg.M);
    __syncthreads();
    // In split order, as before: the same sums, bit for bit.
#pragma unroll 1
    for (int s0 = 0; s0 < S; s0 += kChunk) {
      if (s0 > 0) load_chunk(s0);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        const int s = s0 + i;
        if (s >= S || softmax::State<>{m_s[s], 0.0f}.is_empty()) continue;  // past the splits, or an empty split
        const float w = w_s[s];
        a0 += w * o[i].x;
        a1 += w * o[i].y;
        L += w;
      }
    }
  }
  a0 = mg.finalize(a0, L);
  a1 = mg.finalize(a1, L);
  p.out[row * D + d] = codec::float_to_bf16(a0);
  p.out[row * D + d + 1] = codec::float_to_bf16(a1);
  if (p.lse && threadIdx.x == 0) p.lse[row] = mg.lse(L);
}

}  // namespace metrale::kernels

namespace metrale::kernels {

void launch_splitk_reduce(const ReduceArgs& args, cudaStream_t stream) {
  if (args.num_seqs == 0) return;
  const int64_t rows = int64_t(args.num_seqs) * args.num_q_heads;
  METRALE_CHECK_ARG(rows <= detail::kMaxGridX, "num_seqs", args.num_seqs, "num_seqs * num_q_heads <= 2^31-1");
  ReduceParams p{args.workspace, args.num_splits, args.head_dim, args.out, args.num_q_heads, args.sinks, args.lse};
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
