// The demo on each backend: quantize the batch's bf16 rows into a cache of
// every format, decode, compare with the float64 reference, and time decode.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "decode_batch.hpp"
#include "host_batch.hpp"
#include "metrale/cache.hpp"
#include "reference_f64.hpp"

namespace metrale::cli {

struct FormatResult {
  KvFormat format = KvFormat::bf16;
  double kv_bytes_per_token = 0.0;  // KvCacheLayout::kv_bytes_per_token(): K + V, codes + scales, one layer
  ErrorStats error;                 // accuracy batch against float64 attention over the original bf16 rows
  ErrorStats kernel_error;          // ... and against float64 attention over the dequantized cache
  int32_t accuracy_splits = 1;      // num_splits the planner chose for the accuracy batch
  int32_t timed_splits = 1;         // ... and for the timed batch
  double time_us = 0.0;             // median time of one decode of the timed batch
  double attended_bytes = 0.0;      // K, V and scale bytes the timed decode reads
  double gbps = 0.0;                // GPU only: attended_bytes / time
  double ceiling_fraction = 0.0;    // GPU only: gbps / measured read ceiling
};

// Fills r.error (against `ref`, float64 over the original rows) and
// r.kernel_error (against float64 over the cache `d` wrote) for one decode.
void score(FormatResult& r, const HostBatch& b, const std::vector<double>& ref, const BatchDecode& d,
           const KvScales& scales);

// CPU reference backend: the accuracy batch is also the timed batch (median of
// `reps` decodes after one warm-up).
std::vector<FormatResult> run_cpu(const HostBatch& batch, const std::vector<double>& ref, int reps);

// "" when the CUDA backend can run here, else the reason it cannot.
std::string gpu_unavailable_reason();

struct GpuTimedBatch {
  int32_t num_seqs = 64;
  int32_t seq_len = 4096;
  bool mixed_lengths = false;
  uint64_t seed = 1;
};

struct GpuRun {
  std::vector<FormatResult> rows;
  std::string device;
  int32_t num_sms = 0;
  double ceiling_gbps = 0.0;
};

// CUDA backend: accuracy on device copies of the batch's rows, timing on a
// bench::DecodeWorkload of `timed` (CUDA-graph replay, rotated KV replicas).
GpuRun run_gpu(const HostBatch& batch, const std::vector<double>& ref, const GpuTimedBatch& timed);

}  // namespace metrale::cli
