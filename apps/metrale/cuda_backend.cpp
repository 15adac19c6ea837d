// The CUDA backend behind the Backend interface (see backend.hpp): device
// memory (testing/device_buffer.hpp), metrale::cuda:: calls on the default
// stream, timing by CUDA-graph replay of a bench::DecodeWorkload large enough
// that rotating its replicas defeats the L2.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <string>

#include "backend.hpp"
#include "bench/lib/decode_workload.hpp"
#include "bench/lib/gpu_timing.hpp"
#include "metrale/cuda.hpp"
#include "testing/cuda_check.hpp"
#include "testing/device_buffer.hpp"

namespace metrale::cli {
namespace {

using test::cuda_check;
using test::DeviceBuffer;

class CudaBackend final : public Backend {
 public:
  CudaBackend() : dev_(cuda::device_info()) {}

  const char* name() const override { return "cuda"; }
  std::string device() const override { return dev_.name; }
  AttnTarget attention_target() const override { return cuda::attention_target(); }

  Buffer alloc(size_t bytes) override {
    auto b = std::make_shared<DeviceBuffer<uint8_t>>(bytes, 0);
    return Buffer(b, b->get());  // owns the DeviceBuffer, points at its payload
  }
  void fill(void* dst, uint8_t byte, size_t bytes) override {
    cuda_check(cudaMemset(dst, byte, bytes), "cudaMemset");
  }
  void upload(void* dst, const void* host, size_t bytes) override {
    cuda_check(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy(host to device)");
  }
  void download(void* host, const void* src, size_t bytes) override {
    cuda_check(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy(device to host)");
  }

  void reshape_and_cache(const CacheWriteArgs& args) override { cuda::reshape_and_cache(args); }
  void run_attention(const AttnPlan& plan, const AttnArgs& args, const SplitKWorkspace& ws) override {
    cuda::run_attention(plan, args, ws);
  }
  void synchronize() override { cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

  // A timed batch of its own (timed.num_seqs x timed.seq_len), replayed in a graph.
  DecodeTiming time_decode(const HostBatch& batch, KvFormat format, const KvScales&, const TimedBatch& t) override {
    bench::DecodeShape s;
    s.format = format;
    s.num_seqs = t.num_seqs;
    s.seq_len = t.seq_len;
    s.num_q_heads = batch.shape.num_q_heads;
    s.num_kv_heads = batch.shape.num_kv_heads;
    s.head_dim = batch.shape.head_dim;
    s.block_size = batch.shape.block_size;
    const bench::DecodeWorkload wl(s, size_t(12) * size_t(std::max<int64_t>(dev_.l2_bytes, 1 << 20)), t.seed);
    DeviceBuffer<bf16> out(size_t(s.num_seqs) * s.num_q_heads * s.head_dim);
    const AttnPlan plan = plan_attention(attention_problem(wl.args(0, out.get()), wl.max_seq_len()), cuda::attention_target());
    DeviceBuffer<float> ws(plan.workspace_bytes / sizeof(float));
    const SplitKWorkspace workspace{ws.get(), plan.workspace_bytes, plan.num_splits};
    DecodeTiming r;
    r.num_splits = plan.num_splits;
    r.time_us = bench::median_us_per_call(
        [&](int call, cudaStream_t stream) {
          cuda::run_attention(plan, wl.args(call % wl.replicas(), out.get()), workspace, stream);
        },
        std::max(8, wl.replicas()));
    r.attended_bytes = wl.attended_bytes();
    synchronize();
    return r;
  }
  double read_ceiling_gbps() override {
    if (ceiling_gbps_ == 0.0) ceiling_gbps_ = bench::measure_read_ceiling_gbps();
    return ceiling_gbps_;
  }

 private:
  cuda::DeviceInfo dev_;
  double ceiling_gbps_ = 0.0;
};

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

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

}  // namespace metrale::cli
