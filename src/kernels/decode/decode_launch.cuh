// Launch of one decode-kernel instantiation (format x head_dim). Each format
// has its own translation unit (decode_<format>.cu) so they compile in
// parallel; decode.cu dispatches to them.
#pragma once

#include <cuda_runtime.h>

#include "kernels/common/cuda_check.hpp"
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
  // Programmatic dependent launch: the grid may be scheduled while the
  // previous kernel of the stream finishes (its launch latency hidden); the
  // kernel reads nothing the stream wrote before griddepcontrol.wait.
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(num_ctas), unsigned(p.num_splits));
  cfg.blockDim = dim3(Cfg::kThreads);
  cfg.dynamicSmemBytes = Cfg::kSmemBytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  detail::cuda_check(cudaLaunchKernelEx(&cfg, kernel, p), "paged_decode_kernel");
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
