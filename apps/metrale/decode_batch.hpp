// One decode of a HostBatch through a cache of a given format and scales,
// on either backend: quantize the batch's bf16 rows (reshape_and_cache),
// plan (plan_decode) and decode (run_decode). `metrale accuracy` compares the
// output with float64 attention; `metrale check` compares the backends.
#pragma once

#include "host_batch.hpp"
#include "metrale/cache.hpp"

namespace metrale::cli {

struct BatchDecode {
  AlignedVector<bf16> out;         // [num_seqs, num_q_heads, head_dim]
  AlignedVector<uint8_t> k_cache;  // the written caches, on the host
  AlignedVector<uint8_t> v_cache;
  int32_t num_splits = 1;  // the planner's choice
  double median_us = 0.0;  // CPU, timed_reps > 0: median time of one run_decode
};

// CPU reference backend. `num_splits` > 0 forces the split count;
// `timed_reps` > 0 repeats the decode that often and reports the median time.
BatchDecode decode_batch_cpu(const HostBatch& b, KvFormat format, const KvScales& scales, int32_t num_splits = 0,
                             int timed_reps = 0);

// CUDA backend (the batch is copied to the device and the results back);
// the output is poisoned with NaN first, so an unwritten element shows.
BatchDecode decode_batch_gpu(const HostBatch& b, KvFormat format, const KvScales& scales, int32_t num_splits = 0);

}  // namespace metrale::cli
