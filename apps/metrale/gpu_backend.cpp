// The demo on the CUDA backend (see backends.hpp): accuracy through
// decode_batch_gpu on the host batch's rows, timing on a bench::DecodeWorkload.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>

#include "backends.hpp"
#include "bench/lib/decode_workload.hpp"
#include "bench/lib/gpu_timing.hpp"
#include "device_buffer.hpp"
#include "kv_setup.hpp"
#include "metrale/cuda.hpp"
#include "metrale/plan.hpp"

namespace metrale::cli {
namespace {

// Time one format on a DecodeWorkload big enough that rotation defeats the L2.
void timing(FormatResult& r, const LayerShape& shape, const GpuTimedBatch& t, const cuda::DeviceInfo& dev,
            double ceiling_gbps) {
  bench::DecodeShape s;
  s.format = r.format;
  s.num_seqs = t.num_seqs;
  s.seq_len = t.seq_len;
  s.mixed_lengths = t.mixed_lengths;
  s.num_q_heads = shape.num_q_heads;
  s.num_kv_heads = shape.num_kv_heads;
  s.head_dim = shape.head_dim;
  s.block_size = shape.block_size;
  const bench::DecodeWorkload wl(s, size_t(12) * size_t(std::max<int64_t>(dev.l2_bytes, 1 << 20)), t.seed);

  DecodeProblem problem;
  problem.num_seqs = s.num_seqs;
  problem.num_q_heads = s.num_q_heads;
  problem.layout = make_layout(s.format, shape, 1);
  problem.max_seq_len = wl.max_seq_len();
  const DecodePlan plan = plan_decode(problem, dev.num_sms);
  r.timed_splits = plan.num_splits;
  DeviceBuffer ws(plan.workspace_bytes);
  DeviceBuffer out(size_t(s.num_seqs) * s.num_q_heads * s.head_dim * sizeof(bf16));
  const SplitKWorkspace workspace{ws.as<float>(), ws.bytes(), plan.num_splits};
  r.time_us = bench::median_us_per_call(
      [&](int call, cudaStream_t stream) {
        cuda::run_decode(plan, wl.args(call % wl.replicas(), out.as<bf16>()), workspace, stream);
      },
      std::max(8, wl.replicas()));
  r.attended_bytes = wl.attended_bytes();
  r.gbps = r.attended_bytes / (r.time_us * 1e3);
  r.ceiling_fraction = ceiling_gbps > 0 ? r.gbps / ceiling_gbps : 0.0;
}

}  // namespace

std::string gpu_unavailable_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA GPU usable here; CUDA runtime: ") + cudaGetErrorString(e);
  }
  if (n == 0) return "no CUDA device";
  if (!cuda::available()) {
    const cuda::DeviceInfo dev = cuda::device_info();
    return dev.name + " is sm_" + std::to_string(dev.major) + std::to_string(dev.minor) +
           "; this build's kernels are for sm_90 (Hopper)";
  }
  return "";
}

GpuRun run_gpu(const HostBatch& batch, const std::vector<double>& ref, const GpuTimedBatch& timed) {
  GpuRun run;
  const cuda::DeviceInfo dev = cuda::device_info();
  run.device = dev.name;
  run.num_sms = dev.num_sms;
  run.ceiling_gbps = bench::measure_read_ceiling_gbps();
  for (KvFormat f : kAllFormats) {
    FormatResult r;
    r.format = f;
    r.kv_bytes_per_token = make_layout(f, batch.shape, 1).kv_bytes_per_token();
    const KvScales scales = calibrated_scales(batch, f);
    const BatchDecode d = decode_batch_gpu(batch, f, scales);
    score(r, batch, ref, d, scales);
    r.accuracy_splits = d.num_splits;
    timing(r, batch.shape, timed, dev, run.ceiling_gbps);
    run.rows.push_back(r);
  }
  cuda_check(cudaDeviceSynchronize(), "demo");
  return run;
}

}  // namespace metrale::cli
