// K/V with the structure of a real model's attention inputs, for
// `metrale accuracy`. Random i.i.d. rows flatter a quantizer: real K and V
// differ from them in ways that decide the error of an FP8 or NVFP4 cache:
//   * a few large-magnitude channels per kv head in K (a persistent offset
//     of 8-20x the typical value, as in Llama/Qwen keys), which set the
//     per-tensor absmax and hence how coarse every other value is coded;
//   * RoPE: each pair of K (and q) channels (i, i + D/2) rotated by the angle
//     position * theta^(-2i/D), which spreads an outlier over its pair and
//     makes the values position-dependent (theta = 1e6, as Qwen3);
//   * per-head scales varying ~7x between heads, so one per-tensor scale
//     fits some heads badly;
//   * V rows of a head share a common component (real V are far from
//     zero-mean noise), so an attention output is not a near-zero average
//     whose relative error would be dominated by noise.
// The "model" (head scales, outlier channels) comes from `model_seed`; the
// token content from `data_seed`. A calibration batch is the same model on
// other tokens: same model_seed, different data_seed.
#pragma once

#include <cstdint>

#include "host_batch.hpp"

namespace metrale::cli {

struct RealisticKv {
  uint64_t model_seed = 7;
  double rope_theta = 1e6;
  int32_t outlier_channels = 4;  // per kv head, in K
};

// Overwrites batch.key, batch.value and batch.q (positions from the batch's
// sequence layout; each query sits at position seq_len, the next token).
void fill_realistic(HostBatch& batch, const RealisticKv& model, uint64_t data_seed);

}  // namespace metrale::cli
