// The executor's C ABI types (include/tide/tide.h, "executor") as the runtime's own: for
// capi/optimizer.cpp and the general part (capi/tide.cpp: tide_knob's TIDE_PLACEMENT).
#pragma once

#include "runtime/executor.h"
#include "tide/tide.h"

namespace tide::capi {

runtime::Policy placement_from_c(const tide_placement_policy& policy);
tide_placement_policy placement_to_c(const runtime::Policy& policy);

}  // namespace tide::capi
