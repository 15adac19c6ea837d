// KvCacheLayout construction, validation and byte accounting (docs/spec.md 3),
// from the format table (metrale/format.hpp).
#include <string>

#include "metrale/cache.hpp"
#include "metrale/error.hpp"
#include "metrale/format.hpp"

namespace metrale {

KvCacheLayout KvCacheLayout::make(KvFormat format, int64_t num_blocks, int32_t block_size, int32_t num_kv_heads,
                                  int32_t head_dim, int64_t page_stride_bytes, int64_t data_section_bytes) {
  const KvFormatDesc& f = kv_format_desc(format);
  KvCacheLayout l;
  l.format = format;
  l.num_blocks = num_blocks;
  l.block_size = block_size;
  l.num_kv_heads = num_kv_heads;
  l.head_dim = head_dim;
  const int64_t rows = int64_t(block_size) * num_kv_heads;
  l.data_section_bytes = data_section_bytes ? data_section_bytes : rows * f.row_code_bytes(head_dim);
  l.page_stride_bytes =
      page_stride_bytes ? page_stride_bytes : l.data_section_bytes + rows * f.row_scale_bytes(head_dim);
  l.validate();
  return l;
}

KvCacheLayout KvCacheLayout::bf16(int64_t num_blocks, int32_t block_size, int32_t num_kv_heads, int32_t head_dim) {
  return make(KvFormat::bf16, num_blocks, block_size, num_kv_heads, head_dim);
}

KvCacheLayout KvCacheLayout::fp8(int64_t num_blocks, int32_t block_size, int32_t num_kv_heads, int32_t head_dim,
                                 int64_t cache_stride_elems) {
  return make(KvFormat::fp8_e4m3, num_blocks, block_size, num_kv_heads, head_dim, cache_stride_elems);
}

KvCacheLayout KvCacheLayout::nvfp4(int64_t num_blocks, int32_t block_size, int32_t num_kv_heads, int32_t head_dim,
                                   int64_t block_stride_bytes, int64_t data_section_bytes) {
  return make(KvFormat::nvfp4, num_blocks, block_size, num_kv_heads, head_dim, block_stride_bytes,
              data_section_bytes);
}

const char* to_string(Nvfp4ScaleRule r) {
  switch (r) {
    case Nvfp4ScaleRule::max6: return "max6";
    case Nvfp4ScaleRule::adaptive: return "adaptive";
  }
  return "unknown";
}

std::string nvfp4_scale_rule_names() { return "max6 or adaptive"; }

Nvfp4ScaleRule nvfp4_scale_rule_from_string(const std::string& name) {
  for (Nvfp4ScaleRule r : {Nvfp4ScaleRule::max6, Nvfp4ScaleRule::adaptive})
    if (name == to_string(r)) return r;
  detail::throw_invalid("nvfp4_scales", name, nvfp4_scale_rule_names());
}

KvCacheLayout KvCacheLayout::with_nvfp4_scales(Nvfp4ScaleRule r) const {
  KvCacheLayout l = *this;
  l.nvfp4_scales = r;
  l.validate();
  return l;
}

void KvCacheLayout::validate() const {
  using detail::throw_unsupported;
  if (int(format) >= kNumKvFormats) throw_unsupported("layout.format", int(format), kv_format_enumerators());
  const KvFormatDesc& f = kKvFormats[int(format)];
  bool hd_ok = false, bs_ok = false;
  for (int d : kSupportedHeadDims) hd_ok |= (d == head_dim);
  for (int b : kSupportedBlockSizes) bs_ok |= (b == block_size);
  if (!hd_ok) throw_unsupported("layout.head_dim", head_dim, "64, 128, 256");
  if (!bs_ok) throw_unsupported("layout.block_size", block_size, "16, 32, 64, 128");
  METRALE_CHECK_ARG(num_kv_heads > 0 && num_kv_heads <= 1024, "layout.num_kv_heads", num_kv_heads, "1..1024");
  METRALE_CHECK_ARG(num_blocks > 0 && num_blocks <= (int64_t(1) << 31) - 1, "layout.num_blocks", num_blocks,
                    "1..2^31-1 (block ids are int32)");
  const int64_t rows = int64_t(block_size) * num_kv_heads;
  const int64_t data = rows * f.row_code_bytes(head_dim);
  const int64_t scales = rows * f.row_scale_bytes(head_dim);
  METRALE_CHECK_ARG(data_section_bytes >= data, "layout.data_section_bytes", data_section_bytes,
                    ">= block_size*num_kv_heads*head_dim*bytes_per_element = " + std::to_string(data));
  METRALE_CHECK_ARG(data_section_bytes % 16 == 0, "layout.data_section_bytes", data_section_bytes,
                    "a multiple of 16 bytes (16-byte vector loads)");
  METRALE_CHECK_ARG(page_stride_bytes >= data_section_bytes + scales, "layout.page_stride_bytes", page_stride_bytes,
                    ">= data_section_bytes + scale bytes = " + std::to_string(data_section_bytes + scales));
  METRALE_CHECK_ARG(page_stride_bytes % 16 == 0, "layout.page_stride_bytes", page_stride_bytes,
                    "a multiple of 16 bytes (16-byte vector loads)");
  METRALE_CHECK_ARG(nvfp4_scales == Nvfp4ScaleRule::max6 || nvfp4_scales == Nvfp4ScaleRule::adaptive,
                    "layout.nvfp4_scales", int(nvfp4_scales), "max6 (0) or adaptive (1)");
  METRALE_CHECK_ARG(format == KvFormat::nvfp4 || nvfp4_scales == Nvfp4ScaleRule::max6, "layout.nvfp4_scales",
                    to_string(nvfp4_scales),
                    std::string("max6 for a ") + f.name + " cache (the rule chooses NVFP4 group scales)");
  if (f.group_size == 0)
    METRALE_CHECK_ARG(data_section_bytes == data, "layout.data_section_bytes", data_section_bytes,
                      "exactly the page payload " + std::to_string(data) + " for a format without scales");
}

double KvCacheLayout::kv_bytes_per_token() const {
  const KvFormatDesc& f = kv_format_desc(format);
  return 2.0 * num_kv_heads * double(f.row_code_bytes(head_dim) + f.row_scale_bytes(head_dim));
}

}  // namespace metrale
