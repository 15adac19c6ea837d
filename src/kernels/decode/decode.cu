// Host side of the CUDA attention: the target the planner plans for, the
// plan's AttnArgs -> kernel params, the one dispatch over formats and
// kernels, and the entry point run_attention.
#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "host/validate.hpp"
#include "kernels/common/attention_params.hpp"
#include "kernels/common/cuda_check.hpp"
#include "kernels/decode/decode_launch.cuh"
#include "kernels/prefill/prefill_launch.cuh"
#include "kernels/prefill/prefill_params.hpp"
#include "kernels/prefill/prefill_stage.hpp"
#include "kernels/reduce/reduce.hpp"
#include "metrale/cuda.hpp"
#include "metrale/format.hpp"
#include "plan/planner.hpp"

namespace metrale::cuda {
namespace {

using kernels::RunParams;

const kernels::DecodeFormatKernels& format_kernels(KvFormat format) {
  switch (format) {
    case KvFormat::bf16: return kernels::kDecodeBf16Kernels;
    case KvFormat::fp8_e4m3: return kernels::kDecodeFp8Kernels;
    case KvFormat::nvfp4: return kernels::kDecodeNvfp4Kernels;
  }
  detail::throw_unsupported("format", int(format), "bf16, fp8_e4m3, nvfp4");
}

int32_t current_device() {
  int dev = 0;
  detail::cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  return dev;
}

// SM count of device `dev`, asked once per device.
int32_t num_sms(int32_t dev) {
  constexpr int kDevices = 64;
  static std::atomic<int32_t> sms[kDevices] = {};
  if (dev >= 0 && dev < kDevices && sms[dev].load() > 0) return sms[dev].load();
  int n = 0;
  detail::cuda_check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  if (dev >= 0 && dev < kDevices) sms[dev].store(n);
  return n;
}

// What this backend adds to the validation, before any CUDA call: the
// kernel addresses bytes inside a page with 32-bit offsets (the NVFP4 scale
// section starts data_section_bytes in, which the layout leaves open); a
// plan whose kernel serves the arguments' options.
void validate_addressable(const AttnArgs& a) {
  if (a.kv_start != nullptr || a.kv_lens != nullptr)
    detail::throw_unsupported("kv_start", "a shard view",
                              "none on the CUDA backend yet (the CPU backend serves context-parallel query runs)");
  const KvCacheLayout& L = a.cache.layout;
  METRALE_CHECK_ARG(L.data_section_bytes < (int64_t(1) << 30), "layout.data_section_bytes", L.data_section_bytes,
                    "< 2^30 on the CUDA backend (32-bit offsets inside a page)");
}
void validate_plan_kernel(const AttnPlan& plan, const AttnArgs& a) {
  const bool options = a.sinks != nullptr || a.softcap > 0.0f || a.lse != nullptr;
  if ((options || a.q_start != nullptr) && !plan.kernel_id().runs)
    detail::throw_invalid("plan", "a decode plan",
                          "a plan of attention_problem(args) (query runs, sinks, soft-cap or lse take the runs kernel)");
}

// The plan's arguments for the decode kernel: validated `a` (and, for the
// workspace merge, `workspace`); the prefill kernel's: make_prefill_params.
RunParams make_params(const AttnPlan& plan, const AttnArgs& a, float* workspace) {
  RunParams p{};
  kernels::fill_attention_params(p, plan, a, workspace);
  p.cluster_merge = plan.merge == SplitMerge::cluster;
  return p;
}

const kernels::PrefillFormatKernels& prefill_kernels(KvFormat format) {
  switch (format) {
    case KvFormat::bf16: return kernels::kPrefillBf16Kernels;
    case KvFormat::fp8_e4m3: return kernels::kPrefillFp8Kernels;
    case KvFormat::nvfp4: return kernels::kPrefillNvfp4Kernels;
  }
  detail::throw_unsupported("format", int(format), "bf16, fp8_e4m3, nvfp4");
}

// The plan's decode kernel over validated arguments (records only, for the
// workspace merge).
void launch_plan(const AttnPlan& plan, const AttnArgs& a, float* workspace, Stream stream) {
  if (plan.kernel == AttnKernel::prefill) {
    METRALE_CHECK_ARG(a.num_seqs <= geometry::kPrefillMaxGridYZ, "num_seqs", a.num_seqs,
                      "<= 65535 for the prefill kernel (its grid's y)");
    // One CTA per (kv head x split, sequence, tile of a run's rows): in
    // bands (tile_band > 0), the order prefill_scheduler.cuh's prefill_item
    // gives a one-dimensional grid, else the grid (units, sequences, tiles).
    const unsigned units = unsigned(plan.launch.kv_units * plan.num_splits);
    dim3 grid(units, unsigned(a.num_seqs), unsigned(plan.launch.head_tiles));
    if (plan.launch.tile_band > 0) {
      const int64_t ctas = int64_t(units) * a.num_seqs * plan.launch.head_tiles;
      METRALE_CHECK_ARG(ctas <= detail::kMaxGridX, "num_seqs", a.num_seqs,
                        "num_seqs * num_kv_heads * splits * row tiles <= 2^31-1 (the prefill kernel's grid)");
      grid = dim3(unsigned(ctas));
    }
    if (!plan.launch.stage_kv) {
      prefill_kernels(plan.kernel_id().format)
          .launch(kernels::make_prefill_params(plan, a, workspace), plan.kernel_id(), grid, stream);
      return;
    }
    // The pages as bf16 first; then the bf16 kernel (kernel_id's format) over them.
    const kernels::PrefillStageParams staged = kernels::make_prefill_stage_params(plan, a, workspace);
    const kernels::PrefillParams p = kernels::make_prefill_params(plan, a, workspace, &staged);
    kernels::launch_prefill_stage(staged, plan.problem.layout.format, a.num_seqs, stream);
    prefill_kernels(plan.kernel_id().format).launch(p, plan.kernel_id(), grid, stream);
    return;
  }
  const int64_t grid_x = plan.grid_x(a.num_seqs);
  METRALE_CHECK_ARG(grid_x <= detail::kMaxGridX, "num_seqs", a.num_seqs,
                    "num_seqs * num_kv_heads * ceil(group/8) <= 2^31-1 (grid limit)");
  const RunParams p = make_params(plan, a, workspace);
  format_kernels(plan.problem.layout.format)
      .launch(p, plan.kernel_id(), grid_x, plan.merge == SplitMerge::cluster ? plan.num_splits : 1, stream);
}

void run_plan(const AttnPlan& plan, const AttnArgs& args, const SplitKWorkspace& ws, Stream stream) {
  validate_addressable(args);
  validate_plan_kernel(plan, args);
  if (args.num_seqs == 0) return;
  launch_plan(plan, args, ws.data, stream);
  if (plan.merge == SplitMerge::workspace) kernels::launch_splitk_reduce(reduce_args_for(args, ws), stream);
}

}  // namespace

AttnTarget attention_target() {
  const int32_t dev = current_device();
  AttnTarget t;
  t.num_sms = num_sms(dev);
  int l2 = 0;
  detail::cuda_check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev), "cudaDeviceGetAttribute");
  t.l2_bytes = l2;
  t.tma = kernels::tma_encoder_available();
  t.resident_clusters = [](const detail::KernelId& id, int32_t n) {
    return format_kernels(id.format).resident_clusters(id, n);
  };
  return t;
}

void run_attention(const AttnPlan& plan, const AttnArgs& args, const SplitKWorkspace& ws, Stream stream) {
  detail::validate_run(plan, args, ws);  // everything, `out` included, before any launch
  run_plan(plan, args, ws, stream);
}

}  // namespace metrale::cuda

bool metrale::detail::cuda_kernel_instantiated(const KernelId& id) {
  return id.prefill ? cuda::prefill_kernels(id.format).instantiated(id)
                    : cuda::format_kernels(id.format).instantiated(id);
}
