// Umbrella header of metrale: paged KV-cache decode attention for Hopper.
#pragma once

#include "metrale/cache.hpp"
#include "metrale/codec.hpp"
#include "metrale/cpu.hpp"
#include "metrale/cuda.hpp"
#include "metrale/error.hpp"
#include "metrale/format.hpp"
#include "metrale/ops.hpp"
#include "metrale/plan.hpp"
