// reshape_and_cache on the CPU (SYSTEM.md 1-3): each token's K and V rows are
// written to its slot, quantized with the codecs of metrale/codec.hpp only,
// so the codes and scales are bit-identical to the GPU's.
#include <atomic>
#include <cstring>

#include "cpu/thread_pool.hpp"
#include "host/validate.hpp"
#include "metrale/codec.hpp"
#include "metrale/cpu.hpp"

namespace metrale::cpu {
namespace {

// Writes one token's row of one cache (K or V): `src` holds H*D bf16 values
// (kv head h at h*D), `page` the start of the slot's page, `t` the slot's
// offset in the page. `inv_scale` (fp8) and `global_scale` (nvfp4) per tensor.
void write_row(const bf16* src, uint8_t* page, int64_t t, const KvCacheLayout& l, float inv_scale,
               float global_scale) {
  const int64_t hd = int64_t(l.num_kv_heads) * l.head_dim;  // row (t*H + h)*D + d == t*H*D + (h*D + d)
  switch (l.format) {
    case KvFormat::bf16:
      std::memcpy(page + t * hd * 2, src, size_t(hd) * 2);
      break;
    case KvFormat::fp8_e4m3: {
      uint8_t* dst = page + t * hd;
      for (int64_t i = 0; i < hd; ++i) dst[i] = codec::e4m3_rne_satfinite(codec::bf16_to_float(src[i]) * inv_scale);
      break;
    }
    case KvFormat::nvfp4: {
      constexpr int G = codec::kNvfp4GroupSize;
      uint8_t* codes = page + t * hd / 2;
      uint8_t* scales = page + l.data_section_bytes + t * hd / G;
      float x[G];
      for (int64_t g = 0; g < hd / G; ++g) {  // groups never straddle heads: D % 16 == 0
        for (int i = 0; i < G; ++i) x[i] = codec::bf16_to_float(src[g * G + i]);
        scales[g] = codec::nvfp4_quantize_group(x, global_scale, codes + g * (G / 2));
      }
      break;
    }
  }
}

}  // namespace

int64_t reshape_and_cache(const CacheWriteArgs& a) {
  metrale::detail::validate_cache_write(a);
  if (a.num_tokens == 0) return 0;
  const KvCacheLayout& l = a.cache.layout;
  const KvScales& sc = a.cache.scales;
  // fp8: inv_scale = 1.0f / scale, computed once in f32 (SYSTEM.md 2).
  const float k_inv = l.format == KvFormat::fp8_e4m3 ? 1.0f / sc.k_scale : 1.0f;
  const float v_inv = l.format == KvFormat::fp8_e4m3 ? 1.0f / sc.v_scale : 1.0f;
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
      write_row(a.key + j * a.key_stride, k_base + page_off, t, l, k_inv, sc.k_global_scale);
      write_row(a.value + j * a.value_stride, v_base + page_off, t, l, v_inv, sc.v_global_scale);
    }
    if (local_skipped) skipped.fetch_add(local_skipped, std::memory_order_relaxed);
  });

  const int64_t n = skipped.load();
  if (a.skipped && n) *a.skipped += int32_t(n);
  return n;
}

}  // namespace metrale::cpu
