#include "tools/plan_residency.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "io/json_writer.h"
#include "planner/residency.h"
#include "planner/resident_plan.h"
#include "planner/units.h"

namespace tide::tools {

namespace json = io::json;
using namespace tide::planner;

PlanResidency plan_residency(const Workload& w, const Rates& rates, std::uint64_t held_bytes,
                             const Plan& without, const PlannerOptions& options) {
  const std::size_t n = w.subgroup_params.size();
  const Footprint& f = w.footprint;
  PlanResidency out;
  out.held_bytes = held_bytes;
  out.without_phase_s = without.predicted.phase_s;
  // As the executor counts them (runtime/executor.cpp): a subgroup's state slot and its
  // gradient, kept on the GPU between phases; a lane for the largest while one is updated.
  auto slot_of = [&](std::uint64_t params) {
    return static_cast<std::uint64_t>(
        std::ceil(static_cast<double>(params) * f.state_copy_bytes_per_param()));
  };
  ResidentLayout layout;
  ResidencyInput in;
  std::uint64_t largest = 0;
  for (std::uint64_t p : w.subgroup_params) {
    layout.slot_bytes.push_back(slot_of(p));
    in.slot_bytes.push_back(slot_of(p) + p * f.gradient_bytes_per_param);
    largest = std::max(largest, p);
  }
  layout.lane_bytes = slot_of(largest) + largest * (std::uint64_t{f.gradient_bytes_per_param} +
                                                    f.weight_bytes_per_param);
  in.held_bytes = std::min(held_bytes, w.headroom_bytes);
  in.working_bytes = layout.lane_bytes;
  in.allowed.assign(n, 1);
  in.resident.assign(n, 0);
  out.resident = choose_resident(in);
  std::vector<ResidentUpdate> steady, joining;
  for (std::size_t s = 0; s < n; ++s) {
    if (out.resident[s] == 0) continue;
    out.state_bytes += layout.slot_bytes[s];
    out.gradient_bytes += w.subgroup_params[s] * f.gradient_bytes_per_param;
    steady.push_back({s, false, false});
    // The first phase: the state comes in, and the gradient too unless the GPU subgroups' are
    // kept there anyway.
    joining.push_back({s, true, !f.gradients_on_gpu});
  }
  if (steady.empty()) return out;
  const ResidentPlan r = plan_around_resident(w, rates, layout, steady, options);
  out.steady = r.plan;
  out.first_phase_s =
      plan_around_resident(w, rates, layout, joining, options).plan.predicted.phase_s;
  out.chosen = prefer_resident(r, without, false, 0.0);  // the first choice: nothing resident yet
  return out;
}

std::size_t PlanResidency::count() const {
  return static_cast<std::size_t>(std::count(resident.begin(), resident.end(), 1));
}

std::string PlanResidency::json() const {
  std::string out = "{\"held_bytes\":" + std::to_string(held_bytes) +
                    ",\"resident_subgroups\":" + std::to_string(count()) +
                    ",\"resident_state_bytes\":" + std::to_string(state_bytes) +
                    ",\"kept_gradient_bytes\":" + std::to_string(gradient_bytes) +
                    ",\"chosen\":" + (chosen ? "true" : "false") +
                    ",\"without_phase_s\":" + json::number(without_phase_s);
  if (steady) {
    out += ",\"steady_phase_s\":" + json::number(steady->predicted.phase_s) +
           ",\"first_phase_s\":" + json::number(first_phase_s);
  }
  return out + "}";
}

std::string PlanResidency::lines() const {
  char out[512];
  if (!steady) {
    std::snprintf(out, sizeof out,
                  "residency        none: %s held through the iteration fits no subgroup's state "
                  "beside a lane\n",
                  format_gb(static_cast<double>(held_bytes)).c_str());
    return out;
  }
  std::snprintf(
      out, sizeof out,
      "residency        %zu subgroup%s resident (%s of state, %s of kept gradients, of %s held "
      "through the iteration): %.3f s per phase once joined, %.3f s the phase they join in; "
      "without: %.3f s; %s\n",
      count(), count() == 1 ? "" : "s", format_gb(static_cast<double>(state_bytes)).c_str(),
      format_gb(static_cast<double>(gradient_bytes)).c_str(),
      format_gb(static_cast<double>(held_bytes)).c_str(), steady->predicted.phase_s, first_phase_s,
      without_phase_s, chosen ? "the plan above keeps them" : "not taken, the plan above has none");
  return out;
}

}  // namespace tide::tools
