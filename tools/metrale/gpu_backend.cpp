// The demo on the CUDA backend (see backends.hpp): accuracy on device copies
// of the host batch's rows, timing on a bench::DecodeWorkload.
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

// The host batch's inputs on the device, shared by every format.
struct DeviceBatch {
  explicit DeviceBatch(const HostBatch& b)
      : key(b.key.data(), b.key.size()),
        value(b.value.data(), b.value.size()),
        q(b.q.data(), b.q.size()),
        slots(b.slot_mapping.data(), b.slot_mapping.size()),
        tables(b.block_tables.data(), b.block_tables.size()),
        lens(b.seq_lens.data(), b.seq_lens.size()) {}
  DeviceBuffer key, value, q, slots, tables, lens;
};

// Quantize, decode and compare one format on the accuracy batch.
void accuracy(FormatResult& r, const HostBatch& b, const DeviceBatch& d, const std::vector<double>& ref,
              int32_t num_sms) {
  const KvCacheLayout layout = make_layout(r.format, b.shape, b.num_blocks);
  DeviceBuffer absmax(2 * sizeof(float));
  cuda_check(cudaMemset(absmax.as<void>(), 0, 2 * sizeof(float)), "cudaMemset");
  cuda::bf16_absmax(d.key.as<bf16>(), b.num_tokens(), b.kv_row(), b.kv_row(), absmax.as<float>());
  cuda::bf16_absmax(d.value.as<bf16>(), b.num_tokens(), b.kv_row(), b.kv_row(), absmax.as<float>() + 1);
  float am[2];
  cuda_check(cudaMemcpy(am, absmax.as<void>(), sizeof(am), cudaMemcpyDeviceToHost), "cudaMemcpy(absmax)");

  DeviceBuffer k_cache(size_t(layout.cache_bytes())), v_cache(size_t(layout.cache_bytes()));
  const KvCacheView cache{layout, k_cache.as<void>(), v_cache.as<void>(), scales_from_absmax(r.format, am[0], am[1])};
  CacheWriteArgs w;
  w.key = d.key.as<bf16>();
  w.key_stride = b.kv_row();
  w.value = d.value.as<bf16>();
  w.value_stride = b.kv_row();
  w.slot_mapping = d.slots.as<int64_t>();
  w.num_tokens = b.num_tokens();
  w.cache = cache;
  cuda::reshape_and_cache(w);

  DecodeProblem problem;
  problem.num_seqs = b.num_seqs();
  problem.num_q_heads = b.shape.num_q_heads;
  problem.layout = layout;
  problem.max_seq_len = b.max_seq_len();
  const DecodePlan plan = plan_decode(problem, num_sms);
  r.accuracy_splits = plan.num_splits;
  DeviceBuffer ws(plan.workspace_bytes);
  DeviceBuffer out(size_t(b.out_elems()) * sizeof(bf16));
  cuda_check(cudaMemset(out.as<void>(), 0xff, out.bytes()), "cudaMemset(out)");  // NaN poison: unwritten shows

  DecodeArgs a;
  a.q = d.q.as<bf16>();
  a.q_stride = b.q_row();
  a.num_seqs = b.num_seqs();
  a.num_q_heads = b.shape.num_q_heads;
  a.cache = cache;
  a.block_tables = d.tables.as<int32_t>();
  a.max_blocks_per_seq = b.max_blocks_per_seq;
  a.seq_lens = d.lens.as<int32_t>();
  a.sm_scale = b.sm_scale;
  a.out = out.as<bf16>();
  cuda::run_decode(plan, a, SplitKWorkspace{ws.as<float>(), ws.bytes(), plan.num_splits});
  AlignedVector<bf16> host_out(size_t(b.out_elems()));
  cuda_check(cudaMemcpy(host_out.data(), out.as<void>(), out.bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy(out)");
  r.error = compare_to_reference(host_out.data(), ref, b.num_seqs(), b.shape.num_q_heads, b.shape.head_dim);

  AlignedVector<uint8_t> host_k(k_cache.bytes()), host_v(v_cache.bytes());
  cuda_check(cudaMemcpy(host_k.data(), k_cache.as<void>(), k_cache.bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy(k)");
  cuda_check(cudaMemcpy(host_v.data(), v_cache.as<void>(), v_cache.bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy(v)");
  const KvCacheView host_cache{layout, host_k.data(), host_v.data(), cache.scales};
  r.kernel_error = compare_to_reference(host_out.data(), attention_f64(b, cache_rows(b, host_cache)), b.num_seqs(),
                                        b.shape.num_q_heads, b.shape.head_dim);
}

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
  const DeviceBatch d(batch);
  for (KvFormat f : kAllFormats) {
    FormatResult r;
    r.format = f;
    r.kv_bytes_per_token = make_layout(f, batch.shape, 1).kv_bytes_per_token();
    accuracy(r, batch, d, ref, dev.num_sms);
    timing(r, batch.shape, timed, dev, run.ceiling_gbps);
    run.rows.push_back(r);
  }
  cuda_check(cudaDeviceSynchronize(), "demo");
  return run;
}

}  // namespace metrale::cli
