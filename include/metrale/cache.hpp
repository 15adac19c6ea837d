// KV-cache formats and the layout descriptor of one paged cache (K or V).
//
// The layout math is docs/spec.md section 3. K and V are separate caches laid
// out alike; one KvCacheLayout describes both.
#pragma once

#include <cstdint>
#include <string>

namespace metrale {

enum class KvFormat : uint8_t {
  bf16 = 0,      // as is
  fp8_e4m3 = 1,  // OCP E4M3FN codes, per-tensor f32 scale
  nvfp4 = 2,     // E2M1 codes, one E4M3 scale per 16 head_dim elements, optional f32 global scale
};

// The format's name (metrale/format.hpp: "bf16", "fp8", "nvfp4").
const char* to_string(KvFormat f);
// Inverse of to_string; throws InvalidArgument.
KvFormat kv_format_from_string(const std::string& name);

// How an NVFP4 cache chooses each 16-value group's E4M3 scale (docs/spec.md 2,
// docs/nvfp4_scales.md). Both decode with the same rule x = e2m1 * s * g, so
// the bytes, the attention kernels and the calibration of g do not depend on
// it; only the cache write does.
enum class Nvfp4ScaleRule : uint8_t {
  max6 = 0,      // the spec's rule: the group's absmax maps to 6
  adaptive = 1,  // per group the better of the absmax mapped to 6 and to 4, by squared error; a tie keeps max6
};

// "max6", "adaptive".
const char* to_string(Nvfp4ScaleRule r);
// Inverse of to_string; throws InvalidArgument listing the names.
Nvfp4ScaleRule nvfp4_scale_rule_from_string(const std::string& name);
// "max6 or adaptive".
std::string nvfp4_scale_rule_names();

// head_dim and block_size values the kernels are built for.
constexpr int kSupportedHeadDims[] = {64, 128, 256};
constexpr int kSupportedBlockSizes[] = {16, 32, 64, 128};

// Where token t of kv head h lives in a paged cache, for one format.
//   bf16 / fp8: page p starts at byte p * page_stride_bytes; element (t, h, d)
//               of the page at ((t*H + h)*D + d) * element size.
//   nvfp4:      page p starts at byte p * page_stride_bytes; packed codes at
//               (t*H + h)*D/2 + d/2, E4M3 scales at data_section_bytes +
//               (t*H + h)*D/16 + d/16.
struct KvCacheLayout {
  KvFormat format = KvFormat::bf16;
  int64_t num_blocks = 0;          // pages in the cache
  int32_t block_size = 0;          // token slots per page
  int32_t num_kv_heads = 0;        // H
  int32_t head_dim = 0;            // D
  int64_t page_stride_bytes = 0;   // bytes from one page to the next (>= page payload)
  int64_t data_section_bytes = 0;  // nvfp4: offset of the scale section in a page; others: the payload bytes
  // nvfp4: how the cache write chooses the group scales; other formats: max6 only.
  Nvfp4ScaleRule nvfp4_scales = Nvfp4ScaleRule::max6;

  // Any format (metrale/format.hpp): page_stride_bytes and
  // data_section_bytes 0 mean dense (codes, then the scales if any).
  static KvCacheLayout make(KvFormat format, int64_t num_blocks, int32_t block_size, int32_t num_kv_heads,
                            int32_t head_dim, int64_t page_stride_bytes = 0, int64_t data_section_bytes = 0);
  // Dense layouts (page stride = payload). The optional strides are docs/spec.md 3's
  // `cache_stride` (fp8, in elements = bytes) and `block_stride_bytes`
  // / `data_section_bytes` (nvfp4); 0 means dense.
  static KvCacheLayout bf16(int64_t num_blocks, int32_t block_size, int32_t num_kv_heads, int32_t head_dim);
  static KvCacheLayout fp8(int64_t num_blocks, int32_t block_size, int32_t num_kv_heads, int32_t head_dim,
                           int64_t cache_stride_elems = 0);
  static KvCacheLayout nvfp4(int64_t num_blocks, int32_t block_size, int32_t num_kv_heads, int32_t head_dim,
                             int64_t block_stride_bytes = 0, int64_t data_section_bytes = 0);

  // This layout with the NVFP4 scale rule `r` (validated: NVFP4 only takes adaptive).
  KvCacheLayout with_nvfp4_scales(Nvfp4ScaleRule r) const;

  // Throws InvalidArgument / Unsupported naming the offending field.
  void validate() const;

  int64_t capacity_slots() const { return num_blocks * block_size; }
  int64_t cache_bytes() const { return num_blocks * page_stride_bytes; }  // one of K or V
  // Bytes of codes + scales one token occupies in K and V together (all kv
  // heads), excluding page padding.
  double kv_bytes_per_token() const;
};

// Per-tensor scales. fp8: x = code * k_scale (v_scale). nvfp4: x = e2m1 *
// group scale * k_global_scale (v_global_scale). Ignored by the other formats.
struct KvScales {
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  float k_global_scale = 1.0f;
  float v_global_scale = 1.0f;
};

// One layer's K and V caches: layout, base pointers (16-byte aligned) and scales.
struct KvCacheView {
  KvCacheLayout layout;
  void* k = nullptr;
  void* v = nullptr;
  KvScales scales;
};

// Calibration: per-tensor scales from a running absmax (docs/spec.md 1, 2).
// An absmax of 0 (nothing observed) gives scale 1; a scale below the
// format's min_tensor_scale (metrale/format.hpp; an absmax under about 5e-36)
// is raised to it.
// Both NVFP4 scale rules take the same g: under adaptive, a group within 2/3
// of the absmax has its 4-candidate scale saturate to 448 (finite; the group
// then maps its absmax to amax / (448 g), between 4 and 6), and the larger
// g = absmax / (448 * 4) that would avoid it measured worse (docs/nvfp4_scales.md).
float fp8_scale_from_absmax(float absmax);           // absmax / 448
float nvfp4_global_scale_from_absmax(float absmax);  // absmax / (448 * 6)

}  // namespace metrale
