// Graph-replay timing and the read-bandwidth ceiling kernel.
#include "bench/lib/bench_util.hpp"
#include "bench/lib/gpu_timing.hpp"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace metrale::bench {
namespace {

// Streams `n16` 16-byte vectors with several loads in flight per thread and
// XOR-folds them; the sink write (practically never taken) keeps the loads.
__global__ void read_kernel(const uint4* __restrict__ src, size_t n16, uint32_t* sink) {
  constexpr int kInFlight = 4;
  uint32_t acc = 0;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kInFlight - 1) * stride < n16; i += kInFlight * stride) {
    uint4 v[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) v[k] = __ldcs(src + i + k * stride);
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = __ldcs(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

__global__ void empty_kernel() {}

}  // namespace

double empty_launch_us() {
  return median_us_per_call([](int, cudaStream_t s) { empty_kernel<<<1, 32, 0, s>>>(); }, 20);
}

double median_us_per_call(const std::function<void(int, cudaStream_t)>& enqueue, int launches_per_graph, int warmup,
                          int reps) {
  cudaStream_t s;
  test::cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  test::cuda_check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  for (int i = 0; i < launches_per_graph; ++i) enqueue(i, s);
  test::cuda_check(cudaStreamEndCapture(s, &graph), "cudaStreamEndCapture");
  test::cuda_check(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  cudaEvent_t a, b;
  test::cuda_check(cudaEventCreate(&a), "cudaEventCreate");
  test::cuda_check(cudaEventCreate(&b), "cudaEventCreate");
  for (int i = 0; i < warmup; ++i) test::cuda_check(cudaGraphLaunch(exec, s), "cudaGraphLaunch");
  std::vector<float> ms(reps);
  for (int r = 0; r < reps; ++r) {
    test::cuda_check(cudaEventRecord(a, s), "cudaEventRecord");
    test::cuda_check(cudaGraphLaunch(exec, s), "cudaGraphLaunch");
    test::cuda_check(cudaEventRecord(b, s), "cudaEventRecord");
    test::cuda_check(cudaEventSynchronize(b), "cudaEventSynchronize");
    test::cuda_check(cudaEventElapsedTime(&ms[r], a, b), "cudaEventElapsedTime");
  }
  test::cuda_check(cudaGetLastError(), "timed launches");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
  return 1000.0 * ms[reps / 2] / launches_per_graph;
}

double measure_read_ceiling_gbps(size_t bytes) {
  bytes &= ~size_t(15);
  constexpr int kWindows = 4;  // disjoint windows: 4 x 1 GiB arena defeats the 60 MB L2
  uint8_t* arena = nullptr;
  uint32_t* sink = nullptr;
  test::cuda_check(cudaMalloc(&arena, bytes * kWindows), "cudaMalloc(read arena)");
  test::cuda_check(cudaMalloc(&sink, sizeof(uint32_t)), "cudaMalloc(sink)");
  test::cuda_check(cudaMemset(arena, 0x5a, bytes * kWindows), "cudaMemset(read arena)");
  int sms = 0, dev = 0;
  test::cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  test::cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
  const size_t n16 = bytes / 16;
  const double us = median_us_per_call(
      [&](int call, cudaStream_t s) {
        read_kernel<<<sms * 8, 256, 0, s>>>(reinterpret_cast<const uint4*>(arena + (call % kWindows) * bytes), n16,
                                            sink);
      },
      2 * kWindows);
  cudaFree(arena);
  cudaFree(sink);
  return double(bytes) / (us * 1e3);
}

}  // namespace metrale::bench
