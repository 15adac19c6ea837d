// `metrale accuracy`: what each quantized KV format costs in attention-output
// error against the BF16 cache, on model-like K/V (realistic_kv.hpp), with
// the calibration choices an engine actually faces: FP8 per-tensor scales
// and the NVFP4 per-tensor second scale g taken from the batch itself
// (optimistic) or from a separate calibration batch (what an engine does:
// values past the calibrated absmax saturate), and NVFP4 without g (the
// E4M3 group scales alone must cover the range), each NVFP4 choice under
// both group-scale rules (max6, adaptive; one g calibration for both, and
// adaptive with a 1.5x larger g beside it, docs/nvfp4_scales.md). Beside the
// attention-output error, the quantization error of the K and V caches
// themselves.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "host_batch.hpp"
#include "metrale/cache.hpp"
#include "realistic_kv.hpp"
#include "testing/reference.hpp"

namespace metrale::cli {

struct AccuracyOptions {
  LayerShape shape;
  int32_t seqs = 8;
  int32_t max_len = 2048;
  uint64_t seed = 1;  // token content of the batch; the calibration batch uses seed + 1
  RealisticKv model;
};

struct AccuracyRow {
  KvFormat format = KvFormat::bf16;
  Nvfp4ScaleRule nvfp4_scales = Nvfp4ScaleRule::max6;  // nvfp4 only
  std::string calibration;  // "-", "same batch", "separate batch", "none (g = 1)", "separate batch, g = amax/1792"
  KvScales scales;
  int64_t clipped = 0;  // K and V values of the batch the cache write saturates (codec::*_saturates)
  double k_rel_rms = 0, v_rel_rms = 0;  // ||dequantised cache - bf16 rows||2 / ||bf16 rows||2 of K, of V
  double kv_bytes_per_token = 0;
  test::Comparison error;  // vs float64 attention over the original bf16 rows
  int32_t num_splits = 1;
};

struct AccuracyReport {
  std::vector<int32_t> seq_lens;
  float k_absmax = 0, v_absmax = 0;              // of the batch
  float calib_k_absmax = 0, calib_v_absmax = 0;  // of the calibration batch
  std::vector<AccuracyRow> rows;
};

class Backend;

// Runs every variant's cache write and decode on `be`.
AccuracyReport run_accuracy(const AccuracyOptions& opt, Backend& be);

}  // namespace metrale::cli
