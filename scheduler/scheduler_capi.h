// The scheduler's C ABI types (include/tide/tide.h) as the scheduler's own: for scheduler_capi.cpp
// and the other C ABI functions that take them (the executor's).
#pragma once

#include "scheduler/rates.h"
#include "tide/tide.h"

namespace tide::scheduler {

Rates rates_from_c(const tide_rates& rates);
tide_rates rates_to_c(const Rates& rates);

}  // namespace tide::scheduler
