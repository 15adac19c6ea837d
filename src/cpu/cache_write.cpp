// reshape_and_cache on the CPU (docs/spec.md 1-3): each token's K and V rows are
// written to its slot, quantized with the codecs of metrale/codec.hpp only,
// so the codes and scales are bit-identical to the GPU's, and the saturated
// elements counted by the same rule (codec::fp8_saturates / nvfp4_saturates).
#include <atomic>

#include "cpu/kv_rows.hpp"
#include "cpu/thread_pool.hpp"
#include "host/validate.hpp"
#include "metrale/cpu.hpp"

namespace metrale::cpu {

int64_t reshape_and_cache(const CacheWriteArgs& a) {
  metrale::detail::validate_cache_write(a);
  if (a.num_tokens == 0) return 0;
  const KvCacheLayout& l = a.cache.layout;
  const KvFormatDesc& f = kv_format_desc(l.format);
  const float k_tensor = f.k_scale(a.cache.scales), v_tensor = f.v_scale(a.cache.scales);
  const int64_t H = l.num_kv_heads, D = l.head_dim;
  const int64_t k_hs = a.key_head_stride_used(), v_hs = a.value_head_stride_used();
  const int64_t code_bytes = f.row_code_bytes(D), scale_bytes = f.row_scale_bytes(D);
  const int64_t capacity = l.capacity_slots();
  uint8_t* k_base = static_cast<uint8_t*>(a.cache.k);
  uint8_t* v_base = static_cast<uint8_t*>(a.cache.v);
  std::atomic<int64_t> skipped{0}, k_saturated{0}, v_saturated{0};

  detail::parallel_for(a.num_tokens, 64, [&](int64_t begin, int64_t end) {
    int64_t local_skipped = 0, local_k_sat = 0, local_v_sat = 0;
    for (int64_t j = begin; j < end; ++j) {
      const int64_t slot = a.slot_mapping[j];
      if (slot < 0) continue;  // padding token
      if (slot >= capacity) {  // never written out of bounds; counted
        ++local_skipped;
        continue;
      }
      const int64_t block = slot / l.block_size, t = slot % l.block_size;
      const int64_t page_off = block * l.page_stride_bytes;
      // Rows (t*H + h), h = 0..H-1, are consecutive in the page.
      const int64_t codes = page_off + f.code_offset(l, t * H);
      const int64_t scales = page_off + f.scale_offset(l, t * H);
      const bf16* key = a.key + j * a.key_stride;
      const bf16* value = a.value + j * a.value_stride;
      for (int64_t h = 0; h < H; ++h) {
        local_k_sat += detail::quantize_row(f, key + h * k_hs, D, k_tensor, l.nvfp4_scales,
                                            k_base + codes + h * code_bytes, k_base + scales + h * scale_bytes);
        local_v_sat += detail::quantize_row(f, value + h * v_hs, D, v_tensor, l.nvfp4_scales,
                                            v_base + codes + h * code_bytes, v_base + scales + h * scale_bytes);
      }
    }
    if (local_skipped) skipped.fetch_add(local_skipped, std::memory_order_relaxed);
    if (local_k_sat) k_saturated.fetch_add(local_k_sat, std::memory_order_relaxed);
    if (local_v_sat) v_saturated.fetch_add(local_v_sat, std::memory_order_relaxed);
  });

  const int64_t n = skipped.load();
  if (a.skipped && n) *a.skipped += int32_t(n);
  if (a.saturated) {
    a.saturated[0] += k_saturated.load();
    a.saturated[1] += v_saturated.load();
  }
  return n;
}

}  // namespace metrale::cpu
