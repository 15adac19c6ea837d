// make_prefill_params (prefill_params.hpp): host side only.
#include "kernels/prefill/prefill_params.hpp"

#include "kernels/common/attention_params.hpp"
#include "kernels/prefill/prefill_stage.hpp"

namespace metrale::kernels {

PrefillParams make_prefill_params(const AttnPlan& plan, const AttnArgs& a, float* workspace,
                                  const PrefillStageParams* staged) {
  PrefillParams p{};
  fill_attention_params(p, plan, a, workspace);
  p.tile_band = plan.launch.tile_band;
  if (plan.launch.stage_kv) {
    // The staged bf16 pages (prefill_stage.hpp); the factors stay the cache format's.
    if (staged == nullptr) throw Error("metrale: make_prefill_params of a staged plan needs its staging params");
    const PrefillStageParams& s = *staged;
    const KvCacheLayout pages = KvCacheLayout::bf16(int64_t(plan.problem.num_seqs) * s.slots, a.cache.layout.block_size,
                                                    a.cache.layout.num_kv_heads, a.cache.layout.head_dim);
    p.k_cache = reinterpret_cast<const uint8_t*>(s.k);
    p.v_cache = reinterpret_cast<const uint8_t*>(s.v);
    p.page_stride = pages.page_stride_bytes;
    p.scale_offset = pages.data_section_bytes;
    p.num_blocks = int32_t(pages.num_blocks);
    p.block_tables = s.table;
    p.max_blocks_per_seq = s.table_stride;
    if (!make_kv_tensor_map(p.k_map, s.k, pages) || !make_kv_tensor_map(p.v_map, s.v, pages))
      throw CudaError("metrale: cuTensorMapEncodeTiled failed for the staged prefill's page maps");
  }
  return p;
}

}  // namespace metrale::kernels
