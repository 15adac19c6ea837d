// KvCacheLayout construction, validation and byte accounting (SYSTEM.md 3).
#include <string>

#include "metrale/cache.hpp"
#include "metrale/codec.hpp"
#include "metrale/error.hpp"

namespace metrale {

const char* to_string(KvFormat f) {
  switch (f) {
    case KvFormat::bf16: return "bf16";
    case KvFormat::fp8_e4m3: return "fp8";
    case KvFormat::nvfp4: return "nvfp4";
  }
  return "unknown";
}

KvFormat kv_format_from_string(const std::string& name) {
  for (KvFormat f : {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4})
    if (name == to_string(f)) return f;
  detail::throw_invalid("format", name, "bf16, fp8 or nvfp4");
}

namespace {
// Bytes of codes one (token, kv head) row occupies in the data section.
int64_t row_data_bytes(KvFormat f, int64_t head_dim) {
  switch (f) {
    case KvFormat::bf16: return head_dim * 2;
    case KvFormat::fp8_e4m3: return head_dim;
    case KvFormat::nvfp4: return head_dim / 2;
  }
  return 0;
}
int64_t row_scale_bytes(KvFormat f, int64_t head_dim) {
  return f == KvFormat::nvfp4 ? head_dim / codec::kNvfp4GroupSize : 0;
}
}  // namespace

KvCacheLayout KvCacheLayout::bf16(int64_t num_blocks, int32_t block_size, int32_t num_kv_heads, int32_t head_dim) {
  KvCacheLayout l;
  l.format = KvFormat::bf16;
  l.num_blocks = num_blocks;
  l.block_size = block_size;
  l.num_kv_heads = num_kv_heads;
  l.head_dim = head_dim;
  l.data_section_bytes = int64_t(block_size) * num_kv_heads * head_dim * 2;
  l.page_stride_bytes = l.data_section_bytes;
  l.validate();
  return l;
}

KvCacheLayout KvCacheLayout::fp8(int64_t num_blocks, int32_t block_size, int32_t num_kv_heads, int32_t head_dim,
                                 int64_t cache_stride_elems) {
  KvCacheLayout l;
  l.format = KvFormat::fp8_e4m3;
  l.num_blocks = num_blocks;
  l.block_size = block_size;
  l.num_kv_heads = num_kv_heads;
  l.head_dim = head_dim;
  l.data_section_bytes = int64_t(block_size) * num_kv_heads * head_dim;
  l.page_stride_bytes = cache_stride_elems ? cache_stride_elems : l.data_section_bytes;
  l.validate();
  return l;
}

KvCacheLayout KvCacheLayout::nvfp4(int64_t num_blocks, int32_t block_size, int32_t num_kv_heads, int32_t head_dim,
                                   int64_t block_stride_bytes, int64_t data_section_bytes) {
  KvCacheLayout l;
  l.format = KvFormat::nvfp4;
  l.num_blocks = num_blocks;
  l.block_size = block_size;
  l.num_kv_heads = num_kv_heads;
  l.head_dim = head_dim;
  const int64_t rows = int64_t(block_size) * num_kv_heads;
  l.data_section_bytes = data_section_bytes ? data_section_bytes : rows * head_dim / 2;
  l.page_stride_bytes = block_stride_bytes ? block_stride_bytes : l.data_section_bytes + rows * head_dim / 16;
  l.validate();
  return l;
}

void KvCacheLayout::validate() const {
  using detail::throw_unsupported;
  if (format != KvFormat::bf16 && format != KvFormat::fp8_e4m3 && format != KvFormat::nvfp4)
    throw_unsupported("layout.format", int(format), "bf16 (0), fp8_e4m3 (1), nvfp4 (2)");
  bool hd_ok = false, bs_ok = false;
  for (int d : kSupportedHeadDims) hd_ok |= (d == head_dim);
  for (int b : kSupportedBlockSizes) bs_ok |= (b == block_size);
  if (!hd_ok) throw_unsupported("layout.head_dim", head_dim, "64, 128, 256");
  if (!bs_ok) throw_unsupported("layout.block_size", block_size, "16, 32, 64, 128");
  METRALE_CHECK_ARG(num_kv_heads > 0 && num_kv_heads <= 1024, "layout.num_kv_heads", num_kv_heads, "1..1024");
  METRALE_CHECK_ARG(num_blocks > 0 && num_blocks <= (int64_t(1) << 31) - 1, "layout.num_blocks", num_blocks,
                    "1..2^31-1 (block ids are int32)");
  const int64_t rows = int64_t(block_size) * num_kv_heads;
  const int64_t data = rows * row_data_bytes(format, head_dim);
  const int64_t scales = rows * row_scale_bytes(format, head_dim);
  METRALE_CHECK_ARG(data_section_bytes >= data, "layout.data_section_bytes", data_section_bytes,
                    ">= block_size*num_kv_heads*head_dim*bytes_per_element = " + std::to_string(data));
  METRALE_CHECK_ARG(data_section_bytes % 16 == 0, "layout.data_section_bytes", data_section_bytes,
                    "a multiple of 16 bytes (16-byte vector loads)");
  METRALE_CHECK_ARG(page_stride_bytes >= data_section_bytes + scales, "layout.page_stride_bytes", page_stride_bytes,
                    ">= data_section_bytes + scale bytes = " + std::to_string(data_section_bytes + scales));
  METRALE_CHECK_ARG(page_stride_bytes % 16 == 0, "layout.page_stride_bytes", page_stride_bytes,
                    "a multiple of 16 bytes (16-byte vector loads)");
  if (format != KvFormat::nvfp4)
    METRALE_CHECK_ARG(data_section_bytes == data, "layout.data_section_bytes", data_section_bytes,
                      "exactly the page payload " + std::to_string(data) + " for bf16/fp8");
}

double KvCacheLayout::kv_bytes_per_token() const {
  return 2.0 * num_kv_heads * double(row_data_bytes(format, head_dim) + row_scale_bytes(format, head_dim));
}

float fp8_scale_from_absmax(float absmax) { return absmax > 0.0f ? absmax / codec::kE4M3Max : 1.0f; }
float nvfp4_global_scale_from_absmax(float absmax) {
  return absmax > 0.0f ? absmax / (codec::kE4M3Max * codec::kE2M1Max) : 1.0f;
}

}  // namespace metrale
