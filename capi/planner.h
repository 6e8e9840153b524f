// The planner's C ABI types (include/tide/tide.h, "planner") as the planner's own: for
// capi/planner.cpp and the other C ABI functions that take them (capi/optimizer.cpp).
#pragma once

#include "planner/rates.h"
#include "tide/tide.h"

namespace tide::capi {

planner::Rates rates_from_c(const tide_rates& rates);
tide_rates rates_to_c(const planner::Rates& rates);

}  // namespace tide::capi
