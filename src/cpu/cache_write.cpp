// reshape_and_cache on the CPU (SYSTEM.md 1-3): each token's K and V rows are
// written to its slot, quantized with the codecs of metrale/codec.hpp only,
// so the codes and scales are bit-identical to the GPU's.
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
  const int64_t hd = int64_t(l.num_kv_heads) * l.head_dim;  // one token's rows t*H .. t*H + H-1
  const int64_t capacity = l.capacity_slots();
  uint8_t* k_base = static_cast<uint8_t*>(a.cache.k);
  uint8_t* v_base = static_cast<uint8_t*>(a.cache.v);
  std::atomic<int64_t> skipped{0};

  detail::parallel_for(a.num_tokens, 64, [&](int64_t begin, int64_t end) {
    int64_t local_skipped = 0;
    for (int64_t j = begin; j < end; ++j) {
      const int64_t slot = a.slot_mapping[j];
      if (slot < 0) continue;  // padding token
      if (slot >= capacity) {  // never written out of bounds; counted
        ++local_skipped;
        continue;
      }
      const int64_t block = slot / l.block_size, t = slot % l.block_size;
      const int64_t page_off = block * l.page_stride_bytes;
      const int64_t codes = page_off + f.code_offset(l, t * l.num_kv_heads);
      const int64_t scales = page_off + f.scale_offset(l, t * l.num_kv_heads);
      detail::quantize_row(f, a.key + j * a.key_stride, hd, k_tensor, k_base + codes, k_base + scales);
      detail::quantize_row(f, a.value + j * a.value_stride, hd, v_tensor, v_base + codes, v_base + scales);
    }
    if (local_skipped) skipped.fetch_add(local_skipped, std::memory_order_relaxed);
  });

  const int64_t n = skipped.load();
  if (a.skipped && n) *a.skipped += int32_t(n);
  return n;
}

}  // namespace metrale::cpu
