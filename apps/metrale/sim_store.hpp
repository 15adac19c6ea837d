// The KV caches of a serve-sim run and the two library calls it makes on
// them each step (reshape_and_cache, plan_decode + run_decode), on one
// backend. Inputs are host arrays; the CUDA store copies them to the device
// first (as an engine's inputs would already be there, copies are not
// timed). seconds() is the time spent in the library calls.
#pragma once

#include <cstdint>
#include <memory>

#include "host_batch.hpp"
#include "metrale/cache.hpp"

namespace metrale::cli {

struct SimStoreSpec {
  LayerShape shape;
  int32_t num_layers = 1;  // each layer has its own K and V cache; all share the block tables
  KvCacheLayout layout;
  KvScales scales;

  int64_t kv_row() const { return int64_t(shape.num_kv_heads) * shape.head_dim; }
  int64_t q_row() const { return int64_t(shape.num_q_heads) * shape.head_dim; }
};

class SimStore {
 public:
  virtual ~SimStore() = default;
  // Writes `num_tokens` rows (kv_row() elements each) of K and V into `slots` of every layer.
  virtual void write(const bf16* key, const bf16* value, const int64_t* slots, int64_t num_tokens) = 0;
  // Decodes one query (q_row() elements) per sequence in every layer, sequence i
  // attending to lens[i] tokens through row i of `tables` ([num_seqs, max_blocks]);
  // returns the number of NaN/Inf output elements.
  virtual int64_t decode(const bf16* q, const int32_t* tables, int32_t max_blocks, const int32_t* lens,
                         int32_t num_seqs) = 0;
  double seconds() const { return seconds_; }

 protected:
  double seconds_ = 0.0;
};

std::unique_ptr<SimStore> make_cpu_store(const SimStoreSpec& spec);
std::unique_ptr<SimStore> make_cuda_store(const SimStoreSpec& spec);

}  // namespace metrale::cli
