// TMA descriptors of a paged KV cache (host side). The driver's encoder is
// reached through the runtime's entry-point query, so the library needs no
// link against libcuda.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "kernels/decode/kv_tensor_map.hpp"
#include "metrale/format.hpp"

namespace metrale::kernels {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();  // a missing entry point is not a sticky error for the caller
      return PFN_cuTensorMapEncodeTiled_v12000(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace

bool tma_encoder_available() { return encoder() != nullptr; }

bool make_kv_tensor_map(CUtensorMap& map, const void* base, const KvCacheLayout& L) {
  const auto encode = encoder();
  if (encode == nullptr) return false;
  const uint64_t row = uint64_t(kv_format_desc(L.format).row_code_bytes(L.head_dim));
  const cuuint64_t dims[4] = {row, cuuint64_t(L.num_kv_heads), cuuint64_t(L.block_size), cuuint64_t(L.num_blocks)};
  const cuuint64_t strides[3] = {row, row * L.num_kv_heads, cuuint64_t(L.page_stride_bytes)};
  const cuuint32_t box_row = cuuint32_t(row < 128 ? row : 128);
  const cuuint32_t box[4] = {box_row, 1, 16, 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  return encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, const_cast<void*>(base), dims, strides, box, unit,
                CU_TENSOR_MAP_INTERLEAVE_NONE,
                box_row == 128 ? CU_TENSOR_MAP_SWIZZLE_128B
                               : (box_row == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_32B),
                // No L2 promotion past the box: a wider fetch would read the
                // neighbouring heads' rows from DRAM for nothing.
                box_row == 128 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                               : (box_row == 64 ? CU_TENSOR_MAP_L2_PROMOTION_L2_64B : CU_TENSOR_MAP_L2_PROMOTION_NONE),
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace metrale::kernels
