// A plan as people read it (a table) and as programs read it (JSON).
#pragma once

#include <string>

#include "planner/plan.h"

namespace tide::planner {

// One row per subgroup (index, params, device, order, buffer, predicted start and end), then
// the GPU share, memory and predicted times against all-CPU.
std::string plan_table(const Plan& plan);

// A JSON object: the plan's totals, "predicted" {phase_s, cpu_side_s, gpu_side_s, link_s, host_s,
// all_cpu_s, speedup}, "gpu_order", "cpu_order" and "subgroups" (one object per subgroup, by
// index).
std::string plan_json(const Plan& plan);

}  // namespace tide::planner
