// The 16-token steps of one decode CTA's split as its warps take them, and
// the page ids that locate them: what both load pipelines (register and
// TMA) share.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/decode/decode_params.hpp"
#include "metrale/ops.hpp"

namespace metrale::kernels {

// Teams (warps, or pairs of warps that split head_dim: DecodeConfig's HP)
// take groups of U = Cfg::kUnroll consecutive steps round-robin: team w's
// group k holds steps first_step(k) .. first_step(k) + U - 1.
//
// Page ids of the warp's steps come from a window held in its lanes (lane
// j: step j % U of group win_base + j / U), 32 steps per block-table read,
// the next window read while this one is used. So the K/V loads of a step
// never wait on the read that locates them (a dependent read per step had
// put a second memory latency on every step group's critical path), and a
// CTA's first stages are issued after one read
// instead of one per stage.
template <class Cfg>
struct SplitSteps {
  static constexpr int U = Cfg::kUnroll;
  static constexpr int kStride = Cfg::kTeams * U;
  static_assert(32 % U == 0, "a window holds whole groups");
  static constexpr int kWinGroups = 32 / U;

  int warp, lane;  // warp: the team's index
  int total_steps;
  int spp_shift, spp_mask;  // block_size is a power of two: step -> (page, token) by shift and mask
  const int32_t* table;     // the sequence's block-table row
  int32_t first_page;       // the split's first page of that row
  int32_t win, win_next;    // this lane's page id in the current and the next window
  int win_base;             // first group of the current window

  __device__ __forceinline__ SplitSteps(const DecodeParams& p, int64_t seq, PageRange pages, int warp_, int lane_)
      : warp(warp_), lane(lane_) {
    const int steps_per_page = p.block_size / Cfg::kStepTokens;
    total_steps = (pages.end - pages.first) * steps_per_page;
    spp_shift = 31 - __clz(steps_per_page);
    spp_mask = steps_per_page - 1;
    table = p.block_tables + seq * p.max_blocks_per_seq;
    first_page = pages.first;
    win = window(0);
    win_next = window(kWinGroups);
    win_base = 0;
  }

  __device__ __forceinline__ int first_step(int k) const { return warp * U + kStride * k; }
  // Teams of two warps (HP 2) exchange through a CTA barrier per step, so
  // every team takes as many groups as the first (the last ones may hold no
  // step of the split: nothing loaded, everything masked).
  __device__ __forceinline__ bool has_group(int k) const {
    return (Cfg::kParts > 1 ? 0 : warp * U) + kStride * k < total_steps;
  }
  // Token offset of step `st` inside its page.
  __device__ __forceinline__ int32_t token0(int st) const { return (st & spp_mask) * Cfg::kStepTokens; }

  // Lane j's page id in the window of groups k0 .. (0 past the split).
  __device__ __forceinline__ int32_t window(int k0) const {
    const int st = warp * U + kStride * (k0 + lane / U) + lane % U;
    return st < total_steps ? __ldg(table + first_page + (st >> spp_shift)) : 0;
  }
  // Page ids of the steps of the warp's group k (k grows by one per call).
  __device__ __forceinline__ void group_pages(int k, int32_t (&page)[U]) {
    if (k - win_base == kWinGroups) {
      win = win_next;
      win_base = k;
      win_next = window(k + kWinGroups);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) page[u] = __shfl_sync(0xffffffffu, win, (k - win_base) * U + u);
  }
};

}  // namespace metrale::kernels
