// Per-format cache setup shared by the backends: the paged layout of a format
// for a layer shape, and the per-tensor scales calibrated from an absmax.
#pragma once

#include <cstdint>

#include "host_batch.hpp"
#include "metrale/cache.hpp"

namespace metrale::cli {

constexpr KvFormat kAllFormats[] = {KvFormat::bf16, KvFormat::fp8_e4m3, KvFormat::nvfp4};

// Dense layout of `format` with `num_blocks` pages.
KvCacheLayout make_layout(KvFormat format, const LayerShape& shape, int64_t num_blocks);

// fp8: k/v_scale = absmax / 448; nvfp4: k/v_global_scale = absmax / (448 * 6);
// bf16: the defaults (unused).
KvScales scales_from_absmax(KvFormat format, float k_absmax, float v_absmax);

// The scales calibrated on the batch's own K and V rows (absmax is exact, so
// computing it on the host gives what either backend's absmax gives).
KvScales calibrated_scales(const HostBatch& batch, KvFormat format);

}  // namespace metrale::cli
