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
// Where column `col` of a CTA writes: its output row (row * num_q_heads +
// q head) and its q head.
struct ColumnRow {
  int64_t out_row;
  int32_t head;
};

// kOptions: the runs kernel's sinks and lse (decode_runs.cuh); `column`
// maps a column to its ColumnRow.
template <int D, bool kOptions, class Params, class Column>
__device__ void cluster_merge_records(const Params& p, const float* recs, int cols, const Column& column) {
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  constexpr int kRec = softmax::record_floats(D);
  const int S = p.num_splits, rank = int(cluster.block_rank());
  for (int idx = rank * int(blockDim.x) + threadIdx.x; idx < cols * D; idx += S * int(blockDim.x)) {
    const int col = idx / D, d = idx % D;
    const ColumnRow cr = column(col);
    softmax::Merge<> mg;
    if constexpr (kOptions) {
      if (p.sinks) mg.sink = p.sinks[cr.head];
    }
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
    p.out[cr.out_row * D + d] = codec::float_to_bf16(mg.finalize(a, L));
    if constexpr (kOptions) {
      if (p.lse && d == 0) p.lse[cr.out_row] = mg.lse(L);
    }
  }
  cluster.sync();
}

}  // namespace metrale::kernels
