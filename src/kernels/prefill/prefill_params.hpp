// Device parameters of the prefill kernel (prefill_kernel.cuh).
#pragma once

#include "kernels/decode/decode_params.hpp"

namespace metrale::kernels {

using PrefillParams = RunParams;

}  // namespace metrale::kernels
