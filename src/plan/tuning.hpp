// Internal tuning knobs of the planner: choices the benchmarks and tests
// force to measure or cover one kernel variant (the public AttnPlanOptions
// force only the split count and the merge). `automatic` / 0 / -1 leave a
// choice to the planner; a forced choice the problem or target cannot run
// throws Unsupported.
#pragma once

#include <cstdint>
#include <string>

#include "metrale/plan.hpp"

namespace metrale::detail {

enum class Toggle : uint8_t { automatic, off, on };

struct TuningOptions {
  Toggle pairing = Toggle::automatic;   // a CTA serves two adjacent kv heads of head_dim 64 as one of 128
  LoadPath load_path = LoadPath::automatic;
  int32_t col_tiles = 0;  // runs kernel: 0 = the planner's; 1 or 2 n-tiles of 8 columns per CTA
  // runs kernel: 0 = the planner's; 1; 2 = head_dim split over the two warps
  // of a team (NVFP4 at head_dim 256, with 2 column tiles)
  int32_t head_dim_parts = 0;
  Toggle prefill = Toggle::automatic;   // on: query runs in the prefill kernel
  // The prefill kernel's launch order (prefill on only): -1 = the planner's;
  // 0 = the 3-D grid; n > 0 = bands of n row tiles on a 1-D grid.
  int32_t tile_band = -1;
  // The prefill kernel's CTA pairs (prefill on only): -1 = the planner's; 0 =
  // off; 1 = clusters of two adjacent row tiles sharing their K / V loads.
  int32_t tile_pairs = -1;
  // The prefill kernel over FP8 / NVFP4 (prefill on only, or the planner's
  // prefill): on = stage the pages as bf16 first (plan/prefill_staging.hpp),
  // off = dequantise in the kernel's producer.
  Toggle stage_kv = Toggle::automatic;
};

// plan_attention with the tuning knobs.
AttnPlan plan_attention(const AttnProblem& problem, const AttnTarget& target, const AttnPlanOptions& options,
                        const TuningOptions& tuning);

const char* to_string(LoadPath p);
const char* to_string(Toggle t);
// The inverses (benchmark flags); InvalidArgument naming `arg` and listing the names.
LoadPath load_path_from_string(const std::string& name, const char* arg = "load_path");
Toggle toggle_from_string(const std::string& name, const char* arg);

}  // namespace metrale::detail
