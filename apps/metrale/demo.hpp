// The default job of the `metrale` command: one Qwen3-8B-shaped attention
// layer decoding a batch of mixed-length sequences in every KV format, on the
// GPU when one is usable, else on the CPU reference backend.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "host_batch.hpp"
#include "metrale/cache.hpp"
#include "testing/reference.hpp"

namespace metrale::cli {

struct DemoOptions {
  bool force_cpu = false;
  int32_t seqs = 8;          // accuracy batch (and the timed batch on the CPU)
  int32_t max_len = 2048;
  int32_t gpu_seqs = 64;     // timed batch on the GPU
  int32_t gpu_len = 4096;
  int32_t cpu_threads = 0;   // 0 = the CPU backend's default
  int reps = 5;              // CPU timing repetitions
  uint64_t seed = 1;
};

struct FormatResult {
  KvFormat format = KvFormat::bf16;
  double kv_bytes_per_token = 0.0;  // KvCacheLayout::kv_bytes_per_token(): K + V, codes + scales, one layer
  test::Comparison error;           // accuracy batch against float64 attention over the original bf16 rows
  test::Comparison kernel_error;    // ... and against float64 attention over the dequantized cache
  int32_t accuracy_splits = 1;      // num_splits the planner chose for the accuracy batch
  int32_t timed_splits = 1;         // ... and for the timed batch
  double time_us = 0.0;             // median time of one decode of the timed batch
  double attended_bytes = 0.0;      // K, V and scale bytes the timed decode reads
  double gbps = 0.0;                // GPU only: attended_bytes / time
  double ceiling_fraction = 0.0;    // GPU only: gbps / measured read ceiling
};

struct DemoReport {
  LayerShape shape;
  std::string backend;       // "cuda" or "cpu"
  std::string device;        // GPU name, or "CPU, N threads"
  std::string cpu_reason;    // why the CPU backend ran ("" on the GPU)
  double ceiling_gbps = 0;   // GPU only
  std::vector<int32_t> accuracy_lens;
  std::string timed_batch;   // description of the timed batch
  std::vector<FormatResult> rows;
  double seconds = 0;        // wall time of the whole run
};

DemoReport run_demo(const DemoOptions& opt);

}  // namespace metrale::cli
