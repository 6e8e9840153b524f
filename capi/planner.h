// The planner's C ABI types (include/tide/tide.h, "planner") as the planner's own: for
// capi/planner.cpp and the other C ABI functions that take them (capi/optimizer.cpp).
#pragma once

#include "planner/plan.h"
#include "planner/rates.h"
#include "tide/tide.h"

namespace tide::capi {

planner::Rates rates_from_c(const tide_rates& rates);
tide_rates rates_to_c(const planner::Rates& rates);
// The rates' host memory pair, struct_size set to this library's.
tide_host_memory_rates host_memory_rates_to_c(const planner::Rates& rates);
// The plan's prediction and buffers, struct_size set to this library's.
tide_plan_summary summary_to_c(const planner::Plan& plan);

}  // namespace tide::capi
