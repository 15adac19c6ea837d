// bf16_absmax on the GPU (docs/spec.md 1): max |x| over num_rows strided rows of
// row_len bf16 values, folded into a device f32 with an atomic max. NaNs are
// ignored, as in cpu::bf16_absmax.
//
// Design: rows are served by groups of G threads (G a power of two, 8..256,
// about a quarter of the row's number of 16-byte vectors); a 256-thread block holds
// 256/G groups and groups stride over rows with a grid-stride loop over a
// capped grid. Within a row, the few elements before the first 16-byte
// boundary and after the last one are read one by one and the rest with
// 16-byte loads (four predicated loads in flight per thread), so any pointer alignment
// and any row_stride are handled, with vector loads wherever the data allows.
// A contiguous input (row_stride == row_len, or one row) is re-cut into rows
// of kFlatRow elements so a single long row still spreads over the grid. Each
// thread keeps a running f32 max; the block reduces it with warp shuffles and
// issues one atomicMax on the int bit pattern (order-preserving for
// non-negative floats; a negative or -0 initial value loses to any result).
#include <cuda_runtime.h>

#include <cstdint>

#include "host/validate.hpp"
#include "kernels/common/cuda_check.hpp"
#include "metrale/codec.hpp"
#include "metrale/cuda.hpp"
#include "metrale/error.hpp"

namespace metrale::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;
constexpr int64_t kFlatRow = 8192;  // elements per virtual row of a contiguous input

struct AbsmaxParams {
  const bf16* x;
  int64_t num_rows;
  int64_t row_len;       // elements of every row but the last
  int64_t last_row_len;  // elements of the last row
  int64_t row_stride;
  float* absmax;
  int32_t log2_group;  // G = 1 << log2_group threads per row
};

// |x| of a bf16 as f32; NaN becomes 0 so that it never wins the max.
__device__ __forceinline__ float abs_or_zero(uint32_t bits16) {
  const uint32_t a = bits16 & 0x7fffu;
  return codec::f32_from_bits(a > 0x7f80u ? 0u : (a << 16));
}

__device__ __forceinline__ float max8(float acc, uint4 v) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaxf(acc, abs_or_zero(w[i] & 0xffffu));
    acc = fmaxf(acc, abs_or_zero(w[i] >> 16));
  }
  return acc;
}

__global__ void __launch_bounds__(kThreads) bf16_absmax_kernel(const __grid_constant__ AbsmaxParams p) {
  const int32_t G = 1 << p.log2_group;
  const int32_t lane = threadIdx.x & (G - 1);
  const int64_t groups_per_block = kThreads >> p.log2_group;
  const int64_t group0 = int64_t(blockIdx.x) * groups_per_block + (threadIdx.x >> p.log2_group);
  const int64_t group_stride = int64_t(gridDim.x) * groups_per_block;
  const uint16_t* __restrict__ xs = reinterpret_cast<const uint16_t*>(p.x);

  float acc = 0.0f;
  for (int64_t r = group0; r < p.num_rows; r += group_stride) {
    const uint16_t* row = xs + r * p.row_stride;
    const int64_t len = (r == p.num_rows - 1) ? p.last_row_len : p.row_len;
    // Elements before the first 16-byte boundary (x is 2-byte aligned).
    const int64_t mis = int64_t((16u - (uint32_t(reinterpret_cast<uintptr_t>(row)) & 15u)) & 15u) >> 1;
    const int64_t head = mis < len ? mis : len;
    const int64_t nvec = (len - head) >> 3;
    const int64_t tail0 = head + (nvec << 3);
    if (lane < head) acc = fmaxf(acc, abs_or_zero(__ldg(row + lane)));
    if (lane < len - tail0) acc = fmaxf(acc, abs_or_zero(__ldg(row + tail0 + lane)));
    // Four predicated 16-byte loads in flight per pass (a skipped one reads
    // as zeros, which never raise the max).
    const uint4* vec = reinterpret_cast<const uint4*>(row + head);
    for (int64_t v = lane; v < nvec; v += 4 * G) {
      uint4 q[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) q[u] = (v + u * G < nvec) ? __ldg(vec + v + u * G) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < 4; ++u) acc = max8(acc, q[u]);
    }
  }

  // Block reduction: warp shuffles, then one value per warp through shared memory.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc = fmaxf(acc, __shfl_xor_sync(0xffffffffu, acc, o));
  __shared__ float warp_max[kThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = warp_max[0];
#pragma unroll
    for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
    atomicMax(reinterpret_cast<int*>(p.absmax), __float_as_int(m));
  }
}

}  // namespace

void bf16_absmax(const bf16* x, int64_t num_rows, int64_t row_len, int64_t row_stride, float* absmax,
                 Stream stream) {
  // Validation is pure host code and precedes any CUDA runtime call.
  detail::validate_absmax(x, num_rows, row_len, row_stride, absmax);
  METRALE_CHECK_ARG((reinterpret_cast<uintptr_t>(absmax) & 3u) == 0, "absmax", static_cast<const void*>(absmax),
                    "a 4-byte aligned device f32");
  if (num_rows == 0 || row_len == 0) return;
  METRALE_CHECK_ARG((reinterpret_cast<uintptr_t>(x) & 1u) == 0, "x", static_cast<const void*>(x),
                    "a 2-byte aligned bf16 pointer");

  AbsmaxParams p{};
  p.x = x;
  p.absmax = absmax;
  if (num_rows == 1 || row_stride == row_len) {
    // Contiguous: re-cut into rows of kFlatRow elements.
    const int64_t n = num_rows * row_len;
    p.row_len = p.row_stride = kFlatRow;
    p.num_rows = (n + kFlatRow - 1) / kFlatRow;
    p.last_row_len = n - (p.num_rows - 1) * kFlatRow;
  } else {
    p.num_rows = num_rows;
    p.row_len = p.last_row_len = row_len;
    p.row_stride = row_stride;
  }
  // Group size: about a quarter of the row's 16-byte vectors (each thread
  // keeps four loads in flight), 8..256 threads (at least 8: the up to 7
  // unaligned head and tail elements are read by one lane each).
  const int64_t vecs = (p.row_len + 7) / 8;
  int log2_group = 3;
  while (log2_group < 8 && (int64_t(4) << log2_group) < vecs) ++log2_group;
  p.log2_group = log2_group;
  const int64_t groups_per_block = kThreads >> log2_group;
  const int64_t blocks = (p.num_rows + groups_per_block - 1) / groups_per_block;
  const int64_t grid = blocks < kMaxBlocks ? blocks : kMaxBlocks;
  bf16_absmax_kernel<<<dim3(uint32_t(grid)), dim3(kThreads), 0, reinterpret_cast<cudaStream_t>(stream)>>>(p);
  detail::check_launch("bf16_absmax");
}

}  // namespace metrale::cuda
