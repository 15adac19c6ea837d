// Timing on the GPU: median of CUDA-graph replays, and the read-bandwidth
// ceiling every benchmark reports its fraction of (docs/spec.md 7).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>

namespace metrale::bench {

// Captures `launches_per_graph` calls of enqueue(i) (i = 0, 1, ...: the call
// picks its own rotating inputs) into one CUDA graph, replays it `warmup`
// times, then `reps` times timed with events, and returns the median time of
// one call in microseconds. Graph replay removes host launch gaps, as a
// serving engine's captured decode step does.
double median_us_per_call(const std::function<void(int call, cudaStream_t)>& enqueue, int launches_per_graph,
                          int warmup = 3, int reps = 15);

// Read-only streaming kernel (16-byte loads, XOR-folded) over `bytes` of
// device memory, graph-replayed over disjoint windows of a larger arena so
// nothing is served from L2. Returns GB/s (1e9 bytes per second).
double measure_read_ceiling_gbps(size_t bytes = size_t(1) << 30);

// Time of one empty kernel (one CTA) per call, replayed as above: the floor
// that a small decode's time is read against.
double empty_launch_us();

}  // namespace metrale::bench
