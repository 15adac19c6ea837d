// TMA descriptors of a paged KV cache for the decode kernel.
#pragma once

#include <cuda.h>

#include "metrale/cache.hpp"

namespace metrale::kernels {

// Describes one of the cache's sections (K or V rows, base `base`) as the
// 4-d byte tensor [num_blocks][block_size][num_kv_heads][row bytes] with the
// layout's page stride, and a box of 16 tokens x one head x min(row bytes,
// 128) bytes (longer rows are several boxes), swizzled as wide as the box
// (128B, 64B or 32B; the decode kernel's DecodeConfig reads it back with the
// same XOR). Returns false, leaving `map` unspecified, where the driver
// cannot encode it.
bool make_kv_tensor_map(CUtensorMap& map, const void* base, const KvCacheLayout& layout);

// Whether the driver's tensor-map encoder is there (the TMA load path can be
// planned).
bool tma_encoder_available();

}  // namespace metrale::kernels
