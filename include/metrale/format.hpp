// One description per KV-cache format (docs/formats.md), the host side of the
// format: its name, what a cache row holds (code bits, scale groups), which
// per-tensor scales it takes, how one element dequantizes, and the factor the
// kernels fold into their logit scale and output. Host code looks a format up
// here instead of switching on KvFormat; each device policy
// (src/kernels/formats/<format>.cuh) takes its numbers from its entry.
// Usable on host and device (the context-parallel edge kernel dequantizes
// through element()).
#pragma once

#include <cstdint>
#include <string>

#include "metrale/cache.hpp"
#include "metrale/codec.hpp"

namespace metrale {

// How the code of one element decodes (metrale/codec.hpp).
enum class KvCode : uint8_t {
  bf16,  // the bf16 bit pattern (16 bits)
  e4m3,  // codec::e4m3_to_float (8 bits)
  e2m1,  // codec::e2m1_to_float (4 bits; element 2i in the low nibble of byte i)
};

// Which fields of KvScales a format takes; each must be a finite f32 >= the format's min_tensor_scale.
enum class KvTensorScale : uint8_t {
  none,
  scale,         // k_scale, v_scale
  global_scale,  // k_global_scale, v_global_scale
};

struct KvFormatDesc {
  KvFormat format;
  const char* name;       // to_string / kv_format_from_string: "fp8"
  const char* enum_name;  // the KvFormat enumerator, also in Python: "fp8_e4m3"
  KvCode code;
  int32_t code_bits;       // bits of one element's code in the data section
  int32_t group_size;      // elements per E4M3 group scale in the scale section; 0: no scale section
  KvTensorScale tensor_scale;
  float calibration_max;   // |x| a tensor scale of 1 represents: scale = absmax / this (0: no scale)
  float operand_factor;    // power of two the kernels' tensor-core operands carry beyond the
                           // dequantized value (src/kernels/formats/<format>.cuh); folded
                           // with the tensor scale into the logit scale and the output
  // The smallest tensor scale the ops take (calibration floors at it). FP8's
  // write multiplies by 1 / scale, which a subnormal scale overflows to inf
  // (codes of 0 * inf were NaN): 2^-126, the smallest normal f32. NVFP4's
  // write takes any positive g (where s * g underflows, the codec's
  // per-element route): 2^-149, the smallest positive f32. 0: no scale.
  float min_tensor_scale;

  // Bytes of codes and of group scales one (token, kv head) row occupies.
  METRALE_HD constexpr int64_t row_code_bytes(int64_t head_dim) const { return head_dim * code_bits / 8; }
  METRALE_HD constexpr int64_t row_scale_bytes(int64_t head_dim) const {
    return group_size ? head_dim / group_size : 0;
  }

  // The per-tensor scales of K and V (1 where the format takes none), and
  // the names validation reports.
  METRALE_HD float k_scale(const KvScales& s) const {
    return tensor_scale == KvTensorScale::scale ? s.k_scale
           : tensor_scale == KvTensorScale::global_scale ? s.k_global_scale : 1.0f;
  }
  METRALE_HD float v_scale(const KvScales& s) const {
    return tensor_scale == KvTensorScale::scale ? s.v_scale
           : tensor_scale == KvTensorScale::global_scale ? s.v_global_scale : 1.0f;
  }
  const char* k_scale_name() const {
    return tensor_scale == KvTensorScale::scale ? "cache.scales.k_scale" : "cache.scales.k_global_scale";
  }
  const char* v_scale_name() const {
    return tensor_scale == KvTensorScale::scale ? "cache.scales.v_scale" : "cache.scales.v_global_scale";
  }

  // Element d of a row whose codes start at `codes` and group scales at
  // `scales` (code_offset / scale_offset), without the per-tensor scale:
  // code value * group scale (docs/spec.md 2).
  METRALE_HD float unscaled_element(const uint8_t* codes, const uint8_t* scales, int32_t d) const {
    float x = 0.0f;
    switch (code) {
      case KvCode::bf16: x = codec::bf16_to_float(bf16{reinterpret_cast<const uint16_t*>(codes)[d]}); break;
      case KvCode::e4m3: x = codec::e4m3_to_float(codes[d]); break;
      case KvCode::e2m1: x = codec::e2m1_to_float(uint8_t(d & 1 ? codes[d / 2] >> 4 : codes[d / 2] & 15)); break;
    }
    return group_size ? x * codec::e4m3_to_float(scales[d / group_size]) : x;
  }
  // The same times `tensor` (k_scale(s) or v_scale(s)), where the format takes one.
  METRALE_HD float element(const uint8_t* codes, const uint8_t* scales, int32_t d, float tensor) const {
    const float x = unscaled_element(codes, scales, d);
    return tensor_scale == KvTensorScale::none ? x : x * tensor;
  }

  // Byte offsets in a page of row (t*H + h)'s codes and group scales.
  METRALE_HD int64_t code_offset(const KvCacheLayout& l, int64_t row) const {
    return row * row_code_bytes(l.head_dim);
  }
  METRALE_HD int64_t scale_offset(const KvCacheLayout& l, int64_t row) const {
    return l.data_section_bytes + row * row_scale_bytes(l.head_dim);
  }
};

// The formats, indexed by KvFormat. NVFP4's operand factor: E2M1 codes enter
// the tensor cores as E4M3 bytes worth code * 2^-6 (src/kernels/formats/nvfp4.cuh).
inline constexpr KvFormatDesc kKvFormats[] = {
    {KvFormat::bf16, "bf16", "bf16", KvCode::bf16, 16, 0, KvTensorScale::none, 0.0f, 1.0f, 0.0f},
    {KvFormat::fp8_e4m3, "fp8", "fp8_e4m3", KvCode::e4m3, 8, 0, KvTensorScale::scale, codec::kE4M3Max, 1.0f,
     0x1p-126f},
    {KvFormat::nvfp4, "nvfp4", "nvfp4", KvCode::e2m1, 4, codec::kNvfp4GroupSize, KvTensorScale::global_scale,
     codec::kE4M3Max * codec::kE2M1Max, 64.0f, 0x1p-149f},
};
inline constexpr int kNumKvFormats = int(sizeof(kKvFormats) / sizeof(kKvFormats[0]));

constexpr bool kv_formats_indexed() {
  for (int i = 0; i < kNumKvFormats; ++i)
    if (int(kKvFormats[i].format) != i) return false;
  return true;
}
static_assert(kv_formats_indexed(), "kKvFormats[i] must describe KvFormat(i)");

// The description of `f`; throws Unsupported (listing the formats) for a
// value outside the enumeration.
const KvFormatDesc& kv_format_desc(KvFormat f);
// "bf16, fp8 or nvfp4" (names) / "bf16 (0), fp8_e4m3 (1), nvfp4 (2)" (enumerators).
std::string kv_format_names();
std::string kv_format_enumerators();

// The per-tensor scales of format `f` calibrated from running absmaxes
// (x = absmax / calibration_max; an absmax of 0 gives 1); the fields the
// format does not take keep their defaults.
KvScales kv_scales_from_absmax(KvFormat f, float k_absmax, float v_absmax);

}  // namespace metrale
