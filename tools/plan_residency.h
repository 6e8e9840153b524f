// Residency in `tide plan`: the subgroups tide's executor would keep resident (TIDE_RESIDENCY,
// placement auto) given the memory held free through a whole iteration, and the plan around them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "planner/plan.h"
#include "planner/planner.h"

namespace tide::tools {

struct PlanResidency {
  std::uint64_t held_bytes = 0;  // free through the whole iteration (--held-memory)
  std::vector<char> resident;    // by subgroup, as the executor's first choice
  std::uint64_t state_bytes = 0, gradient_bytes = 0;  // their slots, their kept gradients
  // The plan around them once their states have joined, and the phase they join in; none when
  // no subgroup fits.
  std::optional<planner::Plan> steady;
  double first_phase_s = 0;
  double without_phase_s = 0;  // the plan without residency
  bool chosen = false;         // the model prefers `steady` (planner::prefer_resident)

  std::size_t count() const;
  std::string json() const;
  std::string lines() const;
};

PlanResidency plan_residency(const planner::Workload& w, const planner::Rates& rates,
                             std::uint64_t held_bytes, const planner::Plan& without,
                             const planner::PlannerOptions& options);

}  // namespace tide::tools
