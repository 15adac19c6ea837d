// decode_batch_gpu (see decode_batch.hpp).
#include "decode_batch.hpp"
#include "device_buffer.hpp"
#include "kv_setup.hpp"
#include "metrale/cuda.hpp"
#include "metrale/plan.hpp"

namespace metrale::cli {

BatchDecode decode_batch_gpu(const HostBatch& b, KvFormat format, const KvScales& scales, int32_t num_splits) {
  BatchDecode r;
  const KvCacheLayout layout = make_layout(format, b.shape, b.num_blocks);
  const DeviceBuffer key(b.key.data(), b.key.size()), value(b.value.data(), b.value.size()), q(b.q.data(), b.q.size()),
      slots(b.slot_mapping.data(), b.slot_mapping.size()), tables(b.block_tables.data(), b.block_tables.size()),
      lens(b.seq_lens.data(), b.seq_lens.size());
  DeviceBuffer k_cache(size_t(layout.cache_bytes())), v_cache(size_t(layout.cache_bytes()));
  cuda_check(cudaMemset(k_cache.as<void>(), 0, k_cache.bytes()), "cudaMemset(k)");
  cuda_check(cudaMemset(v_cache.as<void>(), 0, v_cache.bytes()), "cudaMemset(v)");
  const KvCacheView cache{layout, k_cache.as<void>(), v_cache.as<void>(), scales};

  cuda::reshape_and_cache(b.write_args(key.as<bf16>(), value.as<bf16>(), slots.as<int64_t>(), cache));

  DecodePlan plan = plan_decode(b.decode_problem(layout), cuda::device_info().num_sms);
  if (num_splits > 0)
    plan =
        DecodePlan{num_splits, splitk_workspace_bytes(b.num_seqs(), b.shape.num_q_heads, b.shape.head_dim, num_splits)};
  r.num_splits = plan.num_splits;
  DeviceBuffer ws(plan.workspace_bytes);
  DeviceBuffer out(size_t(b.out_elems()) * sizeof(bf16));
  cuda_check(cudaMemset(out.as<void>(), 0xff, out.bytes()), "cudaMemset(out)");  // NaN poison

  const DecodeArgs a = b.decode_args(q.as<bf16>(), cache, tables.as<int32_t>(), lens.as<int32_t>(), out.as<bf16>());
  cuda::run_decode(plan, a, SplitKWorkspace{ws.as<float>(), ws.bytes(), plan.num_splits});
  cuda_check(cudaDeviceSynchronize(), "decode");
  r.out.resize(size_t(b.out_elems()));
  out.download(r.out.data());
  r.k_cache.resize(k_cache.bytes());
  r.v_cache.resize(v_cache.bytes());
  k_cache.download(r.k_cache.data());
  v_cache.download(r.v_cache.data());
  return r;
}

}  // namespace metrale::cli
