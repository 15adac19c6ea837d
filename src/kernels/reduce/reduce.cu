// Split-K reduce: merges the (o, m, l) records of docs/spec.md 4 into the bf16
// output. One reduce serves every KV format: the records are format-free.
//
// One CTA per (sequence, q head): groups of D/2 threads, each thread two
// output columns of a group's share of the splits (a group per kReduceChunk
// splits, so that each thread's records are one memory round trip). The
// merge rule, the empty and NaN rules are softmax_state.hpp's (M = max m_i,
// w_i = l_i * exp(m_i - M), out = sum w_i o_i / sum w_i); each group sums its
// splits in split order, then the groups' sums are added in group order.
#include <cuda_runtime.h>

#include <algorithm>

#include "host/validate.hpp"
#include "kernels/common/cuda_check.hpp"
#include "kernels/common/dependent_launch.hpp"
#include "kernels/reduce/reduce.hpp"
#include "metrale/cuda.hpp"
#include "metrale/softmax_state.hpp"

namespace metrale::kernels {

// Splits a thread reads in one round trip. (The code stays short: it runs
// once per CTA, cold in the instruction cache; a 48-split chunk was slower
// at small batches.)
constexpr int kReduceChunk = 16;
// Thread groups of a reduce CTA over S splits: one per kReduceChunk splits,
// at most 1024 threads.
inline int reduce_groups(int num_splits, int head_dim) {
  return std::clamp((num_splits + kReduceChunk - 1) / kReduceChunk, 1, 2048 / head_dim);
}

struct ReduceParams {
  const float* workspace;
  int32_t num_splits;
  int32_t head_dim;
  bf16* out;
  int32_t num_q_heads;
  const float* sinks;  // [num_q_heads] or null (docs/spec.md 8)
  float* lse;          // [rows] or null
  int32_t cols_log2;   // log2(head_dim / 2): a group's threads
  int32_t group_splits;  // splits per thread group: ceil(num_splits / groups)
};

// kGroups: more than one thread group (more than kReduceChunk splits).
// Without, the group code is not compiled in: the reduce runs cold in the
// instruction cache, and with it one group ran slower at 8 and 16 splits.
template <bool kGroups>
__global__ void splitk_reduce_kernel(const __grid_constant__ ReduceParams p) {
  // Per split: its max logit and weight l * exp(m - M). Filled in parallel
  // (a split per thread) so that the merge below issues independent loads:
  // one thread walking the splits' (m, l) records in turn paid a memory
  // latency per split.
  __shared__ float m_s[kMaxSplits];
  __shared__ float w_s[kMaxSplits];
  __shared__ float warp_max[32];
  // (a0, a1, L) of each thread of the groups after the first: dynamic, none
  // with one group. (A static array of 1024 slowed the split decode that
  // launches it, with one group: likely because the
  // reduce's CTAs, launched early as the split pass's programmatic
  // dependents, wait on its SMs with that shared memory.)
  extern __shared__ float3 group_sums[];
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
  // (Shifts, and the host's split count per group: no integer divisions in
  // code that runs cold.)
  const int cols = kGroups ? 1 << p.cols_log2 : int(blockDim.x);
  const int group = kGroups ? int(threadIdx.x) >> p.cols_log2 : 0;
  const int groups = kGroups ? int(blockDim.x) >> p.cols_log2 : 1;
  const int d = kGroups ? 2 * (int(threadIdx.x) & (cols - 1)) : 2 * int(threadIdx.x);
  // The group's splits [s_begin, s_end) (reduce_groups: at most
  // kReduceChunk of them, except past 1024 threads).
  const int s_begin = kGroups ? group * p.group_splits : 0, s_end = kGroups ? min(S, s_begin + p.group_splits) : S;
  // This thread's two columns of the group's first kReduceChunk splits, read
  // together with the (m, l) records below: one memory round trip, then one
  // per kReduceChunk more.
  constexpr int kChunk = kReduceChunk;
  float2 o[kChunk];
  auto load_chunk = [&](int s0) {
#pragma unroll
    for (int i = 0; i < kChunk; ++i)
      o[i] = s0 + i < s_end ? *reinterpret_cast<const float2*>(rec0 + (s0 + i) * rec_len + d)
                            : make_float2(0.0f, 0.0f);
  };
  load_chunk(s_begin);

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
    // The group's splits in split order.
#pragma unroll 1
    for (int s0 = s_begin; s0 < s_end; s0 += kChunk) {
      if (s0 > s_begin) load_chunk(s0);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        const int s = s0 + i;
        if (s >= s_end || softmax::State<>{m_s[s], 0.0f}.is_empty()) continue;  // past them, or an empty split
        const float w = w_s[s];
        a0 += w * o[i].x;
        a1 += w * o[i].y;
        L += w;
      }
    }
    // Then the groups' sums, in group order, by the first group.
    if (kGroups) {
      if (group > 0) group_sums[threadIdx.x - cols] = make_float3(a0, a1, L);
      __syncthreads();
      if (group > 0) return;
      for (int g = 1; g < groups; ++g) {
        const float3 v = group_sums[(g - 1) * cols + threadIdx.x];
        a0 += v.x;
        a1 += v.y;
        L += v.z;
      }
    }
  } else if (kGroups && group > 0) {
    return;
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
  const int cols = args.head_dim / 2, groups = reduce_groups(args.num_splits, args.head_dim);
  int cols_log2 = 0;
  while ((1 << cols_log2) < cols) ++cols_log2;  // head_dim 64, 128, 256 (validated)
  ReduceParams p{args.workspace, args.num_splits, args.head_dim, args.out, args.num_q_heads, args.sinks, args.lse,
                 cols_log2, (args.num_splits + groups - 1) / groups};
  const size_t smem = size_t(groups - 1) * cols * sizeof(float3);  // the groups' sums (kernel)
  detail::launch_dependent(
      detail::DependentLaunch(dim3(unsigned(rows)), dim3(unsigned(cols * groups)), unsigned(smem), stream),
      groups > 1 ? splitk_reduce_kernel<true> : splitk_reduce_kernel<false>, "splitk_reduce_kernel", p);
}

}  // namespace metrale::kernels

namespace metrale::cuda {

void reduce_states(const ReduceArgs& args, Stream stream) {
  detail::validate_reduce(args);
  kernels::launch_splitk_reduce(args, stream);
}

}  // namespace metrale::cuda
