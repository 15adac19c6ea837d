// Reading one (token, kv head) row of a paged cache as f32 (SYSTEM.md 2-3).
//
// Decode dequantizes each row once and serves every q head of its GQA group
// from the f32 copy. The per-tensor scales (fp8 k/v_scale, nvfp4 global
// scales) are NOT applied here: decode folds them into sm_scale (K) and the
// output (V), which is exact up to f32 rounding.
#pragma once

#include <cstdint>

#include "metrale/cache.hpp"
#include "metrale/codec.hpp"

namespace metrale::cpu::detail {

// Decode tables built once from the codecs in metrale/codec.hpp.
struct CodecTables {
  float e4m3[256];       // e4m3_to_float(code)
  float e2m1_pair[256][2];  // e2m1_to_float of the low and high nibble
  static const CodecTables& get();
};

// Byte address of page `block` of a cache.
inline const uint8_t* page_ptr(const void* cache, const KvCacheLayout& l, int64_t block) {
  return static_cast<const uint8_t*>(cache) + block * l.page_stride_bytes;
}

// Dequantizes row (t*H + h) of a page into out[0, D) (without the per-tensor scale).
inline void dequant_row(const uint8_t* page, const KvCacheLayout& l, int64_t row, const CodecTables& tab,
                        float* __restrict out) {
  const int32_t d_len = l.head_dim;
  switch (l.format) {
    case KvFormat::bf16: {
      const uint16_t* src = reinterpret_cast<const uint16_t*>(page) + row * d_len;
      for (int32_t d = 0; d < d_len; ++d) out[d] = codec::f32_from_bits(uint32_t(src[d]) << 16);
      break;
    }
    case KvFormat::fp8_e4m3: {
      const uint8_t* src = page + row * d_len;
      for (int32_t d = 0; d < d_len; ++d) out[d] = tab.e4m3[src[d]];
      break;
    }
    case KvFormat::nvfp4: {
      const uint8_t* codes = page + row * (d_len / 2);
      const uint8_t* scales = page + l.data_section_bytes + row * (d_len / codec::kNvfp4GroupSize);
      for (int32_t g = 0; g < d_len / codec::kNvfp4GroupSize; ++g) {
        const float s = tab.e4m3[scales[g]];
        for (int32_t b = 0; b < codec::kNvfp4GroupSize / 2; ++b) {
          const float* pair = tab.e2m1_pair[codes[g * 8 + b]];
          out[g * 16 + 2 * b] = pair[0] * s;
          out[g * 16 + 2 * b + 1] = pair[1] * s;
        }
      }
      break;
    }
  }
}

// Software prefetch of rows (t*H + h), t in [t0, t1), of a page: one kv
// head's rows are H rows apart, a stride the hardware prefetcher follows badly.
inline void prefetch_rows(const uint8_t* page, const KvCacheLayout& l, int32_t t0, int32_t t1, int32_t h) {
  const int64_t row_bytes = l.format == KvFormat::bf16 ? 2 * l.head_dim
                            : l.format == KvFormat::fp8_e4m3 ? l.head_dim : l.head_dim / 2;
  for (int32_t t = t0; t < t1; ++t) {
    const int64_t row = int64_t(t) * l.num_kv_heads + h;
    const uint8_t* p = page + row * row_bytes;
    for (int64_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(p + off);
    if (l.format == KvFormat::nvfp4) __builtin_prefetch(page + l.data_section_bytes + row * (l.head_dim / 16));
  }
}

}  // namespace metrale::cpu::detail
