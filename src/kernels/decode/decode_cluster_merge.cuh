// The cluster merge of a split-K decode: the split CTAs of one (sequence,
// kv head, q-head tile) merge their records through distributed shared
// memory, by the rule of softmax_state.hpp, straight into the output.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/decode/decode_params.hpp"
#include "metrale/codec.hpp"
#include "metrale/softmax_state.hpp"

namespace metrale::kernels {

// Split-K merged inside a cluster: the num_splits CTAs of a (sequence, kv
// head, q-head tile) are one thread-block cluster, each holding its split's
// records in shared memory (`recs`: [col] records of softmax_state.hpp).
// After a cluster barrier, CTA `rank` merges every num_splits-th slice of the
// tile's outputs by the reduce's rule and order (reduce.cu), reading the
// other CTAs' records through distributed shared memory, and writes them to
// `out`; a second barrier keeps every CTA's records alive until all reads are
// done. Replaces the workspace round trip and the reduce launch.
template <int D>
__device__ void cluster_merge_records(const DecodeParams& p, const float* recs, int64_t seq, int head0, int cols) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  constexpr int kRec = softmax::record_floats(D);
  const int S = p.num_splits, rank = int(cluster.block_rank());
  for (int idx = rank * int(blockDim.x) + threadIdx.x; idx < cols * D; idx += S * int(blockDim.x)) {
    const int col = idx / D, d = idx % D;
    softmax::Merge<> mg;
    for (int s = 0; s < S; ++s) mg.see(softmax::load_state(cluster.map_shared_rank(recs, s) + col * kRec, D));
    float a = 0.0f, L = 0.0f;
    if (mg.sums()) {
      for (int s = 0; s < S; ++s) {
        const float* r = cluster.map_shared_rank(recs, s) + col * kRec;
        const softmax::State<> st = softmax::load_state(r, D);
        if (st.is_empty()) continue;
        const float w = st.weight(mg.M);
        a += w * r[d];
        L += w;
      }
    }
    p.out[(seq * p.num_q_heads + head0 + col) * D + d] = codec::float_to_bf16(mg.finalize(a, L));
  }
  cluster.sync();
}

}  // namespace metrale::kernels
