// Context-parallel decode on the CUDA backend (docs/context_parallel.md):
// the rank's states (split-K pass + edge pass) and the merge (permute of the
// gathered rank-major blocks with cudaMemcpy2DAsync + the split-K reduce).
//
// The edge pass attends one partially masked page per sequence (the window's
// first page, tokens [begin, end) of it): at most block_size tokens, so a
// plain kernel (one CTA per (seq, q head), f32 math, dequant from codec.hpp)
// is enough; it is not on the bandwidth-critical path.
#include <cuda_runtime.h>

#include <string>

#include "host/validate.hpp"
#include "kernels/common/cuda_check.hpp"
#include "metrale/codec.hpp"
#include "metrale/context_parallel.hpp"
#include "metrale/format.hpp"
#include "metrale/softmax_state.hpp"

namespace metrale::kernels {

struct EdgeParams {
  const bf16* q;
  int64_t q_stride, q_head_stride;
  int32_t num_q_heads, group;
  KvCacheLayout layout;
  KvFormatDesc format;  // layout.format's description (its dequantisation)
  const uint8_t* k;
  const uint8_t* v;
  KvScales scales;
  float sm_scale;
  const cp::EdgeSlice* edges;
  float* records;  // [num_seqs * num_q_heads] records (softmax_state.hpp)
};

__device__ __forceinline__ float edge_elem(const EdgeParams& p, const uint8_t* cache, bool is_k, int32_t page,
                                           int32_t t, int32_t h, int32_t d) {
  const KvCacheLayout& L = p.layout;
  const uint8_t* base = cache + int64_t(page) * L.page_stride_bytes;
  const int64_t row = int64_t(t) * L.num_kv_heads + h;
  return p.format.element(base + p.format.code_offset(L, row), base + p.format.scale_offset(L, row), d,
                          is_k ? p.format.k_scale(p.scales) : p.format.v_scale(p.scales));
}

constexpr int kEdgeThreads = 128;

__global__ void __launch_bounds__(kEdgeThreads) cp_edge_kernel(const __grid_constant__ EdgeParams p) {
  __shared__ float q_s[256];
  __shared__ float s_s[128];
  __shared__ float red[2];
  const int32_t seq = blockIdx.x / p.num_q_heads, h = blockIdx.x % p.num_q_heads;
  const int32_t D = p.layout.head_dim;
  float* rec = p.records + int64_t(blockIdx.x) * softmax::record_floats(D);
  const cp::EdgeSlice e = p.edges[seq];
  if (e.page < 0 || e.end <= e.begin) {
    for (int d = threadIdx.x; d < D; d += blockDim.x) rec[d] = 0.0f;
    if (threadIdx.x == 0) softmax::store_state(rec, D, softmax::State<>::empty());
    return;
  }
  const int32_t kvh = h / p.group, n = e.end - e.begin;
  for (int d = threadIdx.x; d < D; d += blockDim.x)
    q_s[d] = codec::bf16_to_float(p.q[int64_t(seq) * p.q_stride + int64_t(h) * p.q_head_stride + d]);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int t = warp; t < n; t += warps) {
    float acc = 0.0f;
    for (int d = lane; d < D; d += 32) acc += q_s[d] * edge_elem(p, p.k, true, e.page, e.begin + t, kvh, d);
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) s_s[t] = acc * p.sm_scale;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = softmax::State<>::empty().m;
    for (int t = 0; t < n; ++t) m = fmaxf(m, s_s[t]);  // a NaN logit reaches l below
    float l = 0.0f;
    for (int t = 0; t < n; ++t) {
      s_s[t] = expf(s_s[t] - m);
      l += s_s[t];
    }
    red[0] = m;
    red[1] = l;
  }
  __syncthreads();
  const float m = red[0], l = red[1];
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int t = 0; t < n; ++t) acc += s_s[t] * edge_elem(p, p.v, false, e.page, e.begin + t, kvh, d);
    rec[d] = acc / l;
  }
  if (threadIdx.x == 0) softmax::store_state(rec, D, {m, l});
}

}  // namespace metrale::kernels

