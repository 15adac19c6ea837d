// decode_batch_cpu (see decode_batch.hpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "decode_batch.hpp"
#include "kv_setup.hpp"
#include "metrale/cpu.hpp"
#include "metrale/plan.hpp"

namespace metrale::cli {

BatchDecode decode_batch_cpu(const HostBatch& b, KvFormat format, const KvScales& scales, int32_t num_splits,
                             int timed_reps) {
  BatchDecode r;
  const KvCacheLayout layout = make_layout(format, b.shape, b.num_blocks);
  r.k_cache.assign(size_t(layout.cache_bytes()), 0);
  r.v_cache.assign(size_t(layout.cache_bytes()), 0);
  const KvCacheView cache{layout, r.k_cache.data(), r.v_cache.data(), scales};

  cpu::reshape_and_cache(b.write_args(b.key.data(), b.value.data(), b.slot_mapping.data(), cache));

  DecodePlan plan = plan_decode(b.decode_problem(layout), cpu::num_threads());
  if (num_splits > 0)
    plan =
        DecodePlan{num_splits, splitk_workspace_bytes(b.num_seqs(), b.shape.num_q_heads, b.shape.head_dim, num_splits)};
  r.num_splits = plan.num_splits;
  AlignedVector<float> ws(plan.workspace_bytes / sizeof(float) + 1);
  r.out.assign(size_t(b.out_elems()), codec::float_to_bf16(NAN));

  const DecodeArgs a = b.decode_args(b.q.data(), cache, b.block_tables.data(), b.seq_lens.data(), r.out.data());
  const SplitKWorkspace workspace{ws.data(), plan.workspace_bytes, plan.num_splits};
  cpu::run_decode(plan, a, workspace);
  std::vector<double> us;
  for (int i = 0; i < timed_reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    cpu::run_decode(plan, a, workspace);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  if (!us.empty()) {
    std::nth_element(us.begin(), us.begin() + std::ptrdiff_t(us.size() / 2), us.end());
    r.median_us = us[us.size() / 2];
  }
  return r;
}

}  // namespace metrale::cli
