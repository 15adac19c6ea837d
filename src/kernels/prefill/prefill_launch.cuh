// Launch of the prefill-kernel instantiation a plan names (format x
// head_dim); one translation unit per format (prefill_<format>.cu), as for
// decode. Nothing here decides: the plan has.
#pragma once

#include <cuda_runtime.h>

#include "kernels/common/cuda_check.hpp"
#include "kernels/common/dependent_launch.hpp"
#include "kernels/prefill/prefill_kernel.cuh"
#include "metrale/error.hpp"
#include "metrale/plan.hpp"

namespace metrale::kernels {

template <class Fmt, int D, TilePairs kTilePairs>
struct PrefillInstance {
  using Cfg = PrefillConfig<Fmt, D>;
  static constexpr auto kernel = paged_prefill_kernel<Fmt, D, kTilePairs>;
  static void allow_smem() {
    static const bool ok =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes) == cudaSuccess;
    if (!ok) detail::cuda_check(cudaGetLastError(), "cudaFuncSetAttribute(paged_prefill_kernel)");
  }
};

// Calls f(PrefillInstance<Fmt, ...>{}) for the instantiation `id` names:
// head_dim 64, 128, 256, each alone and in CTA pairs where the format and
// head_dim have them (geometry::prefill_can_pair_tiles).
template <class Fmt, class F>
void with_prefill_instance(const detail::KernelId& id, F&& f) {
  const bool pairs = id.tile_pairs;
  constexpr bool kDequantised = Fmt::kBits < 16;
  if (pairs && !geometry::prefill_can_pair_tiles(kDequantised, id.head_dim))
    detail::throw_unsupported("tile_pairs", 1, "bf16, or head_dim 64 / 128 (the prefill kernel's CTA pairs)");
  constexpr TilePairs P = TilePairs::paired, A = TilePairs::alone;
  switch (id.head_dim) {
    case 64: return pairs ? f(PrefillInstance<Fmt, 64, P>{}) : f(PrefillInstance<Fmt, 64, A>{});
    case 128: return pairs ? f(PrefillInstance<Fmt, 128, P>{}) : f(PrefillInstance<Fmt, 128, A>{});
    case 256:
      if constexpr (geometry::prefill_can_pair_tiles(kDequantised, 256)) {
        if (pairs) return f(PrefillInstance<Fmt, 256, P>{});
      }
      return f(PrefillInstance<Fmt, 256, A>{});
  }
  detail::throw_unsupported("head_dim", id.head_dim, "64, 128, 256");
}

// Grid (kv units, sequences, row tiles), or one-dimensional in bands
// (prefill_item). CTA pairs (id.tile_pairs; head_tiles and tile_band are
// then even): clusters of two along the tiles, z of the grid or x of the bands.
template <class Fmt>
void launch_prefill(const PrefillParams& p, const detail::KernelId& id, dim3 grid, cudaStream_t stream) {
  const dim3 cluster = !id.tile_pairs ? dim3(1, 1, 1) : p.tile_band > 0 ? dim3(2, 1, 1) : dim3(1, 1, 2);
  with_prefill_instance<Fmt>(id, [&](auto inst) {
    using I = decltype(inst);
    I::allow_smem();
    detail::launch_dependent(detail::DependentLaunch(grid, dim3(I::Cfg::kThreads), I::Cfg::kSmemBytes, stream, cluster),
                             I::kernel, "paged_prefill_kernel", p);
  });
}

// Whether `id` names one of the instantiations above: host code, no GPU needed.
template <class Fmt>
bool prefill_instantiated(const detail::KernelId& id) {
  return detail::runs_supported([&] { with_prefill_instance<Fmt>(id, [](auto) {}); });
}

// The per-format translation units (prefill_<format>.cu).
struct PrefillFormatKernels {
  void (*launch)(const PrefillParams& p, const detail::KernelId& id, dim3 grid, cudaStream_t stream);
  bool (*instantiated)(const detail::KernelId& id);
};
extern const PrefillFormatKernels kPrefillBf16Kernels, kPrefillFp8Kernels, kPrefillNvfp4Kernels;

}  // namespace metrale::kernels
