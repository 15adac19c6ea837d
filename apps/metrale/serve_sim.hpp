// `metrale serve-sim`: continuous batching in a fixed KV memory budget.
//
// What an FP8 or NVFP4 cache buys a server is concurrency: in the same bytes
// it holds 2x / 3.56x the tokens of BF16, so more sequences run per decode
// step. The simulation makes that visible end to end with the real library
// calls: metrale::BlockAllocator hands out the pages of a budget-sized cache as
// sequences grow; every step appends one token per running sequence with
// reshape_and_cache (slots from the allocator) and decodes the batch with
// plan_attention + run_attention; finished sequences free their pages; a request
// waits while the budget is full (admission control), and when a running
// sequence cannot grow the youngest one is preempted and recomputed later
// (vLLM's policy). The same seeded request stream runs for every format.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "host_batch.hpp"
#include "metrale/cache.hpp"

namespace metrale::cli {

struct ServeSimConfig {
  LayerShape shape;         // 32 q / 8 kv heads, d128, page 16
  int32_t num_layers = 1;   // layers sharing the block tables, each with its own cache
  double budget_mib = 4.0;  // K + V of all layers
  int32_t num_requests = 64;
  double arrival_rate = 2.0;                  // mean requests arriving per step (Poisson)
  int32_t prompt_min = 16, prompt_max = 192;  // uniform prompt lengths
  int32_t output_min = 16, output_max = 96;   // uniform output lengths (tokens to generate)
  int32_t max_seqs = 256;                     // cap on running sequences (an engine's max_num_seqs)
  int32_t max_steps = 20000;                  // safety stop
  uint64_t seed = 1;
};

struct ServeSimResult {
  KvFormat format = KvFormat::bf16;
  int64_t num_blocks = 0;      // pages the budget holds
  int64_t block_bytes = 0;     // one page of K and V, all layers
  int32_t steps = 0;           // decode steps until every request finished
  int64_t decode_tokens = 0;   // tokens generated (one per running sequence per step)
  int64_t prefill_tokens = 0;  // prompt tokens written (recomputes included)
  int32_t finished = 0;        // requests completed
  int32_t rejected = 0;        // requests larger than the whole budget
  int32_t preemptions = 0;
  int32_t peak_seqs = 0;        // concurrent running sequences
  double mean_seqs = 0.0;       // ... averaged over steps
  double saturated_seqs = 0.0;  // ... averaged over the steps where a request was left waiting:
                                //     what the budget sustains (ramp-up and drain excluded)
  int32_t saturated_steps = 0;
  int64_t peak_used_blocks = 0;
  double mean_used_blocks = 0.0;
  double mean_wait_steps = 0.0;   // steps from arrival to first admission
  double library_seconds = 0.0;   // time inside reshape_and_cache + run_attention
  int64_t nonfinite = 0;          // NaN/Inf decode output elements (must be 0)
  int32_t final_used_blocks = 0;  // pages still allocated after the run (must be 0)

  double tokens_per_second() const { return library_seconds > 0 ? decode_tokens / library_seconds : 0.0; }
  double mib(double blocks) const { return blocks * double(block_bytes) / double(1 << 20); }
};

class Backend;

// Runs the simulation for one format on `be`. `progress`: draw a progress
// bar on stderr (when it is a terminal).
ServeSimResult run_serve_sim(const ServeSimConfig& cfg, KvFormat format, Backend& be, bool progress = false);

}  // namespace metrale::cli