namespace metrale::cuda {

void cp_edge_states(const AttnArgs& a, const cp::EdgeSlice* edges, float* records, Stream stream) {
  METRALE_CHECK_ARG(a.num_seqs >= 0, "num_seqs", a.num_seqs, ">= 0");
  if (a.num_seqs == 0) return;
  detail::validate_cache_view(a.cache);
  METRALE_CHECK_ARG(a.q != nullptr, "q", "null", "a device pointer");
  METRALE_CHECK_ARG(edges != nullptr, "edges", "null", "a device array of num_seqs EdgeSlice");
  METRALE_CHECK_ARG(records != nullptr, "edge_records", "null", "a device buffer of num_seqs*num_q_heads records");
  METRALE_CHECK_ARG(a.num_q_heads >= 1 && a.num_q_heads % a.cache.layout.num_kv_heads == 0, "num_q_heads",
                    a.num_q_heads, "a multiple of num_kv_heads");
  METRALE_CHECK_ARG(a.cache.layout.head_dim <= 256 && a.cache.layout.block_size <= 128, "head_dim/block_size",
                    a.cache.layout.head_dim, "head_dim <= 256 and block_size <= 128");
  const int64_t rows = int64_t(a.num_seqs) * a.num_q_heads;
  METRALE_CHECK_ARG(rows <= detail::kMaxGridX, "num_seqs", a.num_seqs, "num_seqs * num_q_heads <= 2^31-1");
  kernels::EdgeParams p{a.q,
                        a.q_stride,
                        a.q_head_stride_used(),
                        a.num_q_heads,
                        a.num_q_heads / a.cache.layout.num_kv_heads,
                        a.cache.layout,
                        kv_format_desc(a.cache.layout.format),
                        static_cast<const uint8_t*>(a.cache.k),
                        static_cast<const uint8_t*>(a.cache.v),
                        a.cache.scales,
                        a.sm_scale,
                        edges,
                        records};
  kernels::cp_edge_kernel<<<unsigned(rows), kernels::kEdgeThreads, 0, stream>>>(p);
  detail::check_launch("cp_edge_kernel");
}

void cp_rank_states(const cp::CpLayout& L, const AttnArgs& a, const cp::EdgeSlice* edges, float* block,
                    Stream stream) {
  detail::validate_cp_rank_args(L, a);
  if (L.num_seqs == 0) return;
  const SplitKWorkspace ws = cp::rank_splitk_workspace(L, block);
  AttnPlanOptions o;  // the rank's split-K states, merged by cp_merge
  o.num_splits = ws.num_splits;
  o.merge = SplitMerge::states_only;
  run_attention(plan_attention(attention_problem(a), attention_target(), o), a, ws, stream);
  if (L.has_edge) cp_edge_states(a, edges, block + L.splitk_floats(), stream);
}

void cp_merge(const cp::CpLayout& L, const float* gathered, float* merged, bf16* out, Stream stream) {
  L.validate();
  if (L.num_seqs == 0) return;
  METRALE_CHECK_ARG(gathered && merged && out, "gathered/merged/out", "null", "non-null device buffers");
  const size_t rec = L.record_floats() * sizeof(float), rows = size_t(L.num_seqs) * L.num_q_heads;
  const size_t k = size_t(L.slots()), ns = size_t(L.splits_per_rank), R = size_t(L.num_ranks);
  const size_t dpitch = R * k * rec;
  for (size_t r = 0; r < R; ++r) {
    const float* blk = gathered + r * L.rank_floats();
    char* dst = reinterpret_cast<char*>(merged) + r * k * rec;
    detail::cuda_check(cudaMemcpy2DAsync(dst, dpitch, blk, ns * rec, ns * rec, rows, cudaMemcpyDeviceToDevice,
                                         stream),
                       "cp_merge: cudaMemcpy2DAsync (split records)");
    if (L.has_edge)
      detail::cuda_check(cudaMemcpy2DAsync(dst + ns * rec, dpitch, blk + L.splitk_floats(), rec, rec, rows,
                                           cudaMemcpyDeviceToDevice, stream),
                         "cp_merge: cudaMemcpy2DAsync (edge records)");
  }
  ReduceArgs ra{merged, L.merged_floats() * sizeof(float), L.num_seqs, L.num_q_heads, L.head_dim,
                L.merged_splits(), out};
  reduce_states(ra, stream);
}

}  // namespace metrale::cuda
