// The fields the decode/runs kernel's RunParams and the prefill kernel's
// PrefillParams share, filled from a plan and validated arguments in one
// place (host side only): q, the pages, the block tables, the heads of the
// plan's kv units, the per-tensor scales folded into the logit and V factors
// (metrale/format.hpp), soft-cap, the outputs or split-K records, and the
// TMA tensor maps of a TMA plan.
#pragma once

#include "kernels/decode/kv_tensor_map.hpp"
#include "metrale/error.hpp"
#include "metrale/format.hpp"
#include "metrale/plan.hpp"

namespace metrale::kernels {

// The cache's pages, block tables, lengths, runs and window of `a`, for any
// params with these fields (the attention kernels', the staging kernel's).
template <class Params>
void fill_paged_inputs(Params& p, const AttnArgs& a) {
  const KvCacheLayout& L = a.cache.layout;
  p.k_cache = static_cast<const uint8_t*>(a.cache.k);
  p.v_cache = static_cast<const uint8_t*>(a.cache.v);
  p.page_stride = L.page_stride_bytes;
  p.scale_offset = L.data_section_bytes;
  p.num_blocks = int32_t(L.num_blocks);
  p.block_tables = a.block_tables;
  p.max_blocks_per_seq = a.max_blocks_per_seq;
  p.seq_lens = a.seq_lens;
  p.q_start = a.q_start;
  p.block_size = L.block_size;
  p.sliding_window = a.sliding_window;
}

template <class Params>
void fill_attention_params(Params& p, const AttnPlan& plan, const AttnArgs& a, float* workspace) {
  const KvCacheLayout& L = a.cache.layout;
  // Split-K through the workspace writes the records only; the other plans write `out` (and lse).
  const bool writes_records = plan.merge == SplitMerge::workspace || plan.merge == SplitMerge::states_only;
  p.q = a.q;
  p.q_stride = a.q_stride;
  p.q_head_stride = a.q_head_stride_used();
  fill_paged_inputs(p, a);
  p.num_q_heads = a.num_q_heads;
  p.num_kv_heads = plan.launch.kv_units;
  p.group = plan.launch.unit_group;
  p.head_tiles = plan.launch.head_tiles;
  const KvFormatDesc& f = kv_format_desc(L.format);
  constexpr float kLog2e = 1.4426950408889634f;
  const float k_factor = f.k_scale(a.cache.scales) * f.operand_factor;
  p.qk_log2_scale = a.sm_scale * kLog2e * k_factor;
  p.v_factor = f.v_scale(a.cache.scales) * f.operand_factor;
  p.sinks = a.sinks;
  if (a.softcap > 0.0f) {
    p.softcap_scale = a.sm_scale * k_factor / a.softcap;
    p.softcap_log2 = a.softcap * kLog2e;
  }
  p.lse = writes_records ? nullptr : a.lse;
  p.num_splits = plan.num_splits;
  p.out = writes_records ? nullptr : a.out;
  p.workspace = writes_records ? workspace : nullptr;
  // A staged prefill's maps are the staged pages' (make_prefill_params).
  if (plan.launch.load_path == metrale::detail::LoadPath::tma && !plan.launch.stage_kv) {
    // The maps are bound to the cache's base pointers, which change from
    // layer to layer, so they are encoded per call (host work only; a graph
    // replay repeats none of it). Paired heads: the maps see a row of twice
    // the head_dim per head pair, so one 128-byte box spans both heads' rows
    // (decode's k_vector).
    KvCacheLayout map_layout = L;
    if (plan.launch.pair_kv_heads) {
      map_layout.head_dim *= 2;
      map_layout.num_kv_heads /= 2;
    }
    if (!make_kv_tensor_map(p.k_map, a.cache.k, map_layout) || !make_kv_tensor_map(p.v_map, a.cache.v, map_layout))
      throw CudaError("metrale: cuTensorMapEncodeTiled failed for the TMA plan's cache maps");
  }
}

}  // namespace metrale::kernels
