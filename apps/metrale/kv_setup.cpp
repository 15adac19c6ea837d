// Per-format cache setup (see kv_setup.hpp).
#include "kv_setup.hpp"

#include "metrale/cpu.hpp"

namespace metrale::cli {

KvCacheLayout make_layout(KvFormat format, const LayerShape& s, int64_t num_blocks) {
  switch (format) {
    case KvFormat::fp8_e4m3: return KvCacheLayout::fp8(num_blocks, s.block_size, s.num_kv_heads, s.head_dim);
    case KvFormat::nvfp4: return KvCacheLayout::nvfp4(num_blocks, s.block_size, s.num_kv_heads, s.head_dim);
    case KvFormat::bf16: break;
  }
  return KvCacheLayout::bf16(num_blocks, s.block_size, s.num_kv_heads, s.head_dim);
}

KvScales scales_from_absmax(KvFormat format, float k_absmax, float v_absmax) {
  KvScales sc;
  if (format == KvFormat::fp8_e4m3) {
    sc.k_scale = fp8_scale_from_absmax(k_absmax);
    sc.v_scale = fp8_scale_from_absmax(v_absmax);
  } else if (format == KvFormat::nvfp4) {
    sc.k_global_scale = nvfp4_global_scale_from_absmax(k_absmax);
    sc.v_global_scale = nvfp4_global_scale_from_absmax(v_absmax);
  }
  return sc;
}

KvScales calibrated_scales(const HostBatch& b, KvFormat format) {
  float k_absmax = 0.0f, v_absmax = 0.0f;
  cpu::bf16_absmax(b.key.data(), b.num_tokens(), b.kv_row(), b.kv_row(), &k_absmax);
  cpu::bf16_absmax(b.value.data(), b.num_tokens(), b.kv_row(), b.kv_row(), &v_absmax);
  return scales_from_absmax(format, k_absmax, v_absmax);
}

}  // namespace metrale::cli
