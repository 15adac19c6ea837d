// What the backends share (see backend.hpp): the choice of backend and one
// decode of a host batch, written once against the interface.
#include "backend.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

namespace metrale::cli {

std::unique_ptr<Backend> make_backend(bool force_cpu, std::string* reason) {
  *reason = force_cpu ? "--cpu given" : gpu_unavailable_reason();
  return reason->empty() ? make_cuda_backend() : make_cpu_backend();
}

BatchDecode decode_batch(Backend& be, const HostBatch& b, KvFormat format, const KvScales& scales, int timed_reps,
                         Nvfp4ScaleRule nvfp4_scales) {
  BatchDecode r;
  KvCacheLayout layout = make_layout(format, b.shape, b.num_blocks);
  if (nvfp4_scales != layout.nvfp4_scales) layout = layout.with_nvfp4_scales(nvfp4_scales);
  const size_t cache_bytes = size_t(layout.cache_bytes()), out_bytes = size_t(b.out_elems()) * sizeof(bf16);
  const Buffer key = be.copy_of(b.key.data(), b.key.size()), value = be.copy_of(b.value.data(), b.value.size()),
               q = be.copy_of(b.q.data(), b.q.size()), slots = be.copy_of(b.slot_mapping.data(), b.slot_mapping.size()),
               tables = be.copy_of(b.block_tables.data(), b.block_tables.size()),
               lens = be.copy_of(b.seq_lens.data(), b.seq_lens.size());
  const Buffer k_cache = be.alloc(cache_bytes), v_cache = be.alloc(cache_bytes), out = be.alloc(out_bytes);
  be.fill(k_cache.get(), 0, cache_bytes);
  be.fill(v_cache.get(), 0, cache_bytes);
  be.fill(out.get(), 0xff, out_bytes);  // NaN poison
  const KvCacheView cache{layout, k_cache.get(), v_cache.get(), scales};

  be.reshape_and_cache(b.write_args(static_cast<const bf16*>(key.get()), static_cast<const bf16*>(value.get()),
                                    static_cast<const int64_t*>(slots.get()), cache));
  const AttnArgs a = b.decode_args(static_cast<const bf16*>(q.get()), cache, static_cast<const int32_t*>(tables.get()),
                                     static_cast<const int32_t*>(lens.get()), static_cast<bf16*>(out.get()));
  const AttnPlan plan = plan_attention(attention_problem(a, b.max_seq_len()), be.attention_target());
  r.num_splits = plan.num_splits;
  const Buffer ws = be.alloc(plan.workspace_bytes);
  const SplitKWorkspace workspace{static_cast<float*>(ws.get()), plan.workspace_bytes, plan.num_splits};
  be.run_attention(plan, a, workspace);
  be.synchronize();
  std::vector<double> us;
  for (int i = 0; i < timed_reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    be.run_attention(plan, a, workspace);
    be.synchronize();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  if (!us.empty()) {
    std::nth_element(us.begin(), us.begin() + std::ptrdiff_t(us.size() / 2), us.end());
    r.median_us = us[us.size() / 2];
  }
  r.out.resize(size_t(b.out_elems()));
  r.k_cache.resize(cache_bytes);
  r.v_cache.resize(cache_bytes);
  be.download(r.out.data(), out.get(), out_bytes);
  be.download(r.k_cache.data(), k_cache.get(), cache_bytes);
  be.download(r.v_cache.data(), v_cache.get(), cache_bytes);
  return r;
}

}  // namespace metrale::cli
