// Launch of one decode-kernel instantiation (format x head_dim). Each format
// has its own translation unit (decode_<format>.cu) so they compile in
// parallel; decode.cu dispatches to them.
#pragma once

#include <cuda_runtime.h>

#include "kernels/common/cuda_check.hpp"
#include "kernels/common/dependent_launch.hpp"
#include "kernels/decode/decode_kernel.cuh"

namespace metrale::kernels {

template <class Fmt, int D, bool kTma>
void launch_decode_variant(const DecodeParams& p, int64_t num_ctas, cudaStream_t stream) {
  using Cfg = DecodeConfig<Fmt, D, kTma>;
  auto kernel = paged_decode_kernel<Fmt, D, kTma>;
  static const bool smem_ok = [&] {  // once per instantiation: allow > 48 KB of shared memory
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes) == cudaSuccess;
  }();
  if (!smem_ok) detail::cuda_check(cudaGetLastError(), "cudaFuncSetAttribute(paged_decode_kernel)");
  // The kernel reads nothing before its griddepcontrol.wait.
  detail::launch_dependent(kernel, dim3(unsigned(num_ctas), unsigned(p.num_splits)), dim3(Cfg::kThreads),
                           Cfg::kSmemBytes, stream, "paged_decode_kernel", p);
}

// The TMA kernel for the unscaled formats (DecodeConfig says why not NVFP4).
template <class Fmt, int D>
void launch_decode_instance(const DecodeParams& p, int64_t num_ctas, cudaStream_t stream) {
  if constexpr (!Fmt::kScaled) {
    if (p.use_tma) return launch_decode_variant<Fmt, D, true>(p, num_ctas, stream);
  }
  launch_decode_variant<Fmt, D, false>(p, num_ctas, stream);
}

template <class Fmt>
void launch_decode_format(const DecodeParams& p, int head_dim, int64_t num_ctas, cudaStream_t stream) {
  switch (head_dim) {
    case 64: return launch_decode_instance<Fmt, 64>(p, num_ctas, stream);
    case 128: return launch_decode_instance<Fmt, 128>(p, num_ctas, stream);
    case 256: return launch_decode_instance<Fmt, 256>(p, num_ctas, stream);
  }
  detail::throw_unsupported("head_dim", head_dim, "64, 128, 256");
}

void launch_decode_bf16(const DecodeParams& p, int head_dim, int64_t num_ctas, cudaStream_t stream);
void launch_decode_fp8(const DecodeParams& p, int head_dim, int64_t num_ctas, cudaStream_t stream);
void launch_decode_nvfp4(const DecodeParams& p, int head_dim, int64_t num_ctas, cudaStream_t stream);

}  // namespace metrale::kernels
