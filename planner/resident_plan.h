// Plans around resident subgroups (runtime/residency.h): their state stays in device memory, so
// they are updated first on the GPU, one after another, in place, copying nothing over the link
// unless their state joins this phase or their gradient was not kept on the GPU. The other
// subgroups are planned by the planner in the memory the resident ones leave.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "planner/plan.h"
#include "planner/planner.h"

namespace tide::planner {

// A resident subgroup's update in a phase.
struct ResidentUpdate {
  std::size_t subgroup = 0;
  bool state_in = false;  // its state joins: copied in from its pinned slot before the kernel
  bool grad_in = false;   // its gradient was not kept on the GPU: copied in before the kernel
};

// What resident subgroups hold in device memory.
struct ResidentLayout {
  std::vector<std::uint64_t> slot_bytes;  // by subgroup: its state slot
  // While one resident subgroup is updated: its gradient and weights area (the executor's lane),
  // for the largest of them.
  std::uint64_t lane_bytes = 0;
  std::vector<char> gpu_allowed;  // by subgroup: may be updated on the GPU (1); empty: all may
};

// The plan of every subgroup of `w`: `transient`, the plan of the subgroups `rest` alone (null:
// none), after `residents`, whose copies in and kernels lengthen the GPU side. Each CPU subgroup
// keeps its times from `transient`, against the GPU side it runs beside (planner/refine.h).
Plan residents_first(const Workload& w, const Rates& rates,
                     const std::vector<std::uint64_t>& slot_bytes, const Plan* transient,
                     const std::vector<std::size_t>& rest,
                     const std::vector<ResidentUpdate>& residents);

struct ResidentPlan {
  Plan plan;  // this phase's: the joining states' copies in included
  // The same phase once every state has joined (a join is paid once): what the choice between
  // residency and none compares (prefer_resident).
  double steady_phase_s = 0;
};

// The phase with `residents` resident: the others planned by plan_allowed in the headroom that
// the resident slots, their kept gradients and a lane leave. Throws std::invalid_argument when
// the layout does not match the workload.
ResidentPlan plan_around_resident(const Workload& w, const Rates& rates,
                                  const ResidentLayout& layout,
                                  std::vector<ResidentUpdate> residents,
                                  const PlannerOptions& options);

// Residency where the model predicts its steady phase no slower than the plan without it; while
// state is resident already (`resident_now`), until the plan without it is faster by more than
// `hysteresis` (a fraction of its phase). Rates refined every step wobble: near a tie, a choice
// without the band would send the states home and copy them back in on alternate steps, paying a
// join each time.
inline bool prefer_resident(const ResidentPlan& with, const Plan& without, bool resident_now,
                            double hysteresis) {
  const double margin = resident_now ? 1.0 + hysteresis : 1.0;
  return with.steady_phase_s <= without.predicted.phase_s * margin;
}

}  // namespace tide::planner
