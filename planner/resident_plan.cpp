#include "planner/resident_plan.h"

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>

#include "planner/cpu_only.h"

namespace tide::planner {

Plan residents_first(const Workload& w, const Rates& rates,
                     const std::vector<std::uint64_t>& slot_bytes, const Plan* transient,
                     const std::vector<std::size_t>& rest,
                     const std::vector<ResidentUpdate>& residents) {
  const std::size_t n = w.subgroup_params.size();
  Plan out;
  out.headroom_bytes = w.headroom_bytes;
  out.subgroups.resize(n);
  for (std::size_t s = 0; s < n; ++s) out.subgroups[s].params = w.subgroup_params[s];
  for (const ResidentUpdate& u : residents) out.gpu_order.push_back(u.subgroup);
  if (transient != nullptr) {
    for (std::size_t j = 0; j < transient->subgroups.size(); ++j) {
      out.subgroups[rest.at(j)] = transient->subgroups[j];
    }
    for (std::size_t s : transient->gpu_order) out.gpu_order.push_back(rest.at(s));
    for (std::size_t s : transient->cpu_order) out.cpu_order.push_back(rest.at(s));
    out.buffer_bytes = transient->buffer_bytes;
    out.buffers = transient->buffers;
    out.resident_bytes = transient->resident_bytes;
    out.gpu_params = transient->gpu_params;
    out.cpu_params = transient->cpu_params;
    out.predicted = transient->predicted;
  }
  out.buffers = std::max<std::size_t>(out.buffers, 1);
  // The resident subgroups' updates, before the rest: a state not on the device yet and a
  // gradient not kept there come over the link first, then the kernel.
  const double gpu_rate = rates.gpu_update * w.footprint.gpu_update_scale();
  const double grad_bytes = w.footprint.gradient_bytes_per_param;
  double resident_s = 0, copied_in = 0;
  for (const ResidentUpdate& u : residents) {
    const auto params = static_cast<double>(w.subgroup_params.at(u.subgroup));
    const double state_in_s =
        u.state_in ? static_cast<double>(slot_bytes.at(u.subgroup)) / rates.h2d : 0.0;
    const double grad_in_s = u.grad_in ? params * grad_bytes / rates.h2d : 0.0;
    copied_in += (state_in_s + grad_in_s) * rates.h2d;
    SubgroupPlan& sub = out.subgroups[u.subgroup];
    sub.device = Device::gpu;
    sub.resident = true;
    sub.start_s = resident_s;
    sub.h2d_end_s = resident_s + state_in_s + grad_in_s;
    sub.update_end_s = sub.h2d_end_s + params / gpu_rate;
    sub.end_s = sub.update_end_s;
    resident_s = sub.end_s;
    out.gpu_params += w.subgroup_params[u.subgroup];
  }
  for (std::size_t j = 0; j < out.gpu_order.size(); ++j) {
    SubgroupPlan& sub = out.subgroups[out.gpu_order[j]];
    sub.position = j;
    sub.buffer = j % out.buffers;
  }
  // Their copies in come before the others' on the link, and cross host memory too (read by the
  // DMA): a joining phase is charged them on every side they use.
  out.predicted.gpu_side_s += resident_s;
  out.predicted.link_s += copied_in / rates.h2d;
  out.predicted.host_s += copied_in / rates.host_memory;
  out.predicted.phase_s = std::max({out.predicted.phase_s, out.predicted.gpu_side_s,
                                    out.predicted.link_s, out.predicted.host_s});
  out.predicted.all_cpu_s = all_cpu_plan(w, rates).predicted.all_cpu_s;
  return out;
}

ResidentPlan plan_around_resident(const Workload& w, const Rates& rates,
                                  const ResidentLayout& layout,
                                  std::vector<ResidentUpdate> residents,
                                  const PlannerOptions& options) {
  const std::size_t n = w.subgroup_params.size();
  if (layout.slot_bytes.size() != n ||
      (!layout.gpu_allowed.empty() && layout.gpu_allowed.size() != n)) {
    throw std::invalid_argument("tide: resident plan: one slot size (and flag) per subgroup");
  }
  std::vector<char> is_resident(n, 0);
  std::uint64_t slots = 0, kept = 0;
  for (const ResidentUpdate& u : residents) {
    if (u.subgroup >= n || is_resident[u.subgroup] != 0) {
      throw std::invalid_argument("tide: resident plan: subgroup " + std::to_string(u.subgroup) +
                                  " is out of range or resident twice");
    }
    is_resident[u.subgroup] = 1;
    slots += layout.slot_bytes[u.subgroup];
    // Its gradient, kept on the GPU between phases.
    kept += w.subgroup_params[u.subgroup] * w.footprint.gradient_bytes_per_param;
  }
  const std::uint64_t reserved = slots + kept + layout.lane_bytes;
  std::vector<std::size_t> rest;
  Workload sub;
  sub.footprint = w.footprint;
  sub.headroom_bytes = w.headroom_bytes > reserved ? w.headroom_bytes - reserved : 0;
  std::vector<char> allowed;
  for (std::size_t s = 0; s < n; ++s) {
    if (is_resident[s] != 0) continue;
    rest.push_back(s);
    sub.subgroup_params.push_back(w.subgroup_params[s]);
    allowed.push_back(layout.gpu_allowed.empty() ? 1 : layout.gpu_allowed[s]);
  }
  std::optional<Plan> transient;
  if (!rest.empty()) transient = plan_allowed(sub, rates, allowed, options);
  const Plan* planned = transient ? &*transient : nullptr;
  ResidentPlan out{residents_first(w, rates, layout.slot_bytes, planned, rest, residents), 0};
  out.steady_phase_s = out.plan.predicted.phase_s;
  if (std::any_of(residents.begin(), residents.end(), [](const auto& u) { return u.state_in; })) {
    for (ResidentUpdate& u : residents) u.state_in = false;
    out.steady_phase_s =
        residents_first(w, rates, layout.slot_bytes, planned, rest, residents).predicted.phase_s;
  }
  out.plan.buffer_bytes = std::max(out.plan.buffer_bytes, layout.lane_bytes);
  out.plan.resident_state_bytes = slots;
  out.plan.resident_bytes += kept;
  return out;
}

}  // namespace tide::planner
