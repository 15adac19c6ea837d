// The two backends of the `metrale` command behind one interface. Every job
// (the default table, accuracy, serve-sim) is written once against Backend:
// it allocates the backend's memory, copies host arrays in and out, and
// makes the library's calls through it. The CPU backend (cpu_backend.cpp) is
// host memory and metrale::cpu::; the CUDA backend (cuda_backend.cpp) device
// memory and metrale::cuda::. Only timing differs by nature: the CPU backend
// times repeated decodes of the batch, the CUDA backend CUDA-graph replays of
// a larger bench::DecodeWorkload against a read ceiling of the same run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "host_batch.hpp"
#include "metrale/cache.hpp"
#include "metrale/ops.hpp"
#include "metrale/plan.hpp"

namespace metrale::cli {

// Memory of one backend (host or device), freed with its last copy.
using Buffer = std::shared_ptr<void>;

// What the default job times on a backend.
struct TimedBatch {
  int32_t num_seqs = 64;  // CUDA: the timed batch, every sequence seq_len tokens
  int32_t seq_len = 4096;
  int reps = 5;           // CPU: the batch itself, median of `reps` decodes after a warm-up
  uint64_t seed = 1;
};

struct DecodeTiming {
  int32_t num_splits = 1;       // the planner's choice for the timed batch
  double time_us = 0.0;         // median time of one decode
  double attended_bytes = 0.0;  // K, V and scale bytes that decode reads
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;     // "cpu" or "cuda"
  virtual std::string device() const = 0;   // e.g. "NVIDIA H200", "CPU reference backend, 2 threads"
  virtual AttnTarget attention_target() const = 0;  // what plan_attention plans for

  virtual Buffer alloc(size_t bytes) = 0;
  virtual void fill(void* dst, uint8_t byte, size_t bytes) = 0;
  virtual void upload(void* dst, const void* host, size_t bytes) = 0;
  virtual void download(void* host, const void* src, size_t bytes) = 0;

  // The library calls, on this backend's memory (CUDA: enqueued, so
  // synchronize() before reading a result or a clock).
  virtual void reshape_and_cache(const CacheWriteArgs& args) = 0;
  virtual void run_attention(const AttnPlan& plan, const AttnArgs& args, const SplitKWorkspace& ws) = 0;
  virtual void synchronize() = 0;

  // The default job's decode timing of `format` (see the header comment).
  virtual DecodeTiming time_decode(const HostBatch& batch, KvFormat format, const KvScales& scales,
                                   const TimedBatch& timed) = 0;
  // Measured read bandwidth (GB/s) that timings are read against; 0 = none (CPU).
  virtual double read_ceiling_gbps() { return 0.0; }

  // A copy of `count` host elements in this backend's memory.
  template <class T>
  Buffer copy_of(const T* host, size_t count) {
    Buffer b = alloc(count * sizeof(T));
    upload(b.get(), host, count * sizeof(T));
    return b;
  }
};

std::unique_ptr<Backend> make_cpu_backend();
std::unique_ptr<Backend> make_cuda_backend();

// "" when the CUDA backend can run here, else the reason it cannot.
std::string gpu_unavailable_reason();

// The CUDA backend when it can run here and `force_cpu` is false, else the
// CPU backend; *reason says why the CPU backend runs ("" on the GPU).
std::unique_ptr<Backend> make_backend(bool force_cpu, std::string* reason);

struct BatchDecode {
  AlignedVector<bf16> out;         // [num_seqs, num_q_heads, head_dim]
  AlignedVector<uint8_t> k_cache;  // the written caches, copied to the host
  AlignedVector<uint8_t> v_cache;
  int32_t num_splits = 1;          // the planner's choice
  double median_us = 0.0;          // timed_reps > 0: median time of one run_attention (synchronised)
};

// One decode of `b` on `be` through a cache of `format` and `scales`: copy
// the batch in, quantize its rows (reshape_and_cache into zeroed caches),
// plan (plan_attention) and decode (run_attention) into a NaN-poisoned output, so
// an unwritten element shows; copy the results out. `timed_reps` > 0
// repeats the decode that often after the first and reports the median.
// `nvfp4_scales`: the NVFP4 cache's group-scale rule (layout.nvfp4_scales).
BatchDecode decode_batch(Backend& be, const HostBatch& b, KvFormat format, const KvScales& scales,
                         int timed_reps = 0, Nvfp4ScaleRule nvfp4_scales = Nvfp4ScaleRule::max6);

}  // namespace metrale::cli
