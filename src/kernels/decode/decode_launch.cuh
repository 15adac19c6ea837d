// Launch of one decode-kernel instantiation (format x head_dim). Each format
// has its own translation unit (decode_<format>.cu) so they compile in
// parallel; decode.cu dispatches to them.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "kernels/common/cuda_check.hpp"
#include "kernels/common/dependent_launch.hpp"
#include "kernels/decode/decode_kernel.cuh"

namespace metrale::kernels {

// Largest split count merged inside a cluster (portable cluster size).
constexpr int32_t kMaxClusterSplits = 8;

// Launches one instantiation. With p.cluster_merge, the split pass runs as
// clusters of its splits that merge in-kernel (decode_kernel.cuh) where such
// clusters fit the GPU; otherwise it writes the workspace. Returns whether
// the output is complete (single pass or merged), i.e. no reduce is needed.
template <class Fmt, int D, bool kTma, bool kPair>
bool launch_decode_variant(DecodeParams p, int64_t num_ctas, cudaStream_t stream) {
  using Cfg = DecodeConfig<Fmt, D, kTma, kPair>;
  auto kernel = paged_decode_kernel<Fmt, D, kTma, kPair>;
  static const bool smem_ok = [&] {  // once per instantiation: allow > 48 KB of shared memory
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes) == cudaSuccess;
  }();
  if (!smem_ok) detail::cuda_check(cudaGetLastError(), "cudaFuncSetAttribute(paged_decode_kernel)");
  const dim3 grid(unsigned(num_ctas), unsigned(p.num_splits)), block(Cfg::kThreads);
  if (p.cluster_merge) {
    // How many clusters of n such CTAs can be resident at once, once per
    // split count. The merge holds every CTA of a cluster until the last one
    // is done, and clusters are placed whole inside one GPC: a grid of more
    // clusters than that runs them in waves. There the workspace and the
    // reduce are faster (fp8 d64 4x8192, 32 clusters of 8: 25.4 us in
    // clusters against 16.1 through the workspace; session 6 in
    // bench/RESULTS.md).
    static std::atomic<int> resident[kMaxClusterSplits + 1] = {};  // 0 unknown, else 1 + the count
    const int n = p.num_splits;
    if (n < 2 || n > kMaxClusterSplits) detail::throw_invalid("num_splits", std::to_string(n), "2..8 for a cluster merge");
    if (resident[n].load() == 0) {
      int clusters = 0;
      const detail::DependentLaunch probe(dim3(unsigned(n), unsigned(n)), block, Cfg::kSmemBytes, stream, unsigned(n));
      if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &probe.cfg) != cudaSuccess) {
        cudaGetLastError();  // an unsupported query is an answer (none), not an error
        clusters = 0;
      }
      resident[n].store(1 + clusters);
    }
    p.cluster_merge = num_ctas <= resident[n].load() - 1;
  }
  // The kernel reads nothing before its griddepcontrol.wait.
  detail::launch_dependent(
      detail::DependentLaunch(grid, block, Cfg::kSmemBytes, stream, p.cluster_merge ? unsigned(p.num_splits) : 1u),
      kernel, "paged_decode_kernel", p);
  return p.num_splits == 1 || p.cluster_merge;
}

// The TMA kernel for the unscaled formats (DecodeConfig says why not NVFP4).
template <class Fmt, int D, bool kPair = false>
bool launch_decode_instance(const DecodeParams& p, int64_t num_ctas, cudaStream_t stream) {
  if constexpr (!Fmt::kScaled) {
    if (p.use_tma) return launch_decode_variant<Fmt, D, true, kPair>(p, num_ctas, stream);
  }
  return launch_decode_variant<Fmt, D, false, kPair>(p, num_ctas, stream);
}

template <class Fmt>
bool launch_decode_format(const DecodeParams& p, int head_dim, int64_t num_ctas, cudaStream_t stream) {
  switch (head_dim) {
    case 64:
      return p.pair_kv_heads ? launch_decode_instance<Fmt, 128, true>(p, num_ctas, stream)
                             : launch_decode_instance<Fmt, 64>(p, num_ctas, stream);
    case 128: return launch_decode_instance<Fmt, 128>(p, num_ctas, stream);
    case 256: return launch_decode_instance<Fmt, 256>(p, num_ctas, stream);
  }
  detail::throw_unsupported("head_dim", head_dim, "64, 128, 256");
}

// Each returns launch_decode_variant's answer: whether the output is complete.
bool launch_decode_bf16(const DecodeParams& p, int head_dim, int64_t num_ctas, cudaStream_t stream);
bool launch_decode_fp8(const DecodeParams& p, int head_dim, int64_t num_ctas, cudaStream_t stream);
bool launch_decode_nvfp4(const DecodeParams& p, int head_dim, int64_t num_ctas, cudaStream_t stream);

}  // namespace metrale::kernels
