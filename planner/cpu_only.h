// Plans in which some subgroups may not go to the GPU: those whose state is held in pageable
// host memory (runtime/optimizer_state.h). A GPU copy from pageable memory is synchronous and
// slow, while the CPU update reads it at full speed, so such a subgroup is updated on the CPU
// under every policy; the plan still charges its CPU time, so the rest is placed around it.
// `gpu_allowed` is by subgroup (non-zero: may go to the GPU); empty: all may.
#pragma once

#include <vector>

#include "planner/plan.h"
#include "planner/planner.h"
#include "planner/rates.h"

namespace tide::planner {

bool all_gpu_allowed(const std::vector<char>& gpu_allowed);

// The automatic plan: the planner's best over the allowed subgroups, or all of them on the GPU
// (the CPU subgroups' time is fixed, so more GPU may pay where the sub-plan could not see it),
// or all-CPU, whichever the model predicts fastest for the whole workload.
Plan plan_allowed(const Workload& workload, const Rates& rates,
                  const std::vector<char>& gpu_allowed, const PlannerOptions& options = {});

// `chosen` (a fixed policy's plan) with the subgroups that may not go to the GPU moved to the
// CPU, planned again for that GPU order (all-CPU when it fits no buffer).
Plan without_disallowed(const Plan& chosen, const Workload& workload, const Rates& rates,
                        const std::vector<char>& gpu_allowed, const PlannerOptions& options = {});

}  // namespace tide::planner
