// Launch of the decode-kernel instantiation a plan names (detail::KernelId:
// format x head_dim x load path x pairing). Each format has its own
// translation unit (decode_<format>.cu) so they compile in parallel;
// decode.cu dispatches to them. Nothing here decides: the plan has.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "kernels/common/cuda_check.hpp"
#include "kernels/common/dependent_launch.hpp"
#include "kernels/decode/decode_kernel.cuh"
#include "metrale/error.hpp"
#include "metrale/plan.hpp"

namespace metrale::kernels {

// One instantiation, as a type.
template <class Fmt, int D, KvLoads kLoads, KvHeads kHeads, Columns kColumns = Columns::heads, int NT = 1, int HP = 1>
struct DecodeInstance {
  static constexpr bool kQueryRuns = kColumns == Columns::query_runs;
  using Cfg = DecodeConfig<Fmt, D, kLoads == KvLoads::tma, kHeads == KvHeads::paired, NT, HP>;
  static constexpr auto kernel = paged_decode_kernel<Fmt, D, kLoads, kHeads, kColumns, NT, HP>;
  // Allows the instantiation's dynamic shared memory (> 48 KB), once.
  static void allow_smem() {
    static const bool ok =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes) == cudaSuccess;
    if (!ok) detail::cuda_check(cudaGetLastError(), "cudaFuncSetAttribute(paged_decode_kernel)");
  }
};

// Calls f(DecodeInstance<Fmt, ...>{}) for the instantiation `id` names: the
// shipped set is head_dim 64, 128, 256 and pairs of 64 (run at 128), each
// through registers, and for the unscaled formats also through TMA
// (DecodeConfig says why not NVFP4); and the runs kernel (query runs,
// sinks, soft-cap, lse) at head_dim 64, 128, 256 on both paths, at 64 and
// 128 also with the column tiles of geometry::runs_col_tiles, and for NVFP4
// at 256 with head_dim split over teams of two warps and two column tiles
// (geometry::runs_can_split_head_dim).
template <class Fmt, KvLoads L, class F>
void with_decode_head_dim(const detail::KernelId& id, F&& f) {
  constexpr KvHeads S = KvHeads::single, P = KvHeads::paired;
  constexpr Columns R = Columns::query_runs;
  static_assert(geometry::kMaxRunsColTiles == 2, "the column tiles instantiated below");
  if (id.runs && id.head_dim_parts == 2) {
    if constexpr (Fmt::kScaled && L == KvLoads::registers) {
      if (id.head_dim == 256 && id.col_tiles == 2) return f(DecodeInstance<Fmt, 256, L, S, R, 2, 2>{});
    }
  } else if (id.runs && id.col_tiles == 2) {
    switch (id.head_dim) {
      case 64: return f(DecodeInstance<Fmt, 64, L, S, R, 2>{});
      case 128: return f(DecodeInstance<Fmt, 128, L, S, R, 2>{});
    }
  } else if (id.runs && id.col_tiles == 1) {
    switch (id.head_dim) {
      case 64: return f(DecodeInstance<Fmt, 64, L, S, R>{});
      case 128: return f(DecodeInstance<Fmt, 128, L, S, R>{});
      case 256: return f(DecodeInstance<Fmt, 256, L, S, R>{});
    }
  } else if (id.runs) {
    // A runs id with column tiles not instantiated above: refused below,
    // never launched as the decode kernel.
  } else if (id.pair_kv_heads) {
    if (id.head_dim == 128) return f(DecodeInstance<Fmt, 128, L, P>{});
  } else {
    switch (id.head_dim) {
      case 64: return f(DecodeInstance<Fmt, 64, L, S>{});
      case 128: return f(DecodeInstance<Fmt, 128, L, S>{});
      case 256: return f(DecodeInstance<Fmt, 256, L, S>{});
    }
  }
  detail::throw_unsupported("head_dim", id.head_dim,
                            "64, 128, 256 (128 for a pair of kv heads of 64; 64 or 128 for 2 column tiles; "
                            "NVFP4 256 for head_dim parts)");
}
template <class Fmt, class F>
void with_decode_instance(const detail::KernelId& id, F&& f) {
  if (id.load_path == detail::LoadPath::tma) {
    if constexpr (!Fmt::kScaled) return with_decode_head_dim<Fmt, KvLoads::tma>(id, f);
    detail::throw_unsupported("load_path", "tma", "registers for a scaled format");
  }
  with_decode_head_dim<Fmt, KvLoads::registers>(id, f);
}

// Whether `id` names one of the instantiations above (with_decode_instance
// finds it): host code, no GPU needed.
template <class Fmt>
bool decode_instantiated(const detail::KernelId& id) {
  return detail::runs_supported([&] { with_decode_instance<Fmt>(id, [](auto) {}); });
}

// Launches the plan's kernel over grid (grid_x, p.num_splits); cluster > 1:
// clusters of that many split CTAs, which merge in-kernel.
template <class Fmt>
void launch_decode(const RunParams& p, const detail::KernelId& id, int64_t grid_x, int32_t cluster,
                   cudaStream_t stream) {
  with_decode_instance<Fmt>(id, [&](auto inst) {
    using I = decltype(inst);
    I::allow_smem();
    // The kernel reads nothing before its griddepcontrol.wait.
    detail::launch_dependent(detail::DependentLaunch(dim3(unsigned(grid_x), unsigned(p.num_splits)),
                                                     dim3(I::Cfg::kThreads), I::Cfg::kSmemBytes, stream,
                                                     dim3(1, unsigned(cluster), 1)),
                             I::kernel, "paged_decode_kernel", static_cast<const KernelParams<I::kQueryRuns>&>(p));
  });
}

// How many clusters of n CTAs of the instantiation `id` the current GPU
// holds at once (cudaOccupancyMaxActiveClusters; 0 where it cannot launch
// them), asked once per instantiation and n.
template <class Fmt>
int64_t resident_decode_clusters(const detail::KernelId& id, int32_t n) {
  if (n < 2 || n > geometry::kMaxClusterSplits) return 0;
  int64_t result = 0;
  with_decode_instance<Fmt>(id, [&](auto inst) {
    using I = decltype(inst);
    static std::atomic<int> resident[geometry::kMaxClusterSplits + 1] = {};  // 0 unknown, else 1 + the count
    if (resident[n].load() == 0) {
      I::allow_smem();
      int clusters = 0;
      const detail::DependentLaunch probe(dim3(unsigned(n), unsigned(n)), dim3(I::Cfg::kThreads), I::Cfg::kSmemBytes,
                                          nullptr, unsigned(n));
      if (cudaOccupancyMaxActiveClusters(&clusters, I::kernel, &probe.cfg) != cudaSuccess) {
        cudaGetLastError();  // an unsupported query is an answer (none), not an error
        clusters = 0;
      }
      resident[n].store(1 + clusters);
    }
    result = resident[n].load() - 1;
  });
  return result;
}

// The per-format translation units (decode_<format>.cu).
struct DecodeFormatKernels {
  void (*launch)(const RunParams& p, const detail::KernelId& id, int64_t grid_x, int32_t cluster,
                 cudaStream_t stream);
  int64_t (*resident_clusters)(const detail::KernelId& id, int32_t n);
  bool (*instantiated)(const detail::KernelId& id);
};
extern const DecodeFormatKernels kDecodeBf16Kernels, kDecodeFp8Kernels, kDecodeNvfp4Kernels;

}  // namespace metrale::kernels
