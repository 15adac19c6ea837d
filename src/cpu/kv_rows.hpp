// Reading one (token, kv head) row of a paged cache as f32, and writing one
// (docs/spec.md 2-3): the CPU codecs of the element codes of metrale/format.hpp.
//
// Decode dequantizes each row once and serves every q head of its GQA group
// from the f32 copy. The per-tensor scales (fp8 k/v_scale, nvfp4 global
// scales) are NOT applied here: decode folds them into sm_scale (K) and the
// output (V), which is exact up to f32 rounding.
#pragma once

#include <cstdint>
#include <cstring>

#include "metrale/cache.hpp"
#include "metrale/codec.hpp"
#include "metrale/format.hpp"

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

// The CPU codec of each element code (metrale/format.hpp): dequantizes row
// (t*H + h) of a page into out[0, D) (without the per-tensor scale), the
// values of KvFormatDesc::unscaled_element through the tables.
inline void dequant_row(const KvFormatDesc& f, const uint8_t* page, const KvCacheLayout& l, int64_t row,
                        const CodecTables& tab, float* __restrict out) {
  const int32_t d_len = l.head_dim;
  const uint8_t* codes = page + f.code_offset(l, row);
  switch (f.code) {
    case KvCode::bf16: {
      const uint16_t* src = reinterpret_cast<const uint16_t*>(codes);
      for (int32_t d = 0; d < d_len; ++d) out[d] = codec::f32_from_bits(uint32_t(src[d]) << 16);
      break;
    }
    case KvCode::e4m3:
      for (int32_t d = 0; d < d_len; ++d) out[d] = tab.e4m3[codes[d]];
      break;
    case KvCode::e2m1:
      for (int32_t b = 0; b < d_len / 2; ++b) {
        const float* pair = tab.e2m1_pair[codes[b]];
        out[2 * b] = pair[0];
        out[2 * b + 1] = pair[1];
      }
      break;
  }
  if (f.group_size == 0) return;
  const uint8_t* scales = page + f.scale_offset(l, row);
  for (int32_t g = 0; g < d_len / f.group_size; ++g) {
    const float s = tab.e4m3[scales[g]];
    for (int32_t i = g * f.group_size; i < (g + 1) * f.group_size; ++i) out[i] *= s;
  }
}

// Quantizes n bf16 values (whole rows: n is a multiple of the group size)
// into codes (and group scales) with the codecs of metrale/codec.hpp;
// `tensor` is the per-tensor scale (fp8: x = code * tensor; nvfp4: the
// global scale; `rule` how NVFP4 groups choose their scale). Bit-identical
// to the GPU cache write. Returns the number of saturated values
// (codec::fp8_saturates / nvfp4_saturates; 0 for bf16).
inline int64_t quantize_row(const KvFormatDesc& f, const bf16* src, int64_t n, float tensor, Nvfp4ScaleRule rule,
                            uint8_t* codes, uint8_t* scales) {
  int64_t saturated = 0;
  switch (f.code) {
    case KvCode::bf16:
      std::memcpy(codes, src, size_t(n) * 2);
      break;
    case KvCode::e4m3: {
      const float inv = 1.0f / tensor;  // in f32, once (docs/spec.md 2)
      for (int64_t i = 0; i < n; ++i) {
        const float x = codec::bf16_to_float(src[i]);
        codes[i] = codec::e4m3_rne_satfinite(x * inv);
        saturated += codec::fp8_saturates(x, inv);
      }
      break;
    }
    case KvCode::e2m1: {
      constexpr int G = codec::kNvfp4GroupSize;
      const float six_g = 6.0f * tensor;  // the codec's f32 product
      float x[G];
      for (int64_t g = 0; g < n / G; ++g) {
        for (int i = 0; i < G; ++i) x[i] = codec::bf16_to_float(src[g * G + i]);
        uint8_t* packed = codes + g * (G / 2);
        scales[g] = rule == Nvfp4ScaleRule::adaptive ? codec::nvfp4_quantize_group_adaptive(x, tensor, packed)
                                                     : codec::nvfp4_quantize_group(x, tensor, packed);
        if (codec::e4m3_code_may_saturate(scales[g]))
          for (int i = 0; i < G; ++i) saturated += codec::nvfp4_saturates(x[i], six_g);
      }
      break;
    }
  }
  return saturated;
}

// Software prefetch of rows (t*H + h), t in [t0, t1), of a page: one kv
// head's rows are H rows apart, a stride the hardware prefetcher follows badly.
inline void prefetch_rows(const KvFormatDesc& f, const uint8_t* page, const KvCacheLayout& l, int32_t t0, int32_t t1,
                          int32_t h) {
  const int64_t row_bytes = f.row_code_bytes(l.head_dim);
  for (int32_t t = t0; t < t1; ++t) {
    const int64_t row = int64_t(t) * l.num_kv_heads + h;
    const uint8_t* p = page + f.code_offset(l, row);
    for (int64_t off = 0; off < row_bytes; off += 64) __builtin_prefetch(p + off);
    if (f.group_size) __builtin_prefetch(page + f.scale_offset(l, row));
  }
}

}  // namespace metrale::cpu::detail
